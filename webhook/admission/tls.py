"""Serving TLS from a cert/key pair on disk, picking up a rotated pair without a restart.

The pair is reloaded into the *live* SSLContext: OpenSSL copies the certificate into each new
connection when it is created, so open connections keep theirs and new handshakes get the new
pair. Nothing is dropped. A half-written pair (cert and key not matching yet), or one outside its
validity period (expired, or not valid yet), is refused and the old pair stays in use until a
poll sees a usable one.

The live context is only ever given a pair that already loaded into a scratch context, from the
same snapshot of the bytes: a failed load_cert_chain is not atomic (the certificate is replaced
before the key is checked), so trying a mismatched pair on the live context would break every
new handshake.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import logging
import ssl
import tempfile
from collections.abc import Callable
from pathlib import Path

from webhook.admission.metrics import Metrics
from webhook.certs import PkiError, not_after, pair_problem, validity_problem
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

    def __init__(self, cert_file: Path, key_file: Path, metrics: Metrics,
                 clock: Callable[[], dt.datetime] | None = None) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self.metrics = metrics
        self._clock = clock or (lambda: dt.datetime.now(dt.UTC))
        snapshot = _snapshot(cert_file, key_file)
        if snapshot is None:
            raise FileNotFoundError(f"cannot read {cert_file} or {key_file}")
        cert, key, self._digest = snapshot
        self.context = server_context()
        # a pair no client accepts would pass the kubelet's probes (they do not verify) while
        # every admission call fails open: refuse to start instead
        refusal = self._refusal(cert, key)
        if refusal is not None:
            raise UsageError(refusal[1])
        _load_pair(self.context, cert, key)
        self._reported: str | None = None
        self._record_expiry(cert)

    def _problem(self, cert: bytes, key: bytes, exc: ssl.SSLError) -> str:
        """Why OpenSSL refused the pair, naming the files (its own words say only `PEM lib`
        or `KEY_VALUES_MISMATCH`)."""
        found = pair_problem(cert, key, str(self.cert_file), str(self.key_file))
        return found or f"{self.cert_file} and {self.key_file} are not a usable pair: {exc}"

    def _refusal(self, cert: bytes, key: bytes) -> tuple[str, str] | None:
        """(metric result, reason) when the pair must not be served, None when it may: it
        must load (cert and key match) into a scratch context, and be valid now. The dates are
        checked on every poll, so a pair not valid yet is taken once the clock reaches it."""
        try:
            _load_pair(server_context(), cert, key)  # a scratch context: see above
        except ssl.SSLError as exc:
            return "error", self._problem(cert, key, exc)
        except OSError as exc:
            return "error", str(exc)
        try:
            dates = validity_problem(cert, self._clock(), str(self.cert_file))
        except PkiError as exc:
            return "error", str(exc)
        return None if dates is None else ("refused", dates)

    def _record_expiry(self, cert: bytes) -> None:
        try:
            expiry = not_after(cert)
        except PkiError:
            return
        self.metrics.cert_expiry.set(expiry.timestamp())

    def check(self) -> bool:
        """Reload if the files changed; True when a new pair is now in use."""
        snapshot = _snapshot(self.cert_file, self.key_file)
        if snapshot is None or snapshot[2] == self._digest:
            return False
        cert, key, digest = snapshot
        refusal = self._refusal(cert, key)
        if refusal is None:
            try:
                _load_pair(self.context, cert, key)
            except (OSError, ssl.SSLError) as exc:  # the scratch load passed: a disk problem
                refusal = "error", str(exc)
        if refusal is not None:
            # Mid-rotation (cert written, key not yet), a broken pair or one outside its
            # validity: keep serving the old one, and report this content once.
            if digest != self._reported:
                self._reported = digest
                self.metrics.cert_reloads.labels(refusal[0]).inc()
                log.warning("serving certificate not reloaded, keeping the previous pair",
                            extra={"cert_file": str(self.cert_file), "error": refusal[1]})
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
