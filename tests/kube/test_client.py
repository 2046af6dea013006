"""make_api_client: the session kubernetes-asyncio builds, without per-request netrc lookups."""

from __future__ import annotations

from pathlib import Path

import pytest

from webhook.emulator import ApiServerEmulator
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
