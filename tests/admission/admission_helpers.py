"""Helpers for admission tests: certificates, policies, a running `muster serve`, a client."""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import os
import re
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiohttp import web

from webhook.admission.server import ServeOptions, WebhookServer
from webhook.certs import KeyPair, generate_ca, issue_serving_cert, write_pair
from webhook.doubles.emulator import ApiServerEmulator

#: the shipped-style policies the fixtures are checked against
POLICIES = """\
apiVersion: muster.io/v1alpha1
kind: SchedulingPolicy
metadata:
  name: mpi-volcano
spec:
  match:
    namespaces: [team-a]
    podSelector:
      matchLabels:
        training.kubeflow.org/operator-name: mpi-operator
  gang:
    backend: volcano
  istio:
    optOut: true
"""


#: a policy whose labels expand through aliases to 10**7 leaves ("billion laughs", 600 bytes);
#: its first alias is at line 7, column 14
ALIAS_BOMB = (
    "apiVersion: muster.io/v1alpha1\nkind: SchedulingPolicy\nmetadata: {name: bomb}\nspec:\n"
    "  labels:\n    a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n"
    + "".join(f"    a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 7)))


@dataclass
class Tls:
    ca: KeyPair
    cert: Path
    key: Path

    def client_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cadata=self.ca.cert_pem.decode())
        return ctx

    def rotate(self) -> KeyPair:
        pair = issue_serving_cert(self.ca, ["localhost"], ["127.0.0.1"], days=1)
        write_pair(pair, self.cert, self.key)
        return pair

    async def rotate_in_two_steps(self, gap: float) -> KeyPair:
        pair = issue_serving_cert(self.ca, ["localhost"], ["127.0.0.1"], days=1)
        self.cert.write_bytes(pair.cert_pem)
        await asyncio.sleep(gap)
        self.key.write_bytes(pair.key_pem)
        return pair


def configmap_version(mount: Path, version: str, files: dict[str, str]) -> None:
    """Write files the way the kubelet updates a ConfigMap volume: new dir, swap ..data."""
    data_dir = mount / f"..{version}"
    data_dir.mkdir()
    for name, text in files.items():
        (data_dir / name).write_text(text)
        link = mount / name
        if not link.is_symlink():
            link.symlink_to(Path("..data") / name)
    tmp = mount / "..data_tmp"
    tmp.symlink_to(data_dir.name)
    os.replace(tmp, mount / "..data")


def make_tls(directory: Path) -> Tls:
    out = Tls(generate_ca("muster-test-ca", days=2), directory / "tls.crt", directory / "tls.key")
    out.rotate()
    return out


def load_fixture(shared_dir: Path, name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(
        (shared_dir / "fixtures" / "admission" / name).read_text())
    return data


def decode_patch(resp: dict[str, Any]) -> list[dict[str, Any]]:
    if "patch" not in resp:
        return []
    ops: list[dict[str, Any]] = json.loads(base64.b64decode(resp["patch"]))
    return ops


@asynccontextmanager
async def running(tls: Tls, policies: list[Path], **overrides: Any
                  ) -> AsyncIterator[WebhookServer]:
    opts = ServeOptions(policies=policies, host="127.0.0.1", port=0, tls_cert_file=tls.cert,
                        tls_key_file=tls.key, policy_poll_interval=0.05,
                        cert_poll_interval=0.05, shutdown_timeout=1.0)
    for key, value in overrides.items():
        setattr(opts, key, value)
    async with WebhookServer(opts) as server:
        yield server


@asynccontextmanager
async def client(tls: Tls, **connector: Any) -> AsyncIterator[aiohttp.ClientSession]:
    conn = aiohttp.TCPConnector(ssl=tls.client_context(), **connector)
    async with aiohttp.ClientSession(connector=conn) as session:
        yield session


async def review(session: aiohttp.ClientSession, url: str, body: dict[str, Any],
                 api_timeout: str = "5s") -> dict[str, Any]:
    async with session.post(f"{url}?timeout={api_timeout}", json=body) as resp:
        assert resp.status == 200, await resp.text()
        answer: dict[str, Any] = await resp.json()
    assert answer["apiVersion"] == body["apiVersion"]
    assert answer["kind"] == "AdmissionReview"
    assert answer["response"]["uid"] == body["request"]["uid"]
    return answer["response"]  # type: ignore[no-any-return]



def json_paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path into a JSON document (for truncating or mutating one field at a time)."""
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += json_paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += json_paths(v, (*prefix, i))
    return out


class FaultProxy:
    """An HTTP proxy in front of the API server emulator that fails chosen requests, as a
    flaky API server does: `fail(method, path_regex, status)` answers that status with a
    Status body, `status=0` never answers. Everything else (watches included) goes through."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.rules: list[tuple[str, re.Pattern[str], int]] = []
        self.hits: list[str] = []
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.url = ""

    def fail(self, method: str, path: str, status: int) -> None:
        self.rules.append((method, re.compile(path), status))

    def heal(self) -> None:
        self.rules.clear()

    async def __aenter__(self) -> FaultProxy:
        self._session = aiohttp.ClientSession(auto_decompress=False)
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    def kubeconfig(self, path: Path) -> Path:
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{"name": "c", "cluster": {"server": self.url}}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
            "users": [{"name": "u", "user": {"token": "t"}}]}))
        return path

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        for method, pattern, status in self.rules:
            if request.method == method and pattern.search(request.path):
                self.hits.append(f"{request.method} {request.path}")
                if status == 0:
                    await asyncio.sleep(3600)
                return web.json_response({
                    "kind": "Status", "apiVersion": "v1", "status": "Failure",
                    "message": f"injected {status}", "code": status,
                    "reason": "NotFound" if status == 404 else "InternalError"}, status=status)
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items()
                   if k.lower() in ("content-type", "accept", "authorization")}
        async with self._session.request(
                request.method, self.upstream + request.path_qs, headers=headers,
                data=await request.read()) as upstream:
            resp = web.StreamResponse(status=upstream.status, headers={
                "Content-Type": upstream.headers.get("Content-Type", "application/json")})
            await resp.prepare(request)
            async for chunk in upstream.content.iter_any():
                await resp.write(chunk)
            await resp.write_eof()
            return resp


