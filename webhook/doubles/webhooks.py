"""Helpers for tests that use the emulator: a self-signed CA and serving certificate, an HTTPS
admission webhook server whose handler the test supplies, and AdmissionReview answers."""

from __future__ import annotations

import base64
import inspect
import json
import shutil
import ssl
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from webhook.certs import pki


@dataclass
class TlsCerts:
    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes

    @property
    def ca_bundle(self) -> str:
        """base64 PEM, as clientConfig.caBundle carries it."""
        return base64.b64encode(self.ca_pem).decode()

    def server_context(self, tmp: Path) -> ssl.SSLContext:
        cert, key = tmp / "tls.crt", tmp / "tls.key"
        cert.write_bytes(self.cert_pem)
        key.write_bytes(self.key_pem)
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(cert, key)
        return ctx


def make_certs(dns_names: list[str]) -> TlsCerts:
    """A self-signed CA and a serving certificate for dns_names plus 127.0.0.1, for a day."""
    ca = pki.generate_ca("muster-test-ca", days=1)
    serving = pki.issue_serving_cert(ca, dns_names, ["127.0.0.1"], days=1)
    return TlsCerts(ca.cert_pem, serving.cert_pem, serving.key_pem)


Handler = Callable[[dict[str, Any]], "dict[str, Any] | Awaitable[dict[str, Any]]"]


@dataclass
class TlsWebhook:
    """A running HTTPS webhook: `url` (https://127.0.0.1:port/path), `ca_bundle`, and every
    request it received (`reviews`: bodies, `queries`: query strings, `headers`)."""

    url: str
    port: int
    certs: TlsCerts
    reviews: list[dict[str, Any]] = field(default_factory=list)
    queries: list[dict[str, str]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)

    @property
    def ca_bundle(self) -> str:
        return self.certs.ca_bundle

    def client_config(self) -> dict[str, Any]:
        return {"url": self.url, "caBundle": self.ca_bundle}


def admission_response(review: dict[str, Any], *, allowed: bool = True,
                       patch: list[dict[str, Any]] | None = None, message: str = "",
                       code: int = 403, warnings: list[str] | None = None) -> dict[str, Any]:
    """The AdmissionReview a webhook answers with."""
    response: dict[str, Any] = {"uid": review["request"]["uid"], "allowed": allowed}
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    if not allowed:
        response["status"] = {"code": code, "message": message}
    if warnings:
        response["warnings"] = warnings
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


class WebhookServers:
    """Starts HTTPS webhook servers (`await servers.start(handler)`) and stops them all."""

    def __init__(self, certs: TlsCerts) -> None:
        self.certs = certs
        self._runners: list[web.AppRunner] = []
        self._tmp: Path | None = None  # the servers' key pair files, removed by `stop`

    async def start(self, handler: Handler, path: str = "/mutate") -> TlsWebhook:
        """handler(review) returns the answer (see `admission_response`), sync or async."""
        hooks: list[TlsWebhook] = []

        async def serve(request: web.Request) -> web.Response:
            review = await request.json()
            hook = hooks[0]
            hook.reviews.append(review)
            hook.queries.append(dict(request.query))
            hook.headers.append(dict(request.headers))
            answer = handler(review)
            if inspect.isawaitable(answer):
                answer = await answer
            return web.json_response(answer)

        app = web.Application()
        app.router.add_post(path, serve)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await runner.setup()
        self._runners.append(runner)
        if self._tmp is None:
            self._tmp = Path(tempfile.mkdtemp(prefix="muster-webhook-"))
        site = web.TCPSite(runner, "127.0.0.1", 0,
                           ssl_context=self.certs.server_context(self._tmp))
        await site.start()
        port = runner.addresses[0][1]
        hook = TlsWebhook(f"https://127.0.0.1:{port}{path}", port, self.certs)
        hooks.append(hook)
        return hook

    async def stop(self) -> None:
        for runner in self._runners:
            await runner.cleanup()
        self._runners.clear()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
