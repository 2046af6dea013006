"""Serving TLS from a cert/key pair on disk, picking up a rotated pair without a restart.

The pair is reloaded into the *live* SSLContext: OpenSSL copies the certificate into each new
connection when it is created, so open connections keep theirs and new handshakes get the new
pair. Nothing is dropped. A half-written pair (cert and key not matching yet) is refused and the
old pair stays in use until the next poll sees a consistent one.

The live context is only ever given a pair that already loaded into a scratch context, from the
same snapshot of the bytes: a failed load_cert_chain is not atomic (the certificate is replaced
before the key is checked), so trying a mismatched pair on the live context would break every
new handshake.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import ssl
import tempfile
from pathlib import Path

from webhook.admission.metrics import Metrics
from webhook.certs import PkiError, not_after, pair_problem
from webhook.failures import UsageError

log = logging.getLogger(__name__)


def server_context() -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


def _snapshot(cert_file: Path, key_file: Path) -> tuple[bytes, bytes, str] | None:
    try:
        cert, key = cert_file.read_bytes(), key_file.read_bytes()
    except OSError:
        return None
    return cert, key, hashlib.sha256(cert + b"\0" + key).hexdigest()


def _load_pair(ctx: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    """load_cert_chain from bytes (it only takes paths): via a private temporary directory."""
    with tempfile.TemporaryDirectory(prefix="muster-tls-") as tmp:
        cert_path, key_path = Path(tmp) / "tls.crt", Path(tmp) / "tls.key"
        cert_path.write_bytes(cert)
        key_path.write_bytes(key)
        ctx.load_cert_chain(cert_path, key_path)


class CertReloader:
    """Owns the server's SSLContext and reloads its pair when the files' contents change."""

    def __init__(self, cert_file: Path, key_file: Path, metrics: Metrics) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self.metrics = metrics
        snapshot = _snapshot(cert_file, key_file)
        if snapshot is None:
            raise FileNotFoundError(f"cannot read {cert_file} or {key_file}")
        cert, key, self._digest = snapshot
        self.context = server_context()
        try:
            _load_pair(self.context, cert, key)
        except ssl.SSLError as exc:
            raise UsageError(self._problem(cert, key, exc)) from exc
        self._refused: str | None = None
        self._record_expiry(cert)

    def _problem(self, cert: bytes, key: bytes, exc: ssl.SSLError) -> str:
        """Why OpenSSL refused the pair, naming the files (its own words say only `PEM lib`
        or `KEY_VALUES_MISMATCH`)."""
        found = pair_problem(cert, key, str(self.cert_file), str(self.key_file))
        return found or f"{self.cert_file} and {self.key_file} are not a usable pair: {exc}"

    def _record_expiry(self, cert: bytes) -> None:
        try:
            expiry = not_after(cert)
        except PkiError:
            return
        self.metrics.cert_expiry.set(expiry.timestamp())

    def check(self) -> bool:
        """Reload if the files changed; True when a new pair is now in use."""
        snapshot = _snapshot(self.cert_file, self.key_file)
        if snapshot is None or snapshot[2] in (self._digest, self._refused):
            return False
        cert, key, digest = snapshot
        try:
            _load_pair(server_context(), cert, key)  # a scratch context first: see above
            _load_pair(self.context, cert, key)
        except (OSError, ssl.SSLError) as exc:
            # Mid-rotation (cert written, key not yet) or a broken pair: keep serving the old one.
            # Only this exact content is refused: the next change is tried again.
            self._refused = digest
            self.metrics.cert_reloads.labels("error").inc()
            log.warning("serving certificate not reloaded, keeping the previous pair",
                        extra={"cert_file": str(self.cert_file),
                               "error": self._problem(cert, key, exc)
                               if isinstance(exc, ssl.SSLError) else str(exc)})
            return False
        self._digest = digest
        self._record_expiry(cert)
        self.metrics.cert_reloads.labels("success").inc()
        log.info("serving certificate reloaded", extra={"cert_file": str(self.cert_file)})
        return True

    async def run(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            self.check()
