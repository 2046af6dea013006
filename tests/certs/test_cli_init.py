"""`muster certs init` through the real CLI entry point."""

from __future__ import annotations

import datetime as dt
import stat
from pathlib import Path

import pytest

from webhook.certs import pki
from webhook.certs.local import init_local
from webhook.cli import main


def test_cli_init_writes_a_verifiable_pair(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "certs"
    args = ["certs", "init", "--out", str(out), "--namespace", "ns", "--service"]
    assert main([*args, "mw"]) == 0
    said = capsys.readouterr().out
    assert "ca, serving written" in said
    # the next command as given works from a checkout's top: serve needs its policies
    assert (f"serve with: muster serve --policies policies/ --tls-cert-file {out / 'tls.crt'} "
            f"--tls-key-file {out / 'tls.key'}\n") in said
    ca, crt, key = (out / n for n in ("ca.crt", "tls.crt", "tls.key"))
    assert pki.signed_by(crt.read_bytes(), ca.read_bytes())
    assert pki.key_matches(crt.read_bytes(), key.read_bytes())
    assert "mw.ns.svc" in pki.dns_names(crt.read_bytes())
    assert stat.S_IMODE((out / "ca.key").stat().st_mode) == 0o600

    before = crt.read_bytes(), ca.read_bytes()
    assert main([*args, "mw"]) == 0
    assert "existing files still valid" in capsys.readouterr().out
    assert (crt.read_bytes(), ca.read_bytes()) == before  # nothing lost on a re-run

    # other names: the CA is kept (clients trust it), the serving certificate is re-issued
    assert main([*args, "other"]) == 0
    assert ca.read_bytes() == before[1]
    assert crt.read_bytes() != before[0]
    assert "other.ns.svc" in pki.dns_names(crt.read_bytes())


def test_init_renews_near_expiry_and_replaces_garbage(tmp_path: Path) -> None:
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    files, written = init_local(tmp_path, "s", "n", days=40, ca_days=400, now=t0)
    assert written == ["ca", "serving"]
    day = dt.timedelta(days=1)
    _, written = init_local(tmp_path, "s", "n", days=40, ca_days=400, now=t0 + 5 * day)
    assert written == []
    _, written = init_local(tmp_path, "s", "n", days=40, ca_days=400, now=t0 + 20 * day)
    assert written == ["serving"]  # 20 days left < 30 days renew_before
    files.key.write_bytes(b"garbage")
    _, written = init_local(tmp_path, "s", "n", now=t0 + dt.timedelta(days=21))
    assert written == ["serving"]
    assert pki.key_matches(files.cert.read_bytes(), files.key.read_bytes())


def test_init_rejects_bad_lifetime(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["certs", "init", "--out", str(tmp_path), "--days", "0"]) == 2
    assert "days must be positive" in capsys.readouterr().out
