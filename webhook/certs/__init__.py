"""Certificates: CA and serving certificates (`pki`), the `self` manager, `muster certs ...`.

Loaded lazily: `webhook.certs.cli` is imported by every `muster` command, so the cryptography
library loads only with a command that uses it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from webhook.lazy import lazy_getattr

if TYPE_CHECKING:
    from webhook.certs.pki import (
        KeyPair,
        PkiError,
        bundle,
        generate_ca,
        issue_for_service,
        issue_serving_cert,
        key_matches,
        load_certificate,
        load_certificates,
        not_after,
        pair_problem,
        service_dns_names,
        signed_by,
        validity_problem,
        write_pair,
    )

__all__ = [
    "KeyPair",
    "PkiError",
    "bundle",
    "generate_ca",
    "issue_for_service",
    "issue_serving_cert",
    "key_matches",
    "load_certificate",
    "load_certificates",
    "not_after",
    "pair_problem",
    "service_dns_names",
    "signed_by",
    "validity_problem",
    "write_pair",
]

__getattr__ = lazy_getattr(__name__, dict.fromkeys(__all__, "webhook.certs.pki"))
