"""`muster serve` under abusive clients (security review, issue #24): latency of normal admission
requests and the server's memory, each phase against a quiet baseline of the same run.

    .venv/bin/python bench/bench_abuse.py [--load-seconds 4]

`muster serve` runs as its own process on 127.0.0.1 with the shipped policies and its default
limits; each abusive client runs as another process (so that its CPU does not slow the bench's
own client), on loopback only. Phases, one after another:

- quiet: normal requests only (the baseline);
- slow headers x300: TLS connections sending their request headers one byte a second;
- idle TLS x1000: TLS connections that send nothing;
- unfinished bodies x40: requests declaring a body just under the 3 MiB cap and sending all of
  it but the last byte, plus 10 declaring 7 MiB (the review's size);
- unfinished bodies x300: the same at every connection slot, the most memory a client can make
  the server hold;
- alias bomb: 4 clients posting, back to back, a policies ConfigMap whose YAML aliases expand to
  10^7 leaves, to /validate/policies.

Normal requests: the captured MPI worker AdmissionReview, from 4 workers over 4 kept-alive
connections opened before the first phase (as kube-apiserver keeps its connections), for
--load-seconds in each phase, while the abusive clients are at it. The server's RSS is sampled
every 50 ms. Each abusive client reports what it did, and the bench checks that it happened as
the limits say (cut off, refused, answered 408/413/422). The bench fails, with one line saying
why, when a normal request fails, when the server's RSS (or its peak, VmHWM) goes over the
chart's memory limit (charts/muster/values.yaml, webhook.resources.limits.memory), or when an
abusive client did not do its work.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.bench_serve import free_port, local_tls, process, wait_ready  # noqa: E402
from webhook.admission.server import ServeOptions  # noqa: E402
from webhook.demo import EXAMPLE_POLICIES  # noqa: E402
from webhook.quantity import whole  # noqa: E402

FIXTURES = REPO.parent / "shared" / "fixtures" / "admission"
HOST = "127.0.0.1"  # loopback only, for the server and every client
MiB = 1024 * 1024
#: the server's defaults, which it runs with here (docs/webhook.md, "Limits")
DEFAULTS = ServeOptions(policies=[])
HEADER_TIMEOUT, BODY_TIMEOUT = DEFAULTS.header_timeout, DEFAULTS.body_timeout
MAX_CONNECTIONS, MAX_BODY = DEFAULTS.max_connections, DEFAULTS.max_body_bytes
#: what the server still takes to close a connection after its deadline (lingering, TLS)
GRACE = 3.0

Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


def headers(size: int, path: str = "/mutate/pods?timeout=10s") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            f"Content-Length: {size}\r\nUser-Agent: bench-abuse\r\n\r\n").encode()


def alias_bomb_review() -> bytes:
    rows = ["    a0: &a0 [x, x, x, x, x, x, x, x, x, x]",
            *(f"    a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 7))]
    text = ("apiVersion: muster.io/v1alpha1\nkind: SchedulingPolicy\nmetadata: {name: bomb}\n"
            "spec:\n  labels:\n" + "\n".join(rows) + "\n")
    review = json.loads((FIXTURES / "configmap-update-policies.json").read_text())
    review["request"]["object"]["data"] = {"bomb.yaml": text}
    return json.dumps(review).encode()


# --- abusive clients (run as `bench_abuse.py --attack KIND ...`, one JSON line out) ---------

async def open_tls(port: int, ctx: ssl.SSLContext) -> Stream | None:
    """A TLS connection, or None when the server refused it."""
    try:
        return await asyncio.wait_for(asyncio.open_connection(
            HOST, port, ssl=ctx, server_hostname="localhost"), 15)
    except (OSError, TimeoutError):  # ssl.SSLError is an OSError
        return None


async def closed_after(reader: asyncio.StreamReader, seconds: float) -> float | None:
    """Seconds until the server closed the connection, None if it was still open."""
    started = time.monotonic()
    try:
        async with asyncio.timeout(seconds):
            while await reader.read(65536):
                pass
    except TimeoutError:
        return None
    except OSError:
        pass
    return time.monotonic() - started


async def slow_headers(port: int, ctx: ssl.SSLContext, count: int, seconds: float,
                       _: int) -> dict[str, Any]:
    gate = asyncio.Semaphore(50)

    async def one() -> float | str | None:
        async with gate:
            conn = await open_tls(port, ctx)
        if conn is None:
            return "refused"
        reader, writer = conn
        closed = asyncio.create_task(closed_after(reader, seconds))
        for byte in headers(10) * 10:  # never all sent: one byte a second
            if closed.done():
                break
            writer.write(bytes([byte]))
            await asyncio.wait({closed}, timeout=1.0)
        result = await closed
        writer.close()
        return result

    return summarize(await asyncio.gather(*(one() for _ in range(count))))


async def idle_tls(port: int, ctx: ssl.SSLContext, count: int, seconds: float,
                   _: int) -> dict[str, Any]:
    gate = asyncio.Semaphore(100)

    async def one() -> float | str | None:
        async with gate:
            conn = await open_tls(port, ctx)
        if conn is None:
            return "refused"
        reader, writer = conn
        result = await closed_after(reader, seconds)
        writer.close()
        return result

    return summarize(await asyncio.gather(*(one() for _ in range(count))))


def summarize(results: list[float | str | None]) -> dict[str, Any]:
    closed = [r for r in results if isinstance(r, float)]
    return {"clients": len(results), "refused": results.count("refused"),
            "accepted": len(results) - results.count("refused"),
            "closed_by_server": len(closed), "still_open": results.count(None),
            "closed_after_max_s": max(closed, default=0.0)}


async def big_bodies(port: int, ctx: ssl.SSLContext, count: int, seconds: float,
                     size: int) -> dict[str, Any]:
    chunk = b" " * 65536

    async def one() -> tuple[str, float, int]:
        conn = await open_tls(port, ctx)
        if conn is None:
            return "refused", 0.0, 0
        reader, writer = conn
        started = time.monotonic()
        answer = asyncio.create_task(reader.readline())
        sent = 0
        try:
            async with asyncio.timeout(seconds):
                writer.write(headers(size) + b"{")
                sent = 1
                while sent < size - 1 and not answer.done():  # all but the last byte
                    part = chunk[: size - 1 - sent]
                    writer.write(part)
                    sent += len(part)
                    drained = asyncio.ensure_future(writer.drain())
                    await asyncio.wait({answer, drained}, return_when=asyncio.FIRST_COMPLETED)
                    drained.cancel()
                    with contextlib.suppress(asyncio.CancelledError, OSError):
                        await drained
                line = await answer
                status = line.split(b" ")[1].decode() if line else "closed"
        except TimeoutError:
            status = "no answer"
        except OSError:
            status = "reset"
        took = time.monotonic() - started
        answer.cancel()
        writer.close()
        return status, took, sent

    results = await asyncio.gather(*(one() for _ in range(count)))
    statuses: dict[str, int] = {}
    for status, _, _ in results:
        statuses[status] = statuses.get(status, 0) + 1
    return {"clients": count, "statuses": statuses,
            "answered_after_max_s": max(t for _, t, _ in results),
            "bytes_sent": sum(s for _, _, s in results)}


async def alias_bomb(port: int, ctx: ssl.SSLContext, count: int, seconds: float,
                     _: int) -> dict[str, Any]:
    body = alias_bomb_review()
    conn = aiohttp.TCPConnector(ssl=ctx, limit=count)
    outcomes: list[tuple[bool, float]] = []
    end = time.monotonic() + seconds
    async with aiohttp.ClientSession(connector=conn) as session:
        async def loop() -> None:
            while time.monotonic() < end:
                started = time.monotonic()
                async with session.post(f"https://{HOST}:{port}/validate/policies",
                                        data=body,
                                        headers={"Content-Type": "application/json"}) as r:
                    answer = await r.json()
                refused = r.status == 200 and not answer["response"]["allowed"] \
                    and "alias *a0: aliases are not accepted" in answer["response"]["status"][
                        "message"]
                outcomes.append((refused, time.monotonic() - started))

        await asyncio.gather(*(loop() for _ in range(count)))
    return {"requests": len(outcomes), "refused_as_alias": sum(r for r, _ in outcomes),
            "answered_after_max_s": max((t for _, t in outcomes), default=0.0),
            "bytes_each": len(body)}


ATTACKS = {"slow-headers": slow_headers, "idle-tls": idle_tls, "big-bodies": big_bodies,
           "alias-bomb": alias_bomb}


def attack(args: argparse.Namespace) -> int:
    ctx = ssl.create_default_context(cafile=args.cafile)
    result = asyncio.run(ATTACKS[args.attack](args.port, ctx, args.count, args.seconds,
                                              args.size))
    print(json.dumps(result), flush=True)
    return 0


# --- the bench ---------------------------------------------------------------------------

@dataclass
class Attacker:
    kind: str
    count: int
    seconds: float
    size: int = 0


@dataclass
class Phase:
    name: str
    attackers: list[Attacker]
    latencies_ms: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    rss_max_mib: float = 0.0
    reports: list[dict[str, Any]] = field(default_factory=list)


PHASES = [
    Phase("quiet", []),
    Phase("slow headers x300", [Attacker("slow-headers", 300, HEADER_TIMEOUT + GRACE + 1)]),
    Phase("idle TLS x1000", [Attacker("idle-tls", 1000, HEADER_TIMEOUT + GRACE + 1)]),
    Phase("unfinished bodies x40", [
        Attacker("big-bodies", 40, BODY_TIMEOUT + GRACE + 2, MAX_BODY - 1024),
        Attacker("big-bodies", 10, 5.0, 7 * MiB)]),
    # the worst case: every connection slot sending a body faster than it is read
    Phase("unfinished bodies x300", [
        Attacker("big-bodies", 300, BODY_TIMEOUT + GRACE + 2, MAX_BODY - 1024)]),
    Phase("alias bomb", [Attacker("alias-bomb", 4, 5.0)]),
]


def rss_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of a process, MiB."""
    status = Path(f"/proc/{pid}/status").read_text()
    rss, hwm = (int(re.search(rf"{k}:\s+(\d+) kB", status)[1])  # type: ignore[index]
                for k in ("VmRSS", "VmHWM"))
    return rss / 1024, hwm / 1024


