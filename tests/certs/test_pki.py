"""pki: certificate contents, and a real TLS handshake with Python's ssl module."""

from __future__ import annotations

import asyncio
import datetime as dt
import ssl
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from webhook.certs import pki

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


@pytest.fixture(scope="module")
def ca() -> pki.KeyPair:
    return pki.generate_ca("muster-test-ca", days=30, now=NOW)


def test_ca_is_a_ca_limited_to_leaves(ca: pki.KeyPair) -> None:
    cert = ca.certificate
    bc = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    assert bc.ca is True and bc.path_length == 0
    ku = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    assert ku.key_cert_sign and ku.crl_sign
    assert cert.issuer == cert.subject
    assert pki.not_after(ca.cert_pem) == NOW + dt.timedelta(days=30)
    assert cert.not_valid_before_utc == NOW - pki.CLOCK_SKEW
    assert pki.key_matches(ca.cert_pem, ca.key_pem)


def test_serving_cert_sans_usages_and_issuer(ca: pki.KeyPair) -> None:
    leaf = pki.issue_for_service(ca, "muster-webhook", "muster-system", days=7, now=NOW)
    cert = leaf.certificate
    assert pki.dns_names(leaf.cert_pem) == [
        "localhost",
        "muster-webhook",
        "muster-webhook.muster-system",
        "muster-webhook.muster-system.svc",
        "muster-webhook.muster-system.svc.cluster.local",
    ]
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1", "::1"]
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    assert cert.extensions.get_extension_for_class(x509.KeyUsage).value.key_cert_sign is False
    assert pki.signed_by(leaf.cert_pem, ca.cert_pem)
    assert pki.key_matches(leaf.cert_pem, leaf.key_pem)
    assert not pki.key_matches(leaf.cert_pem, ca.key_pem)
    assert pki.not_after(leaf.cert_pem) == NOW + dt.timedelta(days=7)


def test_leaf_never_outlives_its_ca(ca: pki.KeyPair) -> None:
    leaf = pki.issue_serving_cert(ca, ["x"], days=365, now=NOW)
    assert pki.not_after(leaf.cert_pem) == pki.not_after(ca.cert_pem)


def test_signed_by_checks_every_ca_in_a_bundle(ca: pki.KeyPair) -> None:
    other = pki.generate_ca("other", days=30, now=NOW)
    leaf = pki.issue_serving_cert(other, ["x"], days=1, now=NOW)
    assert not pki.signed_by(leaf.cert_pem, ca.cert_pem)
    both = pki.bundle([ca.cert_pem, other.cert_pem, ca.cert_pem])
    assert len(pki.load_certificates(both)) == 2  # duplicate dropped, order kept
    assert pki.load_certificates(both)[0] == ca.certificate
    assert pki.signed_by(leaf.cert_pem, both)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda ca: pki.issue_serving_cert(ca, [], []), "at least one"),
        (lambda ca: pki.issue_serving_cert(ca, ["x"], ["not-an-ip"]), "not-an-ip"),
        (lambda ca: pki.issue_serving_cert(ca, ["x"], days=0), "days"),
        (lambda ca: pki.load_certificate(b"-----BEGIN CERTIFICATE-----\nAAAA\n"), "invalid"),
        (lambda ca: pki.load_certificate(b""), "no PEM"),
        (lambda ca: pki.load_private_key(b"garbage"), "invalid PEM private key"),
    ],
)
def test_bad_input_is_a_clear_error(ca: pki.KeyPair, call: object, message: str) -> None:
    with pytest.raises(pki.PkiError, match=message):
        call(ca)  # type: ignore[operator]


def test_write_pair_is_atomic_and_key_private(tmp_path: Path, ca: pki.KeyPair) -> None:
    cert_path, key_path = tmp_path / "d" / "tls.crt", tmp_path / "d" / "tls.key"
    pki.write_pair(ca, cert_path, key_path)
    assert cert_path.read_bytes() == ca.cert_pem
    assert key_path.read_bytes() == ca.key_pem
    assert stat.S_IMODE(key_path.stat().st_mode) == 0o600
    assert sorted(p.name for p in cert_path.parent.iterdir()) == ["tls.crt", "tls.key"]


async def _handshake(server_pair: pki.KeyPair, trust_pem: bytes, tmp_path: Path, host: str) -> str:
    pki.write_pair(server_pair, tmp_path / "s.crt", tmp_path / "s.key")
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(tmp_path / "s.crt", tmp_path / "s.key")

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(await reader.readline())
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=server_ctx)
    port = server.sockets[0].getsockname()[1]
    try:
        client_ctx = ssl.create_default_context(cadata=trust_pem.decode())
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=client_ctx, server_hostname=host
        )
        writer.write(b"ping\n")
        line = await reader.readline()
        writer.close()
        return line.decode().strip()
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "svc.ns.svc"])
async def test_real_tls_handshake_verifies_hostname(tmp_path: Path, host: str) -> None:
    ca = pki.generate_ca("handshake-ca", days=1)
    leaf = pki.issue_for_service(ca, "svc", "ns", days=1)
    assert await _handshake(leaf, ca.cert_pem, tmp_path, host) == "ping"


async def test_tls_handshake_fails_for_unknown_ca_or_wrong_name(tmp_path: Path) -> None:
    ca = pki.generate_ca("handshake-ca", days=1)
    leaf = pki.issue_for_service(ca, "svc", "ns", days=1)
    stranger = pki.generate_ca("stranger", days=1)
    with pytest.raises(ssl.SSLCertVerificationError):
        await _handshake(leaf, stranger.cert_pem, tmp_path, "localhost")
    with pytest.raises(ssl.SSLCertVerificationError):
        await _handshake(leaf, ca.cert_pem, tmp_path, "other.ns.svc")
    # during a rotation overlap the client trusts old+new CAs: the new leaf verifies
    assert await _handshake(leaf, pki.bundle([stranger.cert_pem, ca.cert_pem]), tmp_path,
                            "localhost") == "ping"