# --- MPIJob workers on the emulator ---------------------------------------------------------

JOB = "tensorflow-topo-4-vgg16"


async def mpijob_in(api: ApiServerEmulator, shared_dir: Path) -> dict[str, Any]:
    job = yaml.safe_load((shared_dir / "fixtures" / "jobs" / "mpijob-vgg16-4workers.yaml")
                         .read_text())
    return await api.create("mpijobs.kubeflow.org", job, namespace="team-a")


def owned_by(body: dict[str, Any], owner: dict[str, Any]) -> dict[str, Any]:
    """The captured request with its ownerReference pointing at the object the emulator made."""
    body = copy.deepcopy(body)
    ref = body["request"]["object"]["metadata"]["ownerReferences"][0]
    ref["uid"] = owner["metadata"]["uid"]
    ref["name"] = owner["metadata"]["name"]
    return body


def worker_review(body: dict[str, Any], i: int) -> dict[str, Any]:
    body = copy.deepcopy(body)
    name = f"{JOB}-worker-{i}"
    body["request"]["uid"] = f"uid-{i}"
    body["request"]["name"] = name
    body["request"]["object"]["metadata"]["name"] = name
    return body


def controller_ref(job: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": job["apiVersion"], "kind": job["kind"], "name": job["metadata"]["name"],
            "uid": job["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}


def volcano_podgroups(api: ApiServerEmulator) -> list[dict[str, Any]]:
    return api.objects("podgroups.scheduling.volcano.sh", namespace="team-a")


def metric(srv: Any, name: str, **labels: str) -> float:
    return srv.metrics.registry.get_sample_value(name, labels) or 0.0