def memory_limit_mib() -> float:
    values = yaml.safe_load((REPO / "charts" / "muster" / "values.yaml").read_text())
    return whole(values["webhook"]["resources"]["limits"]["memory"]) / MiB


async def normal_load(session: aiohttp.ClientSession, url: str, body: bytes, seconds: float,
                      phase: Phase) -> None:
    end = time.monotonic() + seconds

    async def worker() -> None:
        while time.monotonic() < end:
            started = time.perf_counter()
            try:
                async with session.post(f"{url}/mutate/pods?timeout=10s", data=body,
                                        headers={"Content-Type": "application/json"}) as r:
                    answer = await r.json()
                if r.status != 200 or answer["response"]["allowed"] is not True:
                    phase.failures.append(f"HTTP {r.status}: {str(answer)[:200]}")
            except (aiohttp.ClientError, OSError, ValueError) as exc:
                phase.failures.append(f"{type(exc).__name__}: {exc}")
            phase.latencies_ms.append((time.perf_counter() - started) * 1000)

    await asyncio.gather(*(worker() for _ in range(4)))


async def sample_rss(pid: int, phase: Phase, stop: asyncio.Event) -> None:
    while not stop.is_set():
        phase.rss_max_mib = max(phase.rss_max_mib, rss_mib(pid)[0])
        await asyncio.sleep(0.05)


