"""`muster serve` under abusive clients (security reviews, issues #24 and #54): normal admission
requests and the server's memory, each phase against a quiet baseline of the same run.

    .venv/bin/python bench/bench_abuse.py [--load-seconds 4]

`muster serve` runs as its own process on 127.0.0.1 with the shipped policies, its default
limits and its metrics port; each abusive client runs as another process (so that its CPU does
not slow the bench's own client), from other loopback addresses (127.0.0.2-7: the server tells
clients by address). Phases, one after another:

- quiet: normal requests only (the baseline);
- resets x300: TCP connections that send part of a TLS ClientHello and reset (a leak of the
  connection count, #54);
- slow headers x300: TLS connections sending their request headers one byte a second;
- idle keep-alive x300: TLS connections that send one review and then hold the connection;
- idle TLS x1000: TLS connections that send nothing;
- unfinished bodies x40: requests declaring a body just under the 3 MiB cap and sending all of
  it but the last byte, plus 10 declaring 7 MiB (the review's size); one address;
- unfinished bodies x300: the same from 6 addresses, more than every connection slot: the
  most memory clients can make the server hold;
- alias bomb: 4 clients posting, back to back, a policies ConfigMap whose YAML aliases expand to
  10^7 leaves, to /validate/policies;
- metrics headers x3000: plain connections to the metrics port sending half a request;
- policy memory: a policies ConfigMap of about 1,300 policies (180 KB) whose gang queues
  alternate between two values, posted to /validate/policies (every pair conflicts).

Normal requests, in each phase, once the abusive clients are at it: the captured MPI worker
AdmissionReview from 4 workers over 4 kept-alive connections opened in the phase (as
kube-apiserver opens connections when it needs them), and a kubelet-like probe of /readyz (and
in the metrics phase of /metrics) over a new connection every 0.1 s, for --load-seconds. Each
request is bounded (5 s) and so are the loops (time and count). The server's RSS is sampled
every 50 ms, its open-connection gauge every 0.25 s from the metrics port. Each abusive client
reports what it did. The bench fails, with one line saying why, when a normal request fails or
is answered otherwise than in the quiet phase (a failed-open answer), when p99 of the normal
requests is over 1 s, when muster_admission_fail_open_total grows, when the server's RSS (or
its peak, VmHWM) goes over the chart's memory limit (charts/muster/values.yaml,
webhook.resources.limits.memory), when the connection gauge is not back to 0 after a phase, or
when an abusive client did not do its work (it was not cut off, refused or answered as the
limits say, or the connections it held did not fill the server).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import socket
import ssl
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench import results  # noqa: E402
from bench.bench_serve import free_port, local_tls, process, wait_ready  # noqa: E402
from webhook.admission.server import ServeOptions  # noqa: E402
from webhook.demo import EXAMPLE_POLICIES  # noqa: E402
from webhook.quantity import whole  # noqa: E402

FIXTURES = REPO.parent / "shared" / "fixtures" / "admission"
HOST = "127.0.0.1"  # loopback only: the server, and the bench's own client
#: the abusive clients' addresses (loopback too; Linux routes all of 127/8 to lo)
SOURCES = [f"127.0.0.{i}" for i in range(2, 8)]
MiB = 1024 * 1024
#: the server's defaults, which it runs with here (docs/webhook.md, "Limits")
DEFAULTS = ServeOptions(policies=[])
HEADER_TIMEOUT, BODY_TIMEOUT = DEFAULTS.header_timeout, DEFAULTS.body_timeout
MAX_CONNECTIONS, MAX_BODY = DEFAULTS.max_connections, DEFAULTS.max_body_bytes
PER_SOURCE, RESERVED = DEFAULTS.max_connections_per_source, DEFAULTS.reserved_connections
METRICS_MAX = DEFAULTS.metrics_max_connections
#: what the server still takes to close a connection after its deadline (lingering, TLS)
GRACE = 3.0
#: fewer normal requests in a phase than this, and its figures say nothing
MIN_REQUESTS = 20
#: the most a normal request may take (issue #54), and the most each loop sends
P99_LIMIT_MS, MAX_REQUESTS = 1000.0, 5000
#: the first bytes of a TLS ClientHello record: the server waits for the rest
PARTIAL_HELLO = bytes([0x16, 0x03, 0x01, 0x02, 0x00, 0x01])

Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


def headers(size: int, path: str = "/mutate/pods?timeout=10s") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            f"Content-Length: {size}\r\nUser-Agent: bench-abuse\r\n\r\n").encode()


def policies_review(text: str) -> bytes:
    review = json.loads((FIXTURES / "configmap-update-policies.json").read_text())
    review["request"]["object"]["data"] = {"policies.yaml": text}
    return json.dumps(review).encode()


def alias_bomb_review() -> bytes:
    rows = ["    a0: &a0 [x, x, x, x, x, x, x, x, x, x]",
            *(f"    a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 7))]
    return policies_review(
        "apiVersion: muster.io/v1alpha1\nkind: SchedulingPolicy\nmetadata: {name: bomb}\n"
        "spec:\n  labels:\n" + "\n".join(rows) + "\n")


def conflicting_policies_review(count: int = 1300) -> bytes:
    """`count` policies matching the same pods, their gang queues alternating: each policy
    conflicts with half of the others (security review #54: 180 KB, 1,300 policies)."""
    docs = [f"apiVersion: muster.io/v1alpha1\nkind: SchedulingPolicy\n"
            f"metadata: {{name: p{i}}}\n"
            f"spec: {{match: {{namespaces: [ns]}}, gang: {{backend: volcano, "
            f"queue: q{i % 2}}}}}\n" for i in range(count)]
    return policies_review("---\n".join(docs))


# --- abusive clients (run as `bench_abuse.py --attack KIND ...`, one JSON line out) ---------

def source(i: int, sources: int) -> str:
    return SOURCES[i % sources]


async def open_tls(port: int, ctx: ssl.SSLContext, src: str) -> Stream | None:
    """A TLS connection, or None when the server refused it."""
    try:
        return await asyncio.wait_for(asyncio.open_connection(
            HOST, port, ssl=ctx, server_hostname="localhost", local_addr=(src, 0)), 15)
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


@dataclass
class Job:
    """What one abusive client process is asked to do."""

    port: int
    ctx: ssl.SSLContext
    count: int
    seconds: float
    size: int
    sources: int


def summarize(results: list[float | str | None]) -> dict[str, Any]:
    closed = [r for r in results if isinstance(r, float)]
    return {"clients": len(results), "refused": results.count("refused"),
            "accepted": len(results) - results.count("refused"),
            "closed_by_server": len(closed), "still_open": results.count(None),
            "closed_after_max_s": max(closed, default=0.0)}


Client = Callable[[int, asyncio.Semaphore], Awaitable[float | str | None]]


async def each(job: Job, gate: int, one: Client) -> dict[str, Any]:
    """`one(i, connecting)` for each of job.count clients; each connects holding
    `connecting`, so that at most `gate` connect at once."""
    connecting = asyncio.Semaphore(gate)
    return summarize(await asyncio.gather(*(one(i, connecting) for i in range(job.count))))


async def resets(job: Job) -> dict[str, Any]:
    """Connections that send part of a ClientHello and reset, spread over job.seconds."""
    done = 0
    for i in range(job.count):
        with contextlib.suppress(OSError):
            _, writer = await asyncio.open_connection(HOST, job.port,
                                                      local_addr=(source(i, job.sources), 0))
            if i % 2:
                writer.write(PARTIAL_HELLO)
                await writer.drain()
            writer.get_extra_info("socket").setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()  # with SO_LINGER 0: RST
            done += 1
        await asyncio.sleep(job.seconds / job.count)
    return {"clients": job.count, "reset": done}


async def slow_headers(job: Job) -> dict[str, Any]:
    async def one(i: int, connecting: asyncio.Semaphore) -> float | str | None:
        async with connecting:
            conn = await open_tls(job.port, job.ctx, source(i, job.sources))
        if conn is None:
            return "refused"
        reader, writer = conn
        closed = asyncio.create_task(closed_after(reader, job.seconds))
        for byte in headers(10) * 10:  # never all sent: one byte a second
            if closed.done():
                break
            with contextlib.suppress(OSError):
                writer.write(bytes([byte]))
            await asyncio.wait({closed}, timeout=1.0)
        result = await closed
        writer.close()
        return result

    return await each(job, 50, one)


async def idle_tls(job: Job) -> dict[str, Any]:
    async def one(i: int, connecting: asyncio.Semaphore) -> float | str | None:
        async with connecting:
            conn = await open_tls(job.port, job.ctx, source(i, job.sources))
        if conn is None:
            return "refused"
        reader, writer = conn
        result = await closed_after(reader, job.seconds)
        writer.close()
        return result

    return await each(job, 100, one)


async def idle_hold(job: Job) -> dict[str, Any]:
    """One review each, answered, then the connection held open (keep-alive) and unused."""
    body = (FIXTURES / "pod-create-worker.json").read_bytes()
    served = 0

    async def one(i: int, connecting: asyncio.Semaphore) -> float | str | None:
        nonlocal served
        async with connecting:
            conn = await open_tls(job.port, job.ctx, source(i, job.sources))
        if conn is None:
            return "refused"
        reader, writer = conn
        try:
            writer.write(headers(len(body)) + body)
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
        except (OSError, TimeoutError, asyncio.IncompleteReadError, IndexError):
            writer.close()
            return "refused"  # closed before its answer: it held nothing
        served += head.startswith(b"HTTP/1.1 200")
        result = await closed_after(reader, job.seconds)
        writer.close()
        return result

    report = await each(job, 50, one)
    return {**report, "served": served}


async def metrics_headers(job: Job) -> dict[str, Any]:
    """Plain connections to the metrics port that send half a request."""
    async def one(i: int, connecting: asyncio.Semaphore) -> float | str | None:
        try:
            async with connecting:
                reader, writer = await asyncio.wait_for(asyncio.open_connection(
                    HOST, job.port, local_addr=(source(i, job.sources), 0)), 15)
        except (OSError, TimeoutError):
            return "refused"
        with contextlib.suppress(OSError):
            writer.write(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n")
        result = await closed_after(reader, job.seconds)
        writer.close()
        return result

    return await each(job, 300, one)


async def big_bodies(job: Job) -> dict[str, Any]:
    chunk = b" " * 65536
    size = job.size

    async def one(i: int) -> tuple[str, float, int]:
        conn = await open_tls(job.port, job.ctx, source(i, job.sources))
        if conn is None:
            return "refused", 0.0, 0
        reader, writer = conn
        started = time.monotonic()
        answer = asyncio.create_task(reader.readline())
        sent = 0
        try:
            async with asyncio.timeout(job.seconds):
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

    results = await asyncio.gather(*(one(i) for i in range(job.count)))
    statuses: dict[str, int] = {}
    for status, _, _ in results:
        statuses[status] = statuses.get(status, 0) + 1
    return {"clients": job.count, "statuses": statuses,
            "answered_after_max_s": max(t for _, t, _ in results),
            "bytes_sent": sum(s for _, _, s in results)}


async def post_back_to_back(job: Job, body: bytes) -> list[tuple[int, bytes, float]]:
    """job.count clients posting `body` to /validate/policies for job.seconds (each request
    60 s at most, MAX_REQUESTS in all): (status, answer, seconds) of each."""
    conn = aiohttp.TCPConnector(ssl=job.ctx, limit=job.count, local_addr=(SOURCES[0], 0))
    timeout = aiohttp.ClientTimeout(total=60)
    outcomes: list[tuple[int, bytes, float]] = []
    end = time.monotonic() + job.seconds
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
        async def loop() -> None:
            while time.monotonic() < end and len(outcomes) < MAX_REQUESTS:
                started = time.monotonic()
                try:
                    async with session.post(f"https://{HOST}:{job.port}/validate/policies",
                                            data=body,
                                            headers={"Content-Type": "application/json"}) as r:
                        status, answer = r.status, await r.read()
                except (aiohttp.ClientError, OSError, TimeoutError):
                    status, answer = 0, b""  # (refused or cut: counted as not answered)
                    await asyncio.sleep(0.1)
                outcomes.append((status, answer, time.monotonic() - started))

        await asyncio.gather(*(loop() for _ in range(job.count)))
    return outcomes


def refusal_message(answer: bytes) -> str:
    if not answer:
        return ""
    response = json.loads(answer)["response"]
    return "" if response["allowed"] else str(response["status"]["message"])


async def alias_bomb(job: Job) -> dict[str, Any]:
    body = alias_bomb_review()
    outcomes = await post_back_to_back(job, body)
    refused = [s == 200 and "alias *a0: aliases are not accepted" in refusal_message(a)
               for s, a, _ in outcomes]
    return {"requests": len(outcomes), "refused_as_alias": sum(refused),
            "answered_after_max_s": max((t for _, _, t in outcomes), default=0.0),
            "bytes_each": len(body)}


async def policy_memory(job: Job) -> dict[str, Any]:
    body = conflicting_policies_review()
    outcomes = await post_back_to_back(job, body)
    return {"requests": len(outcomes),
            "refused_as_conflict": sum(s == 200 and "conflicts with" in refusal_message(a)
                                       for s, a, _ in outcomes),
            "answered_after_max_s": max((t for _, _, t in outcomes), default=0.0),
            "answer_bytes_max": max((len(a) for _, a, _ in outcomes), default=0),
            "bytes_each": len(body)}


ATTACKS: dict[str, Callable[[Job], Coroutine[Any, Any, dict[str, Any]]]] = {
    "resets": resets, "slow-headers": slow_headers, "idle-tls": idle_tls,
    "idle-hold": idle_hold, "big-bodies": big_bodies, "alias-bomb": alias_bomb,
    "metrics-headers": metrics_headers, "policy-memory": policy_memory}


def attack(args: argparse.Namespace) -> int:
    ctx = ssl.create_default_context(cafile=args.cafile)
    job = Job(args.port, ctx, args.count, args.seconds, args.size, args.sources)
    result = asyncio.run(ATTACKS[args.attack](job))
    print(json.dumps(result), flush=True)
    return 0


# --- the bench ---------------------------------------------------------------------------

@dataclass
class Attacker:
    kind: str
    count: int
    seconds: float
    size: int = 0
    #: how many of SOURCES it connects from
    sources: int = len(SOURCES)
    #: "admission" or "metrics": the port it attacks
    port: str = "admission"


@dataclass
class Phase:
    name: str
    attackers: list[Attacker]
    latencies_ms: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    rss_max_mib: float = 0.0
    reports: list[dict[str, Any]] = field(default_factory=list)
    #: the open-connection gauge by listener: its peak during the phase, its value after
    open_peak: dict[str, float] = field(default_factory=dict)
    open_after: dict[str, float] = field(default_factory=dict)
    fail_open: float = 0.0  # muster_admission_fail_open_total's growth over the phase


def plan(load: float) -> list[Phase]:
    """The phases; an abusive client that holds connections holds them through the normal
    requests (1.5 s head start + `load` s)."""
    held = max(HEADER_TIMEOUT + GRACE + 1, load + 4)
    return [
        Phase("quiet", []),
        Phase("resets x300", [Attacker("resets", 300, load + 1.5)]),
        Phase("slow headers x300", [Attacker("slow-headers", 300, held)]),
        Phase("idle keep-alive x300", [Attacker("idle-hold", 300, held)]),
        Phase("idle TLS x1000", [Attacker("idle-tls", 1000, held)]),
        Phase("unfinished bodies x40", [
            Attacker("big-bodies", 40, BODY_TIMEOUT + GRACE + 2, MAX_BODY - 1024, 1),
            Attacker("big-bodies", 10, 5.0, 7 * MiB, 1)]),
        # the worst case: from 6 addresses, bodies sent faster than they are read, more
        # than every slot
        Phase("unfinished bodies x300", [
            Attacker("big-bodies", 300, BODY_TIMEOUT + GRACE + 2, MAX_BODY - 1024)]),
        Phase("alias bomb", [Attacker("alias-bomb", 4, 5.0, sources=1)]),
        Phase("metrics headers x3000", [Attacker("metrics-headers", 3000, held,
                                                 port="metrics")]),
        # last: what it allocates stays in the process (and in VmHWM)
        Phase("policy memory", [Attacker("policy-memory", 1, load + 1.5, sources=1)]),
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


@dataclass
class Target:
    """The server under test and how the bench reaches it."""

    url: str
    metrics_url: str
    ctx: ssl.SSLContext
    body: bytes
    pid: int
    attack_args: list[str]
    load_seconds: float
    #: the quiet phase's answer to the review: every later answer must be the same
    expected: dict[str, Any] | None = None


def sample(text: str, name: str, **labels: str) -> float:
    """The sum of a metric's samples whose labels include `labels`."""
    total = 0.0
    for m in re.finditer(rf"^{name}(?:{{([^}}]*)}})? ([-\d.e+]+)$", text, re.M):
        have = dict(re.findall(r'(\w+)="([^"]*)"', m[1] or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            total += float(m[2])
    return total


async def scrape(target: Target) -> str:
    """The metrics page, over a new connection (as Prometheus after a restart)."""
    conn = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=5)) \
            as session, session.get(target.metrics_url) as r:
        return await r.text()


def open_connections(text: str) -> dict[str, float]:
    return {listener: sample(text, "muster_admission_open_connections", listener=listener)
            for listener in ("admission", "metrics")}


def check_answer(answer: dict[str, Any], target: Target) -> str | None:
    """Why a normal review's answer is not the quiet phase's (None: it is)."""
    got = {k: v for k, v in answer["response"].items() if k != "uid"}
    if target.expected is None:
        target.expected = got
    if got != target.expected:
        return f"answered otherwise than in the quiet phase (failed open?): {str(got)[:200]}"
    return None


async def timed(phase: Phase, call: Callable[[], Awaitable[str | None]]) -> None:
    started = time.perf_counter()
    try:
        problem = await call()
    except (aiohttp.ClientError, OSError, ValueError, TimeoutError) as exc:
        problem = f"{type(exc).__name__}: {exc}"
    phase.latencies_ms.append((time.perf_counter() - started) * 1000)
    if problem:
        phase.failures.append(problem)


async def normal_load(target: Target, phase: Phase, probe_metrics: bool) -> None:
    """Reviews from 4 workers over 4 connections opened now, kept alive; a probe over a new
    connection every 0.1 s (of /readyz, and of /metrics when `probe_metrics`)."""
    end = time.monotonic() + target.load_seconds
    timeout = aiohttp.ClientTimeout(total=5)
    conn = aiohttp.TCPConnector(ssl=target.ctx, limit=4, keepalive_timeout=300)

    async def review(session: aiohttp.ClientSession) -> str | None:
        async with session.post(f"{target.url}/mutate/pods?timeout=10s", data=target.body,
                                headers={"Content-Type": "application/json"}) as r:
            if r.status != 200:
                return f"HTTP {r.status}: {(await r.text())[:200]}"
            return check_answer(await r.json(), target)

    async def probe(url: str) -> str | None:
        fresh = aiohttp.TCPConnector(ssl=target.ctx, force_close=True)
        async with aiohttp.ClientSession(connector=fresh, timeout=timeout) as s, \
                s.get(url) as r:
            return None if r.status == 200 else f"{url}: HTTP {r.status}"

    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
        async def worker() -> None:
            for _ in range(MAX_REQUESTS):
                if time.monotonic() >= end:
                    return
                await timed(phase, lambda: review(session))

        async def prober() -> None:
            urls = [f"{target.url}/readyz", *([target.metrics_url] if probe_metrics else [])]
            for _ in range(MAX_REQUESTS):
                if time.monotonic() >= end:
                    return
                for url in urls:
                    await timed(phase, lambda u=url: probe(u))  # type: ignore[misc]
                await asyncio.sleep(0.1)

        await asyncio.gather(*(worker() for _ in range(4)), prober())


async def watch(target: Target, phase: Phase, stop: asyncio.Event) -> None:
    """The server's RSS every 50 ms, its open connections every 0.25 s (peak)."""
    last_scrape = 0.0
    while not stop.is_set():
        phase.rss_max_mib = max(phase.rss_max_mib, rss_mib(target.pid)[0])
        if time.monotonic() - last_scrape >= 0.25:
            last_scrape = time.monotonic()
            with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
                for listener, value in open_connections(await scrape(target)).items():
                    phase.open_peak[listener] = max(phase.open_peak.get(listener, 0), value)
        await asyncio.sleep(0.05)


async def settled(target: Target, phase: Phase) -> None:
    """The open-connection gauge once nothing is connected any more (the scrape's own
    connection on the metrics port aside), waiting for it as long as a header timeout."""
    deadline = time.monotonic() + HEADER_TIMEOUT + GRACE
    while True:
        with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
            phase.open_after = open_connections(await scrape(target))
            phase.open_after["metrics"] -= 1  # this scrape
        if not any(phase.open_after.values()) or time.monotonic() > deadline:
            return
        await asyncio.sleep(0.25)


async def fail_opens(target: Target) -> float:
    return sample(await scrape(target), "muster_admission_fail_open_total")


async def run_phase(phase: Phase, target: Target, ports: dict[str, str]) -> None:
    procs = [await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--attack", a.kind, "--count", str(a.count), "--seconds",
        str(a.seconds), "--size", str(a.size), "--sources", str(a.sources), "--port",
        ports[a.port], *target.attack_args, stdout=subprocess.PIPE, cwd=REPO)
        for a in phase.attackers]
    fail_open_before = await fail_opens(target)
    stop = asyncio.Event()
    watcher = asyncio.create_task(watch(target, phase, stop))
    if procs:
        await asyncio.sleep(1.5)  # the abusive clients connected and at it
    probe_metrics = any(a.port == "metrics" for a in phase.attackers)
    await normal_load(target, phase, probe_metrics)
    for proc in procs:  # their reports; the watcher goes on until they are done
        out, _ = await asyncio.wait_for(proc.communicate(), 180)
        try:
            phase.reports.append(json.loads(out))
        except ValueError:  # it crashed (its traceback is on stderr): it did not do its work
            phase.reports.append({"crashed": proc.returncode})
    stop.set()
    await watcher
    await settled(target, phase)
    phase.fail_open = await fail_opens(target) - fail_open_before


def check_attack(attacker: Attacker, report: dict[str, Any], phase: Phase) -> list[str]:
    """What one abusive client did matches the limits; one line per mismatch."""
    where = f"{phase.name}: {attacker.kind} x{attacker.count}"
    problem = "crashed" if "crashed" in report else CHECKS[attacker.kind](attacker, report, phase)
    return [f"{where}: {problem}: {report}"] if problem else []


def cut_off(attacker: Attacker, report: dict[str, Any], phase: Phase) -> str | None:
    """Slow or idle connections that never send a request: each closed within the header
    timeout, and together they filled the slots that unserved connections may take."""
    listener = attacker.port
    cap = METRICS_MAX - METRICS_MAX // 4 if listener == "metrics" else MAX_CONNECTIONS - RESERVED
    if report["still_open"] or report["closed_after_max_s"] > HEADER_TIMEOUT + GRACE:
        return "not cut off at the header timeout"
    if phase.open_peak.get(listener, 0) < cap:
        return f"held at most {phase.open_peak.get(listener, 0):.0f} connections, not {cap}"
    return None


def held_idle(_: Attacker, report: dict[str, Any], phase: Phase) -> str | None:
    """Connections served once, then idle: the slots filled, the oldest closed for newer
    ones, never more than the cap held."""
    if report["served"] < MAX_CONNECTIONS:
        return f"only {report['served']} served a review"
    if report["served"] - report["closed_by_server"] > MAX_CONNECTIONS:
        return f"more than {MAX_CONNECTIONS} held at once"
    if phase.open_peak.get("admission", 0) < MAX_CONNECTIONS - RESERVED:
        return f"held at most {phase.open_peak.get('admission', 0):.0f} connections"
    return None


def answered_bodies(attacker: Attacker, report: dict[str, Any], phase: Phase) -> str | None:
    """Each accepted body answered 408 at the body timeout (413 at once when too large), or
    closed to make room once unserved connections held their share; refused only past what
    one address may hold."""
    want = "413" if attacker.size > MAX_BODY else "408"
    statuses = dict(report["statuses"])
    refused = statuses.pop("refused", 0)
    made_room = statuses.pop("reset", 0) + statuses.pop("closed", 0)
    if set(statuses) != {want} or refused > max(0, attacker.count - PER_SOURCE):
        return f"expected {want} for each connection accepted ({attacker.size} bytes)"
    if made_room and attacker.count <= MAX_CONNECTIONS - RESERVED:
        return "closed to make room with room left"
    if attacker.count > MAX_CONNECTIONS and \
            phase.open_peak.get("admission", 0) < MAX_CONNECTIONS - RESERVED:
        return f"held at most {phase.open_peak.get('admission', 0):.0f} connections"
    if want == "413" and report["answered_after_max_s"] > 1.0:
        return f"413 took {report['answered_after_max_s']:.1f} s"
    return None


def resets_done(attacker: Attacker, report: dict[str, Any], _: Phase) -> str | None:
    return None if report["reset"] == attacker.count else "not every connection was reset"


def bombs_refused(_: Attacker, report: dict[str, Any], __: Phase) -> str | None:
    if report["requests"] == 0 or report["refused_as_alias"] != report["requests"] \
            or report["answered_after_max_s"] > 1.0:
        return "not every bomb refused at once"
    return None


def conflicts_refused(_: Attacker, report: dict[str, Any], __: Phase) -> str | None:
    if report["requests"] == 0 or report["refused_as_conflict"] != report["requests"]:
        return "not every conflicting policy set answered and refused"
    return None


CHECKS: dict[str, Callable[[Attacker, dict[str, Any], Phase], str | None]] = {
    "resets": resets_done, "slow-headers": cut_off, "idle-tls": cut_off,
    "metrics-headers": cut_off, "idle-hold": held_idle, "big-bodies": answered_bodies,
    "alias-bomb": bombs_refused, "policy-memory": conflicts_refused}


def check_phase(phase: Phase, limit: float) -> list[str]:
    """The normal requests, the server's memory and connections after the phase."""
    problems = []
    if phase.failures:
        problems.append(f"{phase.name}: {len(phase.failures)} normal requests failed, "
                        f"e.g. {phase.failures[0]}")
    p99 = statistics.quantiles(phase.latencies_ms, n=100)[98]
    if p99 > P99_LIMIT_MS:
        problems.append(f"{phase.name}: normal requests p99 {p99:.0f} ms, over "
                        f"{P99_LIMIT_MS:.0f} ms")
    if phase.fail_open:
        problems.append(f"{phase.name}: {phase.fail_open:.0f} answers failed open")
    if phase.rss_max_mib > limit:
        problems.append(f"{phase.name}: server RSS {phase.rss_max_mib:.1f} MiB over the "
                        f"{limit:.0f} MiB limit")
    if any(phase.open_after.values()) or not phase.open_after:
        problems.append(f"{phase.name}: connections still counted open after the phase: "
                        f"{phase.open_after or 'gauge not read'}")
    for attacker, rep in zip(phase.attackers, phase.reports, strict=True):
        problems.extend(check_attack(attacker, rep, phase))
    return problems


async def bench(args: argparse.Namespace, work: Path) -> int:
    load0 = os.getloadavg()[0]
    cafile = local_tls(work)
    port, metrics_port = free_port(), free_port()
    url = f"https://{HOST}:{port}"
    serve = [sys.executable, "-m", "webhook", "--log-level", "error", "serve", "--host", HOST,
             "--port", str(port), "--metrics-port", str(metrics_port), "--metrics-host", HOST,
             "--policies", str(EXAMPLE_POLICIES), "--tls-cert-file", str(work / "tls.crt"),
             "--tls-key-file", str(work / "tls.key")]
    body = (FIXTURES / "pod-create-worker.json").read_bytes()
    limit = memory_limit_mib()
    phases = plan(args.load_seconds)
    with process(serve, work / "serve.log") as srv:
        await asyncio.to_thread(wait_ready, url, cafile, srv, work / "serve.log")
        target = Target(url, f"http://{HOST}:{metrics_port}/metrics",
                        ssl.create_default_context(cafile=str(cafile)), body, srv.pid,
                        ["--cafile", str(cafile)], args.load_seconds)
        ports = {"admission": str(port), "metrics": str(metrics_port)}
        for phase in phases:
            await run_phase(phase, target, ports)
            print(f"{phase.name:22s} done", flush=True)
        hwm = rss_mib(srv.pid)[1]
    failed = report(phases, limit, hwm)
    if args.json is not None:
        results.write(args.json, "abuse", load0, {
            "memory_limit_mib": limit, "rss_peak_mib": hwm,
            "phases": [figures(p) for p in phases if len(p.latencies_ms) >= MIN_REQUESTS]})
    return failed


def figures(phase: Phase) -> dict[str, Any]:
    """A phase's normal requests (count, p50 and p99 ms) and the server's RSS peak in it."""
    q = statistics.quantiles(phase.latencies_ms, n=100)
    return {"phase": phase.name, "requests": len(phase.latencies_ms), "p50_ms": q[49],
            "p99_ms": q[98], "rss_max_mib": phase.rss_max_mib}


def report(phases: list[Phase], limit: float, hwm: float) -> int:
    base = figures(phases[0])
    print(f"\nmuster serve on {HOST}, default limits; normal requests: 4 workers over 4 "
          f"kept-alive connections opened in each phase, a probe over a new connection every "
          f"0.1 s; memory limit {limit:.0f} MiB (charts/muster/values.yaml)")
    print(f"{'phase':22s} {'requests':>8s} {'p50 ms':>8s} {'p99 ms':>8s} {'p50 x':>6s} "
          f"{'p99 x':>6s} {'RSS max MiB':>12s} {'open peak':>10s} {'open after':>10s}")
    problems: list[str] = []
    for phase in phases:
        if len(phase.latencies_ms) < MIN_REQUESTS:
            problems.append(f"{phase.name}: only {len(phase.latencies_ms)} normal requests")
            continue
        got = figures(phase)
        peak = "/".join(f"{phase.open_peak.get(k, 0):.0f}" for k in ("admission", "metrics"))
        after = "/".join(f"{phase.open_after.get(k, -1):.0f}" for k in ("admission", "metrics"))
        print(f"{phase.name:22s} {got['requests']:8d} {got['p50_ms']:8.2f} {got['p99_ms']:8.2f} "
              f"{got['p50_ms'] / base['p50_ms']:6.2f} {got['p99_ms'] / base['p99_ms']:6.2f} "
              f"{phase.rss_max_mib:12.1f} "
              f"{peak:>10s} {after:>10s}")
        for attacker, rep in zip(phase.attackers, phase.reports, strict=True):
            print(f"    {attacker.kind} x{attacker.count}"
                  + (f" ({attacker.size} bytes)" if attacker.size else "") + f": {rep}")
        problems.extend(check_phase(phase, limit))
    print("(open: muster_admission_open_connections, admission/metrics port)")
    print(f"server peak RSS (VmHWM) over the run: {hwm:.1f} MiB")
    if hwm > limit:
        problems.append(f"server peak RSS {hwm:.1f} MiB over the {limit:.0f} MiB limit")
    for problem in problems:
        print(f"FAIL {problem}")
    if not problems:
        print("ok: every normal request answered as in the quiet phase within "
              f"{P99_LIMIT_MS / 1000:.0f} s (p99), RSS under the limit, the connection gauge "
              "back to 0 after each phase, every abusive client cut off, refused or answered "
              "as the limits say")
    return 1 if problems else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--load-seconds", type=float, default=4.0,
                        help="normal requests in each phase, seconds (default 4)")
    parser.add_argument("--json", type=Path, metavar="FILE",
                        help="also write each phase's figures here (bench/plots.py reads them)")
    parser.add_argument("--attack", choices=sorted(ATTACKS), help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--cafile", help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, default=5.0, help=argparse.SUPPRESS)
    parser.add_argument("--size", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--sources", type=int, default=len(SOURCES), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.attack:
        return attack(args)
    with tempfile.TemporaryDirectory(prefix="bench-abuse-") as tmp:
        return asyncio.run(bench(args, Path(tmp)))


if __name__ == "__main__":
    sys.exit(main())
