"""CA and TLS serving certificates with `cryptography`: pure functions over PEM bytes.

Keys are ECDSA P-256 (fast to generate, accepted by kube-apiserver and every TLS client we
use). Nothing here reads the clock unless no `now` is given, and nothing does I/O except
`write_pair`, so the certificate manager can decide rotation as a pure function of PEM + time.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from webhook import atomicfile

#: certificates start this long before "now" so a peer whose clock lags still accepts them
CLOCK_SKEW = dt.timedelta(minutes=5)


class PkiError(ValueError):
    """A PEM document that cannot be used: unparseable, mismatched key, wrong issuer."""


@dataclass(frozen=True)
class KeyPair:
    """A certificate and its private key, both PEM encoded (key as unencrypted PKCS#8)."""

    cert_pem: bytes
    key_pem: bytes

    @property
    def certificate(self) -> x509.Certificate:
        return load_certificate(self.cert_pem)

    @property
    def private_key(self) -> ec.EllipticCurvePrivateKey:
        return load_private_key(self.key_pem)


def _now(now: dt.datetime | None) -> dt.datetime:
    return now if now is not None else dt.datetime.now(dt.UTC)


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def cert_pem(cert: x509.Certificate) -> bytes:
    """PEM encoding of a certificate object."""
    return cert.public_bytes(serialization.Encoding.PEM)


def generate_ca(common_name: str, days: int, *, now: dt.datetime | None = None) -> KeyPair:
    """A self-signed CA that may sign leaf certificates only (pathLen 0)."""
    if days <= 0:
        raise PkiError(f"days must be positive, got {days}")
    start = _now(now)
    key = _new_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start - CLOCK_SKEW)
        .not_valid_after(start + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ski, critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(cert_pem(cert), _key_pem(key))


def issue_serving_cert(
    ca: KeyPair,
    dns_names: Sequence[str],
    ip_addresses: Sequence[str] = (),
    days: int = 365,
    *,
    now: dt.datetime | None = None,
) -> KeyPair:
    """A TLS server certificate signed by `ca` for the given DNS names and IP addresses.

    The first DNS name (or IP) is also the subject CN, for tools that still print it; clients
    (kube-apiserver included) check only the subjectAltName.
    """
    if not dns_names and not ip_addresses:
        raise PkiError("a serving certificate needs at least one DNS name or IP address")
    if days <= 0:
        raise PkiError(f"days must be positive, got {days}")
    try:
        ips = [ipaddress.ip_address(ip) for ip in ip_addresses]
    except ValueError as exc:
        raise PkiError(str(exc)) from exc
    ca_cert, ca_key = ca.certificate, ca.private_key
    start = _now(now)
    not_after = min(start + dt.timedelta(days=days), ca_cert.not_valid_after_utc)
    key = _new_key()
    cn = dns_names[0] if dns_names else str(ips[0])
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    sans += [x509.IPAddress(ip) for ip in ips]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn[:64])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start - CLOCK_SKEW)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=False,
                crl_sign=False, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return KeyPair(cert_pem(cert), _key_pem(key))


def service_dns_names(service: str, namespace: str) -> list[str]:
    """The names a Service is reached by inside a cluster, plus localhost for local runs."""
    return [
        "localhost",
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
    ]


#: IP SANs of a development/self-signed serving certificate
LOCAL_IPS = ("127.0.0.1", "::1")


# --- PEM helpers --------------------------------------------------------------------------------


def load_certificate(pem: bytes) -> x509.Certificate:
    """The first certificate of a PEM document."""
    certs = load_certificates(pem)
    if not certs:
        raise PkiError("no PEM certificate found")
    return certs[0]


def load_certificates(pem: bytes) -> list[x509.Certificate]:
    """Every certificate of a PEM bundle (a caBundle holds one per CA during rotation)."""
    try:
        return x509.load_pem_x509_certificates(pem) if pem.strip() else []
    except ValueError as exc:
        raise PkiError(f"invalid PEM certificate: {exc}") from exc


def load_private_key(pem: bytes) -> ec.EllipticCurvePrivateKey:
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as exc:
        raise PkiError(f"invalid PEM private key: {exc}") from exc
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise PkiError(f"unsupported private key type {type(key).__name__}")
    return key


