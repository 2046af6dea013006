"""make_api_client: the session kubernetes-asyncio builds, without per-request netrc lookups."""

from __future__ import annotations

from pathlib import Path

import pytest
from aiohttp import web

from webhook.doubles.emulator import ApiServerEmulator
from webhook.kube import NAMESPACES, KubeApi, make_api_client


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

