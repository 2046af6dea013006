"""Certificates: CA and serving certificates (`pki`), the `self` manager, `muster certs ...`."""

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