def bundle(pems: Iterable[bytes]) -> bytes:
    """Concatenate certificates into one PEM bundle, dropping duplicates, keeping order."""
    seen: set[bytes] = set()
    out: list[bytes] = []
    for pem in pems:
        for cert in load_certificates(pem):
            der = cert.public_bytes(serialization.Encoding.DER)
            if der not in seen:
                seen.add(der)
                out.append(cert_pem(cert))
    return b"".join(out)


def not_after(cert_pem: bytes) -> dt.datetime:
    """Expiry (UTC, timezone-aware) of the first certificate in `cert_pem`."""
    return load_certificate(cert_pem).not_valid_after_utc


def validity_problem(cert_pem: bytes, now: dt.datetime, cert_name: str) -> str | None:
    """Why the first certificate of `cert_pem` is not valid at `now`, or None when it is."""
    cert = load_certificate(cert_pem)
    if now >= cert.not_valid_after_utc:
        return f"{cert_name} expired at {cert.not_valid_after_utc.isoformat()}"
    if now < cert.not_valid_before_utc:
        return f"{cert_name} is not valid before {cert.not_valid_before_utc.isoformat()}"
    return None


def key_matches(cert_pem: bytes, key_pem: bytes) -> bool:
    """Whether the private key belongs to the certificate."""
    pub = load_certificate(cert_pem).public_key()
    return bool(pub == load_private_key(key_pem).public_key())


def pair_problem(cert_pem: bytes, key_pem: bytes, cert_name: str, key_name: str) -> str | None:
    """What makes a serving pair unusable, in words that name its files (None: it is usable as
    far as these checks go). Any key type a TLS server takes is read, not only Muster's own."""
    cert_is_key = _PRIVATE_KEY in cert_pem and _CERTIFICATE not in cert_pem
    if cert_is_key:
        return (f"{cert_name} is a private key, not a certificate: are --tls-cert-file and "
                "--tls-key-file swapped?")
    if _CERTIFICATE in key_pem and _PRIVATE_KEY not in key_pem:
        return (f"{key_name} is a certificate, not a private key: are --tls-cert-file and "
                "--tls-key-file swapped?")
    try:
        cert = load_certificate(cert_pem)
    except PkiError as exc:
        return f"{cert_name} holds no usable certificate ({exc})"
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as exc:
        return f"{key_name} holds no usable private key (PEM, not encrypted): {exc}"
    if cert.public_key() != key.public_key():
        return f"the key in {key_name} does not match the certificate in {cert_name}"
    return None


_PRIVATE_KEY = b"PRIVATE KEY-----"
_CERTIFICATE = b"-----BEGIN CERTIFICATE-----"


def signed_by(cert_pem: bytes, ca_pem: bytes) -> bool:
    """Whether the first certificate of `cert_pem` was signed by any CA in the `ca_pem` bundle."""
    cert = load_certificate(cert_pem)
    for ca in load_certificates(ca_pem):
        try:
            cert.verify_directly_issued_by(ca)
        except (ValueError, TypeError, InvalidSignature):
            continue
        return True
    return False


def dns_names(cert_pem: bytes) -> list[str]:
    """The DNS subjectAltNames of a certificate."""
    try:
        san = load_certificate(cert_pem).extensions.get_extension_for_class(
            x509.SubjectAlternativeName
        )
    except x509.ExtensionNotFound:
        return []
    return list(san.value.get_values_for_type(x509.DNSName))


def write_pair(pair: KeyPair, cert_path: Path, key_path: Path) -> None:
    """Write a key pair atomically (rename), the key readable by its owner only.

    A server reloading these files never sees a half-written file or a mismatched pair as long as
    it reloads after both renames (it should check `key_matches` and retry otherwise).
    """
    atomicfile.write(key_path, pair.key_pem, 0o600)
    atomicfile.write(cert_path, pair.cert_pem, 0o644)


def issue_for_service(
    ca: KeyPair, service: str, namespace: str, days: int = 365, *, now: dt.datetime | None = None
) -> KeyPair:
    """A serving certificate for a Service (all its in-cluster names) plus localhost/loopback."""
    return issue_serving_cert(ca, service_dns_names(service, namespace), LOCAL_IPS, days, now=now)
