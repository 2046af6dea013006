"""make_api_client: the session kubernetes-asyncio builds, without per-request netrc lookups;
KubeApi: what the API server says beside its answers."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from aiohttp import web

from webhook.doubles.emulator import ApiServerEmulator
from webhook.kube import NAMESPACES, ApiError, KubeApi, Resource, make_api_client
from webhook.kube.api import warning_text


async def test_requests_never_read_netrc(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a netrc with credentials for the API server's host: a session that trusts the
    # environment would send them (and read this file in a thread on every request)
    netrc = tmp_path / "netrc"
    netrc.write_text("machine 127.0.0.1 login intruder password secret\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    async with ApiServerEmulator() as api:
        client = await make_api_client(str(api.write_kubeconfig(tmp_path / "kc")))
        try:
            kube = KubeApi(client)
            for _ in range(5):
                await kube.get(NAMESPACES, "default")
            session = client.rest_client.pool_manager
            assert session.trust_env is False
            assert not session.closed and session.connector is not None
        finally:
            await client.close()
        assert session.closed and session.connector is None  # closing still closes it all


async def test_listed_objects_carry_their_kind_as_watched_ones_do(tmp_path: Path) -> None:
    """kube-apiserver leaves apiVersion and kind out of a built-in List's items (the real tier
    found it); KubeApi.list sets them, for the informers and every other caller."""
    async def namespaces(_: web.Request) -> web.Response:
        return web.json_response({"kind": "NamespaceList", "apiVersion": "v1",
                                  "metadata": {"resourceVersion": "5"},
                                  "items": [{"metadata": {"name": "n1", "resourceVersion": "5"}}]})

    app = web.Application()
    app.router.add_get("/api/v1/namespaces", namespaces)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    (tmp_path / "kc").write_text(
        f"apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: c, cluster: {{server: 'http://127.0.0.1:{port}'}}}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
        "users: [{name: u, user: {token: t}}]\n")
    client = await make_api_client(str(tmp_path / "kc"))
    try:
        listed = await KubeApi(client).list(NAMESPACES)
    finally:
        await client.close()
        await runner.cleanup()
    assert listed["items"] == [{"apiVersion": "v1", "kind": "Namespace",
                                "metadata": {"name": "n1", "resourceVersion": "5"}}]



async def test_the_api_servers_warnings_are_logged_once_each(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A deprecated API's warning (and an admission webhook's) reaches the log as client-go's
    does, once per text however many calls draw it, with the call that drew it first."""
    endpoints = Resource("", "v1", "endpoints", True, "Endpoints")
    said = "v1 Endpoints is deprecated in v1.33+; use discovery.k8s.io/v1 EndpointSlice"
    async with ApiServerEmulator() as api:
        client = await make_api_client(str(api.write_kubeconfig(tmp_path / "kc")))
        try:
            kube = KubeApi(client)
            with caplog.at_level(logging.WARNING, logger="webhook.kube.api"):
                await kube.get(NAMESPACES, "default")
                assert len(kube.warnings) == 0 and not caplog.records
                for _ in range(3):
                    await kube.list(endpoints, "default")
                with pytest.raises(ApiError):
                    await kube.get(endpoints, "missing", namespace="default")
        finally:
            await client.close()
    assert [r.getMessage() for r in caplog.records] == [f"API server warning: {said}"]
    assert kube.warnings.get(said) == "GET /api/v1/namespaces/default/endpoints"


@pytest.mark.parametrize(("header", "text"), [
    ('299 - "v1 Endpoints is deprecated"', "v1 Endpoints is deprecated"),
    ('299 - "a \\"quoted\\" word, a \\\\ backslash"', 'a "quoted" word, a \\ backslash'),
    ('299 - "dated" "Sat, 05 Dec 2026 10:00:00 GMT"', "dated"),
    ("not the RFC's form", "not the RFC's form"),
])
def test_a_warning_header_is_read_as_rfc_9111_writes_it(header: str, text: str) -> None:
    assert warning_text(header) == text
