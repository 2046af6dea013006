"""`muster serve --self-signed --policies policies/` as a process: runs without a cluster, answers
over HTTPS with the certificate it generated, and stops cleanly on SIGTERM."""

from __future__ import annotations

import json
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from webhook.demo import EXAMPLE_POLICIES

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_serve_self_signed_as_a_process(tmp_path: Path, shared_dir: Path) -> None:
    port, metrics_port = _free_port(), _free_port()
    certs = tmp_path / "certs"
    proc = subprocess.Popen(
        [sys.executable, "-m", "webhook", "--log-json", "serve", "--self-signed",
         "--self-signed-dir", str(certs), "--policies", str(EXAMPLE_POLICIES),
         "--host", "127.0.0.1", "--port", str(port), "--metrics-port", str(metrics_port),
         "--metrics-host", "127.0.0.1"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        ctx: ssl.SSLContext | None = None
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()
            if (certs / "ca.crt").exists():
                ctx = ssl.create_default_context(cafile=str(certs / "ca.crt"))
                try:
                    with urllib.request.urlopen(f"https://localhost:{port}/readyz",
                                                context=ctx, timeout=2) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
            time.sleep(0.1)
        assert ctx is not None
        body = (shared_dir / "fixtures" / "admission" /
                "pod-create-launcher-generatename.json").read_bytes()
        req = urllib.request.Request(f"https://127.0.0.1:{port}/mutate/pods?timeout=5s",
                                     data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, context=ctx, timeout=5) as r:
            answer = json.loads(r.read())
        assert answer["response"]["uid"] == json.loads(body)["request"]["uid"]
        assert answer["response"]["allowed"] is True
        assert answer["response"].get("auditAnnotations", {}).get("policy")
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as r:
            assert b'muster_admission_requests_total{endpoint="mutate",outcome="' in r.read()
    finally:
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    lines = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    messages = [line["msg"] for line in lines]
    assert "muster webhook serving" in messages
    assert any("no cluster context" in m for m in messages)
    assert "shutting down" in messages
