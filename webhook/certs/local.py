"""`muster certs init`: a CA and serving certificate on disk for local development.

Existing valid files are kept (a developer's clients may already trust the CA); only what is
missing, invalid, for other names, or within `renew_before` of expiry is (re)issued.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass
from pathlib import Path

from webhook.certs import pki

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LocalFiles:
    ca_cert: Path
    ca_key: Path
    cert: Path
    key: Path

    @classmethod
    def under(cls, out: Path) -> LocalFiles:
        return cls(out / "ca.crt", out / "ca.key", out / "tls.crt", out / "tls.key")


def _read(cert: Path, key: Path) -> pki.KeyPair | None:
    if not (cert.is_file() and key.is_file()):
        return None
    pair = pki.KeyPair(cert.read_bytes(), key.read_bytes())
    try:
        return pair if pki.key_matches(pair.cert_pem, pair.key_pem) else None
    except pki.PkiError:
        return None


def _fresh(pair: pki.KeyPair, now: dt.datetime, renew_before: dt.timedelta) -> bool:
    return pki.not_after(pair.cert_pem) - now > renew_before


def init_local(
    out: Path,
    service: str,
    namespace: str,
    *,
    days: int = 365,
    ca_days: int = 3650,
    renew_before: dt.timedelta = dt.timedelta(days=30),
    force: bool = False,
    now: dt.datetime | None = None,
) -> tuple[LocalFiles, list[str]]:
    """Ensure CA + serving certificate files under `out`; returns the paths and what was written."""
    now = now or dt.datetime.now(dt.UTC)
    files = LocalFiles.under(out)
    written: list[str] = []
    ca = None if force else _read(files.ca_cert, files.ca_key)
    if ca is None or not _fresh(ca, now, renew_before):
        ca = pki.generate_ca(f"muster-dev-ca ({namespace})", ca_days, now=now)
        pki.write_pair(ca, files.ca_cert, files.ca_key)
        written.append("ca")
    leaf = None if "ca" in written else _read(files.cert, files.key)
    wanted = pki.service_dns_names(service, namespace)
    if (
        leaf is None
        or not _fresh(leaf, now, renew_before)
        or not pki.signed_by(leaf.cert_pem, ca.cert_pem)
        or pki.dns_names(leaf.cert_pem) != wanted
    ):
        leaf = pki.issue_for_service(ca, service, namespace, days, now=now)
        pki.write_pair(leaf, files.cert, files.key)
        written.append("serving")
    log.info("local certificates ready", extra={"dir": str(out), "written": ",".join(written)})
    return files, written
