"""CertReloader: the live SSLContext takes a rotated pair; a half-written pair, or one outside
its validity period, is refused."""

from __future__ import annotations

import asyncio
import datetime as dt
import ssl
import tempfile
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from webhook.admission.metrics import Metrics
from webhook.admission.server import ServeOptions, WebhookServer
from webhook.admission.tls import CertReloader
from webhook.certs import generate_ca, issue_serving_cert, load_certificate, not_after, write_pair
from webhook.demo import EXAMPLE_POLICIES
from webhook.failures import UsageError


def test_reload_only_consistent_pairs(tmp_path: Path) -> None:
    ca = generate_ca("test-ca", days=2)
    first = issue_serving_cert(ca, ["localhost"], ["127.0.0.1"], days=1)
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    write_pair(first, cert, key)
    metrics = Metrics()
    reloader = CertReloader(cert, key, metrics)
    expiry = metrics.registry.get_sample_value("muster_certificate_expiry_timestamp_seconds")
    assert expiry == not_after(first.cert_pem).timestamp()
    assert not reloader.check()  # unchanged

    second = issue_serving_cert(ca, ["localhost"], ["127.0.0.1"], days=2)
    cert.write_bytes(second.cert_pem)  # the key is not rotated yet: mismatched pair
    assert not reloader.check()
    assert metrics.registry.get_sample_value(
        "muster_certificate_reloads_total", {"result": "error"}) == 1
    assert not reloader.check()  # the same broken pair is not retried or counted again
    key.write_bytes(second.key_pem)
    assert reloader.check()
    assert metrics.registry.get_sample_value(
        "muster_certificate_expiry_timestamp_seconds") == not_after(second.cert_pem).timestamp()


def _served_cert(context: ssl.SSLContext) -> bytes:
    """The certificate a new handshake against `context` is given (DER)."""
    async def handshake() -> bytes:
        server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0,
                                            ssl=context)
        port = server.sockets[0].getsockname()[1]
        client = ssl.create_default_context()
        client.check_hostname, client.verify_mode = False, ssl.CERT_NONE
        _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client)
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        writer.close()
        server.close()
        await server.wait_closed()
        return bytes(der)
    return asyncio.run(handshake())


def _der(pem: bytes) -> bytes:
    return load_certificate(pem).public_bytes(serialization.Encoding.DER)


def test_reload_refuses_pairs_outside_their_validity(tmp_path: Path) -> None:
    """An expired pair from another CA (matching key and all) is refused and the last good
    pair stays in use; a pair not valid yet is refused until the clock reaches it."""
    now = dt.datetime.now(dt.UTC)
    clock = [now]
    good = issue_serving_cert(generate_ca("test-ca", days=10), ["localhost"], days=5)
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    write_pair(good, cert, key)
    metrics = Metrics()
    reloader = CertReloader(cert, key, metrics, clock=lambda: clock[0])

    old = now - dt.timedelta(days=30)
    expired = issue_serving_cert(generate_ca("other-ca", days=10, now=old), ["localhost"],
                                 days=1, now=old)
    write_pair(expired, cert, key)
    assert not reloader.check()
    assert _served_cert(reloader.context) == _der(good.cert_pem)
    assert metrics.registry.get_sample_value(
        "muster_certificate_reloads_total", {"result": "refused"}) == 1
    assert metrics.registry.get_sample_value(
        "muster_certificate_expiry_timestamp_seconds") == not_after(good.cert_pem).timestamp()

    later = now + dt.timedelta(hours=1)
    early = issue_serving_cert(generate_ca("test-ca", days=10, now=later), ["localhost"],
                               days=5, now=later)
    write_pair(early, cert, key)
    assert not reloader.check()
    assert not reloader.check()  # refused again, but reported once
    assert metrics.registry.get_sample_value(
        "muster_certificate_reloads_total", {"result": "refused"}) == 2
    assert _served_cert(reloader.context) == _der(good.cert_pem)
    clock[0] = later
    assert reloader.check()
    assert _served_cert(reloader.context) == _der(early.cert_pem)


def test_start_refuses_an_expired_pair(tmp_path: Path) -> None:
    old = dt.datetime.now(dt.UTC) - dt.timedelta(days=30)
    expired = issue_serving_cert(generate_ca("test-ca", days=10, now=old), ["localhost"],
                                 days=1, now=old)
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    write_pair(expired, cert, key)
    with pytest.raises(UsageError, match=r"tls\.crt expired at"):
        CertReloader(cert, key, Metrics())


async def test_self_signed_files_live_only_while_the_server_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without --self-signed-dir the key goes to a temporary directory the server removes."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    opts = ServeOptions(policies=[EXAMPLE_POLICIES], self_signed=True, host="127.0.0.1", port=0)
    async with WebhookServer(opts):
        written = _listing(tmp_path)
    assert [p.name for p in written] == ["ca.crt", "tls.crt", "tls.key"]
    assert _listing(tmp_path) == []


def _listing(tmp: Path) -> list[Path]:
    """The files of the server's temporary directories under `tmp`."""
    return sorted(p for d in tmp.glob("muster-serve-*") for p in d.iterdir())
