"""Helpers for admission tests: certificates, policies, a running `muster serve`, a client."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from webhook.admission.server import ServeOptions, WebhookServer
from webhook.certs import KeyPair, generate_ca, issue_serving_cert, write_pair

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


async def wait_for(predicate: Callable[[], bool], within: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


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
