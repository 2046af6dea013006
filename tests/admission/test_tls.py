"""CertReloader: the live SSLContext takes a rotated pair; a half-written pair is refused."""

from __future__ import annotations

from pathlib import Path

from webhook.admission.metrics import Metrics
from webhook.admission.tls import CertReloader
from webhook.certs import generate_ca, issue_serving_cert, not_after, write_pair


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
