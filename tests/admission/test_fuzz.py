"""Fuzzed and truncated AdmissionReviews over real HTTPS never produce a 5xx."""

from __future__ import annotations

import asyncio
import http.client
import json
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from admission_helpers import POLICIES, Tls, json_paths, make_tls
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from webhook.admission.server import ServeOptions, WebhookServer

FIXTURES = sorted((Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "admission")
                  .glob("*.json"))
BODIES = [f.read_bytes() for f in FIXTURES]


class ThreadedServer:
    """`muster serve` on its own event loop thread, so hypothesis can drive it synchronously."""

    def __init__(self, tls: Tls, policies: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.server = WebhookServer(ServeOptions(
            policies=[policies], host="127.0.0.1", port=0, tls_cert_file=tls.cert,
            tls_key_file=tls.key, shutdown_timeout=1.0))
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(30)
        self.ctx = tls.client_context()
        self.conn = self._connect()

    def _connect(self) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection("127.0.0.1", self.server.port, context=self.ctx,
                                           timeout=10)

    def post(self, path: str, body: bytes, content_type: str = "application/json"
             ) -> tuple[int, bytes]:
        for attempt in range(2):
            try:
                self.conn.request("POST", path, body=body, headers={
                    "Content-Type": content_type})
                resp = self.conn.getresponse()
                return resp.status, resp.read()
            except (http.client.HTTPException, ConnectionError, ssl.SSLError):
                # a server closing a connection after an error reply is fine; a 5xx is not
                self.conn.close()
                self.conn = self._connect()
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        self.conn.close()
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadedServer]:
    tmp = tmp_path_factory.mktemp("fuzz")
    (tmp / "policies").mkdir()
    (tmp / "policies" / "mpi.yaml").write_text(POLICIES)
    srv = ThreadedServer(make_tls(tmp), tmp / "policies")
    yield srv
    srv.close()


def _check(status: int, body: bytes) -> None:
    assert status < 500, body
    doc = json.loads(body)  # every answer, error or not, is JSON
    if status == 200:
        assert doc["kind"] == "AdmissionReview"
        assert isinstance(doc["response"]["allowed"], bool)
    else:
        assert status in (400, 413, 415)
        assert isinstance(doc["error"], str)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(which=st.integers(0, len(BODIES) - 1), cut=st.floats(0, 1))
def test_truncated_reviews(server: ThreadedServer, which: int, cut: float) -> None:
    body = BODIES[which]
    for path in ("/mutate/pods", "/validate/policies"):
        _check(*server.post(path, body[: int(len(body) * cut)]))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(which=st.integers(0, len(BODIES) - 1), data=st.data())
def test_fuzzed_reviews(server: ThreadedServer, which: int, data: st.DataObject) -> None:
    doc = json.loads(BODIES[which])
    paths = json_paths(doc)
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(paths))
        value = data.draw(json_values)
        if not path:
            doc = value
            break
        target = doc
        try:
            for key in path[:-1]:
                target = target[key]
            target[path[-1]] = value
        except (KeyError, IndexError, TypeError):
            continue  # an earlier replacement changed the shape under this path
    for endpoint in ("/mutate/pods", "/validate/policies"):
        _check(*server.post(endpoint + "?timeout=2s", json.dumps(doc).encode()))


@settings(max_examples=30, deadline=None)
@given(body=st.binary(max_size=300), content_type=st.sampled_from(
    ["application/json", "application/json; charset=utf-8", "text/plain", ""]))
def test_arbitrary_bytes(server: ThreadedServer, body: bytes, content_type: str) -> None:
    _check(*server.post("/mutate/pods?timeout=" + "x" * (len(body) % 3), body, content_type))
