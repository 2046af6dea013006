"""Starts, reaps and waits on the processes of a test cluster: the base of the cluster's launcher
and of each node's own (`e2e.node.kubenode`)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path


class Supervisor:
    """The processes it started (pid -> name, in start order) and their logs under `logs`; a
    process that exits while not stopping writes `failed` in `dir` with its name."""

    def __init__(self, work: Path, logs: Path) -> None:
        self.dir = work
        self.logs = logs
        self.procs: dict[int, str] = {}
        self.order: list[int] = []
        self.stopping = False

    def log(self, msg: str) -> None:
        with (self.logs / "launcher.log").open("a") as f:
            f.write(f"{time.strftime('%H:%M:%S')} {msg}\n")

    def run(self, *args: str) -> None:
        subprocess.run(args, check=True, capture_output=True, timeout=120)

    def start(self, name: str, *args: str, env: dict[str, str] | None = None) -> int:
        log = (self.logs / f"{name}.log").open("ab")
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=self.dir, env=env)
        self.procs[proc.pid] = name
        self.order.append(proc.pid)
        self.log(f"started {name} (pid {proc.pid})")
        return proc.pid

    def reap(self) -> None:
        """Reaps every exited child (PID 1 adopts every orphan: shims, containers), and notes
        ours."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            name = self.procs.pop(pid, None)
            if name is not None and not self.stopping:
                self.exited(name, status)

    def exited(self, name: str, status: int) -> None:
        """One of ours exited on its own: the cluster has failed."""
        self.log(f"{name} exited: status {status}")
        (self.dir / "failed").write_text(f"{name} exited (status {status}): see "
                                         f"{self.logs / (name + '.log')}\n")

    def wait_for(self, what: str, check: Callable[[], object], within: float = 120.0) -> None:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            self.reap()
            if (self.dir / "failed").exists():
                raise RuntimeError((self.dir / "failed").read_text())
            try:
                if check():
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"timed out after {within:.0f}s waiting for {what}")

    def terminate(self, pid: int, within: float = 10.0) -> None:
        """SIGTERM to one of ours, then SIGKILL if it outlives `within`; reaped either way."""
        self.procs.pop(pid, None)
        os.kill(pid, 15)
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return
            time.sleep(0.1)
        os.kill(pid, 9)
        os.waitpid(pid, 0)

    def setup(self) -> None:
        """Starts what it supervises; `ready` is written once it returns."""
        raise NotImplementedError

    def tick(self) -> None:
        """Called every half second once ready, after reaping."""

    def failure(self, exc: BaseException) -> str:
        """What `failed` says when `setup` or `tick` raised."""
        return str(exc)

    def stop(self) -> None:
        """Stops its processes, the last started first."""
        self.stopping = True
        for pid in reversed(self.order):
            if pid in self.procs:
                self.terminate(pid)

    def main(self) -> None:
        """Sets up, writes `ready`, then reaps until SIGTERM; a failure writes `failed`; stops
        either way."""
        self.logs.mkdir(parents=True, exist_ok=True)
        signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(SystemExit(0)))
        try:
            self.setup()
            (self.dir / "ready").write_text("ok\n")
            self.log("ready")
            while True:
                self.reap()
                self.tick()
                time.sleep(0.5)
        except SystemExit:
            pass
        except BaseException as exc:
            self.log(f"failed: {exc!r}")
            (self.dir / "failed").write_text(f"{self.failure(exc)}\n")
        finally:
            self.stop()
