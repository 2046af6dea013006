"""Start Muster's components as real processes for end-to-end tests, and stop them cleanly.

Each process's output goes to a log file under the test's tmp dir; a failing test prints the tail
of every log, which is what a person debugging a red CI needs first.
"""

from __future__ import annotations

import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


@dataclass
class Proc:
    name: str
    args: list[str]
    log_path: Path
    module: str = "webhook"  # `python -m MODULE ARGS`
    #: stdout to a pipe (the process reports there: the emulator's URL, the kubelet's events)
    capture_stdout: bool = False
    popen: subprocess.Popen[bytes] | None = None
    env: dict[str, str] = field(default_factory=dict)

    def start(self) -> Proc:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO), **self.env}
        log = self.log_path.open("ab")
        self.popen = subprocess.Popen(
            [sys.executable, "-m", self.module, *self.args],
            cwd=REPO, env=env, stdout=subprocess.PIPE if self.capture_stdout else log,
            stderr=log if self.capture_stdout else subprocess.STDOUT,
            start_new_session=True,
        )
        return self

    @property
    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def kill(self) -> None:
        """SIGKILL: what a crashed node or OOM-killed container looks like."""
        if self.popen and self.running:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(10)

    def stop(self, timeout: float = 10.0) -> None:
        if self.popen and self.running:
            os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    def tail(self, lines: int = 40) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def wait_for(what: str, check: Callable[[], bool], timeout: float = 30.0,
             procs: Sequence[Proc] = ()) -> None:
    """Poll `check` until true; fail with the logs of `procs` if it never is or one of them dies."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in procs:
            if not p.running:
                raise AssertionError(f"{p.name} exited early while waiting for {what}:\n{p.tail()}")
        try:
            if check():
                return
        except Exception:  # the thing is not up yet: keep polling
            pass
        time.sleep(0.1)
    logs = "\n".join(f"--- {p.name}\n{p.tail()}" for p in procs)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}\n{logs}")


def https_ok(url: str, ca_file: Path) -> bool:
    ctx = ssl.create_default_context(cafile=str(ca_file))
    with urllib.request.urlopen(url, context=ctx, timeout=2) as resp:
        return bool(resp.status == 200)