@dataclass
class Target:
    """The server under test and the bench's own client of it."""

    session: aiohttp.ClientSession
    url: str
    body: bytes
    pid: int
    attack_args: list[str]
    load_seconds: float


async def run_phase(phase: Phase, target: Target) -> None:
    procs = [await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--attack", a.kind, "--count", str(a.count), "--seconds",
        str(a.seconds), "--size", str(a.size), *target.attack_args,
        stdout=subprocess.PIPE, cwd=REPO) for a in phase.attackers]
    stop = asyncio.Event()
    sampler = asyncio.create_task(sample_rss(target.pid, phase, stop))
    if procs:
        await asyncio.sleep(1.5)  # the abusive clients connected and at it
    await normal_load(target.session, target.url, target.body, target.load_seconds, phase)
    for proc in procs:  # their reports; the sampler goes on until they are done
        out, _ = await asyncio.wait_for(proc.communicate(), 120)
        phase.reports.append(json.loads(out))
    stop.set()
    await sampler


def check_attacks(phase: Phase) -> list[str]:
    """What each abusive client did matches the limits; one line per mismatch."""
    problems = []
    for attacker, report in zip(phase.attackers, phase.reports, strict=True):
        where = f"{phase.name}: {attacker.kind} x{attacker.count}"
        if attacker.kind in ("slow-headers", "idle-tls"):
            if report["accepted"] == 0 or report["accepted"] > MAX_CONNECTIONS:
                problems.append(f"{where}: {report['accepted']} connections accepted (cap "
                                f"{MAX_CONNECTIONS})")
            if report["still_open"] or report["closed_after_max_s"] > HEADER_TIMEOUT + GRACE:
                problems.append(f"{where}: not cut off at the header timeout: {report}")
        elif attacker.kind == "big-bodies":
            want = "413" if attacker.size > MAX_BODY else "408"
            statuses = dict(report["statuses"])
            refused = statuses.pop("refused", 0)  # over the connection cap only
            if statuses != {want: attacker.count - refused} \
                    or refused < attacker.count - MAX_CONNECTIONS \
                    or (refused and attacker.count < MAX_CONNECTIONS // 2):
                problems.append(f"{where} of {attacker.size} bytes: expected {want} for each "
                                f"connection accepted, got {report['statuses']}")
            if want == "413" and report["answered_after_max_s"] > 1.0:
                problems.append(f"{where}: 413 took {report['answered_after_max_s']:.1f} s")
        elif report["requests"] == 0 or report["refused_as_alias"] != report["requests"] \
                or report["answered_after_max_s"] > 1.0:
            problems.append(f"{where}: not every bomb refused at once: {report}")
    return problems


async def bench(args: argparse.Namespace, work: Path) -> int:
    cafile = local_tls(work)
    port = free_port()
    url = f"https://{HOST}:{port}"
    serve = [sys.executable, "-m", "webhook", "--log-level", "error", "serve", "--host", HOST,
             "--port", str(port), "--policies", str(EXAMPLE_POLICIES), "--tls-cert-file",
             str(work / "tls.crt"), "--tls-key-file", str(work / "tls.key")]
    body = (FIXTURES / "pod-create-worker.json").read_bytes()
    limit = memory_limit_mib()
    attack_args = ["--port", str(port), "--cafile", str(cafile)]
    with process(serve, work / "serve.log") as srv:
        await asyncio.to_thread(wait_ready, url, cafile, srv, work / "serve.log")
        conn = aiohttp.TCPConnector(ssl=ssl.create_default_context(cafile=str(cafile)),
                                    limit=4, keepalive_timeout=300)
        async with aiohttp.ClientSession(connector=conn) as session:
            warm = Phase("warm-up", [])
            await normal_load(session, url, body, 1.0, warm)  # opens the 4 connections
            target = Target(session, url, body, srv.pid, attack_args, args.load_seconds)
            for phase in PHASES:
                await run_phase(phase, target)
                print(f"{phase.name:22s} done", flush=True)
                await asyncio.sleep(1.0)
        hwm = rss_mib(srv.pid)[1]
    return report(limit, hwm)


def report(limit: float, hwm: float) -> int:
    base = PHASES[0]
    base_q = statistics.quantiles(base.latencies_ms, n=100)
    print(f"\nmuster serve on {HOST}, default limits; normal requests: 4 workers, 4 kept-alive "
          f"connections; memory limit {limit:.0f} MiB (charts/muster/values.yaml)")
    print(f"{'phase':22s} {'requests':>8s} {'p50 ms':>8s} {'p99 ms':>8s} {'p50 x':>6s} "
          f"{'p99 x':>6s} {'RSS max MiB':>12s}")
    problems: list[str] = []
    for phase in PHASES:
        if len(phase.latencies_ms) < 20:
            problems.append(f"{phase.name}: only {len(phase.latencies_ms)} normal requests")
            continue
        q = statistics.quantiles(phase.latencies_ms, n=100)
        print(f"{phase.name:22s} {len(phase.latencies_ms):8d} {q[49]:8.2f} {q[98]:8.2f} "
              f"{q[49] / base_q[49]:6.2f} {q[98] / base_q[98]:6.2f} {phase.rss_max_mib:12.1f}")
        for attacker, rep in zip(phase.attackers, phase.reports, strict=True):
            print(f"    {attacker.kind} x{attacker.count}"
                  + (f" ({attacker.size} bytes)" if attacker.size else "") + f": {rep}")
        if phase.failures:
            problems.append(f"{phase.name}: {len(phase.failures)} normal requests failed, "
                            f"e.g. {phase.failures[0]}")
        if phase.rss_max_mib > limit:
            problems.append(f"{phase.name}: server RSS {phase.rss_max_mib:.1f} MiB over the "
                            f"{limit:.0f} MiB limit")
        problems.extend(check_attacks(phase))
    print(f"server peak RSS (VmHWM) over the run: {hwm:.1f} MiB")
    if hwm > limit:
        problems.append(f"server peak RSS {hwm:.1f} MiB over the {limit:.0f} MiB limit")
    for problem in problems:
        print(f"FAIL {problem}")
    if not problems:
        print("ok: every normal request answered, RSS under the limit, every abusive client "
              "cut off, refused or answered as the limits say")
    return 1 if problems else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--load-seconds", type=float, default=4.0,
                        help="normal requests in each phase, seconds (default 4)")
    parser.add_argument("--attack", choices=sorted(ATTACKS), help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--cafile", help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, default=5.0, help=argparse.SUPPRESS)
    parser.add_argument("--size", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.attack:
        return attack(args)
    with tempfile.TemporaryDirectory(prefix="bench-abuse-") as tmp:
        return asyncio.run(bench(args, Path(tmp)))


if __name__ == "__main__":
    sys.exit(main())
