"""Serving TLS from a cert/key pair on disk, picking up a rotated pair without a restart.

The pair is reloaded into the *live* SSLContext: OpenSSL copies the certificate into each new
connection when it is created, so open connections keep theirs and new handshakes get the new
pair. Nothing is dropped. A half-written pair (cert and key not matching yet) is refused and the
old pair stays in use until the next poll sees a consistent one.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import ssl
from pathlib import Path

from webhook.admission.metrics import Metrics
from webhook.certs import PkiError, not_after

log = logging.getLogger(__name__)


def server_context(cert_file: Path, key_file: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert_file, key_file)
    return ctx


def _digest(*paths: Path) -> str | None:
    h = hashlib.sha256()
    try:
        for path in paths:
            h.update(path.read_bytes())
            h.update(b"\0")
    except OSError:
        return None
    return h.hexdigest()


class CertReloader:
    """Owns the server's SSLContext and reloads its pair when the files' contents change."""

    def __init__(self, cert_file: Path, key_file: Path, metrics: Metrics) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self.metrics = metrics
        self.context = server_context(cert_file, key_file)
        self._digest = _digest(cert_file, key_file)
        self._refused: str | None = None
        self._record_expiry()

    def _record_expiry(self) -> None:
        try:
            expiry = not_after(self.cert_file.read_bytes())
        except (OSError, PkiError):
            return
        self.metrics.cert_expiry.set(expiry.timestamp())

    def check(self) -> bool:
        """Reload if the files changed; True when a new pair is now in use."""
        digest = _digest(self.cert_file, self.key_file)
        if digest is None or digest in (self._digest, self._refused):
            return False
        try:
            self.context.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as exc:
            # Mid-rotation (cert written, key not yet) or a broken pair: keep serving the old one.
            # Only this exact content is refused: the next change is tried again.
            self._refused = digest
            self.metrics.cert_reloads.labels("error").inc()
            log.warning("serving certificate not reloaded, keeping the previous pair",
                        extra={"cert_file": str(self.cert_file), "error": str(exc)})
            return False
        self._digest = digest
        self._record_expiry()
        self.metrics.cert_reloads.labels("success").inc()
        log.info("serving certificate reloaded", extra={"cert_file": str(self.cert_file)})
        return True

    async def run(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            self.check()
