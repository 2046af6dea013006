"""Slow, idle and greedy clients (security review #24): each is cut off or bounded, and normal
admission requests keep being answered meanwhile."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import struct
import time
import tracemalloc
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from admission_helpers import Tls, client, load_fixture, metric, review, running

from webhook.admission.admit import Admitter
from webhook.admission.limits import BodyBudget
from webhook.admission.review import AdmissionReview

Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def _tls(tls: Tls, port: int) -> Stream:
    return await asyncio.open_connection("127.0.0.1", port, ssl=tls.client_context(),
                                         server_hostname="localhost")


#: how long a test waits for the server to close a connection: far past every timeout it
#: tests, so a slow machine passes and a server that never closes fails
GIVE_UP = 10.0


async def _closed_after(reader: asyncio.StreamReader) -> float | None:
    """Seconds until the server closes the connection (read to EOF, or reset); None if it is
    still open after GIVE_UP."""
    started = time.perf_counter()
    try:
        async with asyncio.timeout(GIVE_UP):
            while await reader.read(65536):
                pass
    except (ConnectionError, ssl.SSLError):
        pass
    except TimeoutError:
        return None
    return time.perf_counter() - started


def _after_timeout(closed: float | None, timeout: float) -> bool:
    """Closed, and not before its timeout (less a margin for the clocks)."""
    return closed is not None and closed > timeout * 0.6


@pytest.fixture
def held_decisions(monkeypatch: pytest.MonkeyPatch) -> asyncio.Event:
    """/mutate/pods decides only once this is set: its connections serve a request (all of it
    received) until then."""
    release = asyncio.Event()
    original = Admitter.mutate

    async def mutate(self: Admitter, review: AdmissionReview, budget: float, *,
                     fail_closed: bool = False) -> tuple[dict[str, Any], str]:
        await release.wait()
        return await original(self, review, budget, fail_closed=fail_closed)

    monkeypatch.setattr(Admitter, "mutate", mutate)
    return release


def _headers(content_length: int) -> bytes:
    return (f"POST /mutate/pods?timeout=5s HTTP/1.1\r\nHost: localhost\r\n"
            f"Content-Type: application/json\r\nContent-Length: {content_length}\r\n\r\n").encode()


async def test_a_slow_header_client_is_cut_off_after_the_timeout(
        tls: Tls, policy_dir: Path, shared_dir: Path) -> None:
    body = load_fixture(shared_dir, "pod-create-worker.json")
    async with running(tls, [policy_dir], header_timeout=0.5) as srv, client(tls) as s:
        # one header byte every 0.1 s: each arrives in time, the headers never do
        slow_reader, slow = await _tls(tls, srv.port)
        silent_reader, silent = await asyncio.open_connection("127.0.0.1", srv.port)  # no TLS

        async def trickle() -> None:
            for byte in _headers(10):
                slow.write(bytes([byte]))
                await asyncio.sleep(0.1)

        trickling = asyncio.create_task(trickle())
        closed = await asyncio.gather(_closed_after(slow_reader), _closed_after(silent_reader))
        trickling.cancel()
        assert all(_after_timeout(t, 0.5) for t in closed), closed
        assert metric(srv, "muster_admission_connections_closed_total", listener="admission",
                      reason="header_timeout") == 2
        # a client that sends its request at once is served, on a connection kept alive
        for _ in range(2):
            assert (await review(s, f"{srv.url}/mutate/pods", body))["allowed"] is True
        await asyncio.sleep(0.8)  # past the header timeout: a served connection stays
        assert (await review(s, f"{srv.url}/mutate/pods", body))["allowed"] is True
        for w in (slow, silent):
            w.close()


async def test_an_idle_kept_alive_connection_is_closed(
        tls: Tls, policy_dir: Path, shared_dir: Path) -> None:
    body = json.dumps(load_fixture(shared_dir, "pod-create-worker.json")).encode()
    async with running(tls, [policy_dir], idle_timeout=0.5) as srv:
        reader, writer = await _tls(tls, srv.port)
        writer.write(_headers(len(body)) + body)
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200")
        closed = await _closed_after(reader)
        assert _after_timeout(closed, 0.5), closed
        writer.close()


async def test_connections_over_the_cap_are_closed_before_any_tls(
        tls: Tls, policy_dir: Path, shared_dir: Path, held_decisions: asyncio.Event) -> None:
    """Every slot serving a request: a new connection is refused, and costs nothing."""
    fixture = load_fixture(shared_dir, "pod-create-worker.json")
    body = json.dumps(fixture).encode()
    async with running(tls, [policy_dir], max_connections=4, reserved_connections=1,
                       header_timeout=30.0) as srv:
        held = []
        for _ in range(4):  # one at a time, each served before the next connects
            held.append(await _tls(tls, srv.port))
            held[-1][1].write(_headers(len(body)) + body)
            await asyncio.sleep(0.05)
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            refused = [await asyncio.open_connection("127.0.0.1", srv.port) for _ in range(100)]
            closed = await asyncio.gather(*(_closed_after(r) for r, _ in refused))
            grown = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        assert None not in closed  # the header timeout (30 s) would have kept them open
        # an accepted TLS connection costs asyncio 256 KiB at once: a refused one nothing
        assert grown < 2 * 1024 * 1024, grown
        assert metric(srv, "muster_admission_connections_closed_total", listener="admission",
                      reason="limit") == 100
        assert metric(srv, "muster_admission_open_connections", listener="admission") == 4
        held_decisions.set()  # the held requests are answered
        for reader, _ in held:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
            assert head.startswith(b"HTTP/1.1 200")
        async with client(tls) as s:  # the held connections are idle now: room again
            assert (await review(s, f"{srv.url}/mutate/pods", fixture))["allowed"] is True
        for _, writer in (*held, *refused):
            writer.close()


async def test_an_oversize_body_gets_413_at_once_unread(tls: Tls, policy_dir: Path) -> None:
    """4 MiB: over the 3 MiB default (kube-apiserver's own limit), under the old 8 MiB."""
    async with running(tls, [policy_dir]) as srv:
        reader, writer = await _tls(tls, srv.port)
        writer.write(_headers(4 * 1024 * 1024) + b"{" + b" " * 65536)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), GIVE_UP)
        assert head.startswith(b"HTTP/1.1 413")  # the rest never comes: answered unread
        # what the client still sends is dropped, then the connection is closed
        assert await _closed_after(reader) is not None
        writer.close()


async def test_unfinished_bodies_time_out_and_hold_no_more_than_the_budget(
        tls: Tls, policy_dir: Path, shared_dir: Path) -> None:
    body = load_fixture(shared_dir, "pod-create-worker.json")
    async with running(tls, [policy_dir], body_timeout=0.6,
                       max_inflight_body_bytes=1024 * 1024) as srv, client(tls) as s:
        # three bodies of 900 KiB, each stopping short: one reads, two wait for the budget
        stalled = [await _tls(tls, srv.port) for _ in range(3)]
        started = time.perf_counter()
        for _, writer in stalled:
            writer.write(_headers(900 * 1024) + b"{" + b" " * 100_000)
        await asyncio.sleep(0.2)
        # a review whose body is all there does not wait for the budget
        assert (await review(s, f"{srv.url}/mutate/pods", body))["allowed"] is True
        heads = await asyncio.gather(*(asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 3.0)
                                       for r, _ in stalled))
        assert time.perf_counter() - started < 1.5
        assert all(h.startswith(b"HTTP/1.1 408") for h in heads), heads
        for _, writer in stalled:
            writer.close()
        assert metric(srv, "muster_admission_requests_total", endpoint="mutate",
                      outcome="body_timeout") == 3


async def test_the_body_budget_is_first_come_first_served_and_survives_cancellation() -> None:
    budget = BodyBudget(10)
    order: list[str] = []

    async def take(name: str, size: int, hold: float) -> None:
        async with budget.hold(size):
            order.append(name)
            await asyncio.sleep(hold)

    first = asyncio.create_task(take("a", 8, 0.1))
    await asyncio.sleep(0)
    big = asyncio.create_task(take("b", 5, 0))
    small = asyncio.create_task(take("c", 1, 0))  # fits, but waits behind b
    cancelled = asyncio.create_task(take("d", 4, 0))
    await asyncio.sleep(0.01)
    assert (order, budget.free) == (["a"], 2)
    cancelled.cancel()
    await asyncio.gather(first, big, small, return_exceptions=True)
    assert order == ["a", "b", "c"]
    assert budget.free == 10
    async with budget.hold(1_000):  # more than the whole budget: counted as all of it
        assert budget.free == 0


@pytest.mark.parametrize("flag", ["max_connections", "header_timeout"])
async def test_normal_requests_are_served_under_the_limits(
        tls: Tls, policy_dir: Path, shared_dir: Path, flag: str) -> None:
    """Many concurrent reviews over a few kept-alive connections: all answered."""
    body = load_fixture(shared_dir, "pod-create-worker.json")
    overrides: dict[str, Any] = {"header_timeout": 0.3} if flag == "header_timeout" \
        else {"max_connections": 8, "reserved_connections": 0}
    async with running(tls, [policy_dir], **overrides) as srv, client(tls, limit=8) as s:
        answers = await asyncio.gather(*(review(s, f"{srv.url}/mutate/pods", body)
                                         for _ in range(40)))
    assert all(a["allowed"] is True for a in answers)


async def test_a_client_leaving_mid_body_is_counted_without_a_traceback(
        tls: Tls, policy_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    async with running(tls, [policy_dir]) as srv:
        _, writer = await _tls(tls, srv.port)
        writer.write(_headers(100_000) + b"{" + b" " * 20_000)
        await asyncio.sleep(0.2)
        writer.transport.abort()
        for _ in range(50):
            if metric(srv, "muster_admission_requests_total", endpoint="mutate",
                      outcome="disconnected"):
                break
            await asyncio.sleep(0.05)
        assert metric(srv, "muster_admission_requests_total", endpoint="mutate",
                      outcome="disconnected") == 1
    assert not [r for r in caplog.records if r.exc_info], caplog.text


async def _reset(port: int, hello: bytes) -> None:
    """A TCP connection that sends `hello` (nothing, or part of a TLS ClientHello) and then
    resets: with SO_LINGER 0, closing sends RST instead of FIN."""
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    if hello:
        writer.write(hello)
        await writer.drain()
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def _gauge_settles(srv: Any, want: float, **labels: str) -> float:
    """The open-connections gauge once it reached `want`, or its value after 5 s of waiting."""
    value = metric(srv, "muster_admission_open_connections", **labels)
    for _ in range(100):
        if value == want:
            break
        await asyncio.sleep(0.05)
        value = metric(srv, "muster_admission_open_connections", **labels)
    return value


async def test_connections_reset_before_the_handshake_give_their_slot_back(
        tls: Tls, policy_dir: Path, shared_dir: Path) -> None:
    """Security review #54: a connection reset while its TLS handshake ran kept its slot for
    good (asyncio calls no connection_lost then), so max_connections resets refused every
    later connection until a restart."""
    body = load_fixture(shared_dir, "pod-create-worker.json")
    # the first bytes of a TLS 1.x ClientHello record: the server waits for the rest
    partial_hello = bytes([0x16, 0x03, 0x01, 0x02, 0x00, 0x01])
    async with running(tls, [policy_dir], max_connections=4, reserved_connections=1,
                       header_timeout=30.0) as srv:
        for i in range(12):  # three times the cap, one at a time so that each is counted
            await _reset(srv.port, partial_hello if i % 2 else b"")
            assert await _gauge_settles(srv, 0, listener="admission") == 0, \
                f"slot {i} kept after its reset"
        async with client(tls) as s:
            assert (await review(s, f"{srv.url}/mutate/pods", body))["allowed"] is True
        assert metric(srv, "muster_admission_connections_closed_total", listener="admission",
                      reason="limit") == 0


async def _exchange(stream: Stream, body: bytes) -> bytes:
    """One review on a kept-alive raw connection: its status line."""
    reader, writer = stream
    writer.write(_headers(len(body)) + body)
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
    await reader.readexactly(length)
    return head.split(b"\r\n")[0]


async def _from(source: str, port: int, tls: Tls | None = None) -> Stream:
    """A connection from another loopback address (the server tells sources by address)."""
    return await asyncio.open_connection(
        "127.0.0.1", port, local_addr=(source, 0), ssl=tls.client_context() if tls else None,
        server_hostname="localhost" if tls else None)


async def _closed(reader: asyncio.StreamReader) -> bool:
    """Whether the server closed the connection (waiting 5 s at most for it)."""
    try:
        async with asyncio.timeout(5.0):
            while await reader.read(65536):
                pass
    except TimeoutError:
        return False
    except (ConnectionError, ssl.SSLError):
        pass
    return True


async def test_the_connection_idle_longest_makes_room_for_a_new_one(
        tls: Tls, policy_dir: Path, shared_dir: Path) -> None:
    """Security review #54: clients that sent one request and then idled held every slot for
    the idle timeout, refusing the API server's new connections."""
    fixture = load_fixture(shared_dir, "pod-create-worker.json")
    body = json.dumps(fixture).encode()
    async with running(tls, [policy_dir], max_connections=3, reserved_connections=1,
                       header_timeout=30.0) as srv:
        idle = []
        for _ in range(3):
            idle.append(await _tls(tls, srv.port))
            assert await _exchange(idle[-1], body) == b"HTTP/1.1 200 OK"
        async with client(tls) as s:
            assert (await review(s, f"{srv.url}/mutate/pods", fixture))["allowed"] is True
        assert await _closed(idle[0][0])  # the first one served, idle longest
        for stream in idle[1:]:
            assert await _exchange(stream, body) == b"HTTP/1.1 200 OK"
        assert metric(srv, "muster_admission_connections_closed_total", listener="admission",
                      reason="idle_evicted") == 1
        for _, writer in idle:
            writer.close()


async def test_one_source_holds_at_most_its_share_of_the_slots(
        tls: Tls, policy_dir: Path, shared_dir: Path) -> None:
    fixture = load_fixture(shared_dir, "pod-create-worker.json")
    async with running(tls, [policy_dir], max_connections=8, reserved_connections=2,
                       max_connections_per_source=2, header_timeout=30.0) as srv:
        silent = [await _from("127.0.0.2", srv.port) for _ in range(5)]
        assert await _gauge_settles(srv, 2, listener="admission") == 2
        assert [await _closed(r) for r, _ in silent[:3]] == [True] * 3  # its oldest went
        async with client(tls) as s:
            assert (await review(s, f"{srv.url}/mutate/pods", fixture))["allowed"] is True
        for _, writer in silent:
            writer.close()


async def test_a_source_whose_connections_all_serve_requests_is_refused(
        tls: Tls, policy_dir: Path, shared_dir: Path, held_decisions: asyncio.Event) -> None:
    """A connection serving a request is never closed to make room."""
    body = json.dumps(load_fixture(shared_dir, "pod-create-worker.json")).encode()
    async with running(tls, [policy_dir], max_connections=8, reserved_connections=2,
                       max_connections_per_source=1, header_timeout=30.0) as srv:
        busy_reader, busy = await _from("127.0.0.2", srv.port, tls)
        busy.write(_headers(len(body)) + body)
        await busy.drain()
        assert await _gauge_settles(srv, 1, listener="admission") == 1
        refused_reader, refused = await _from("127.0.0.2", srv.port)
        assert await _closed(refused_reader)
        assert metric(srv, "muster_admission_connections_closed_total", listener="admission",
                      reason="per_source") == 1
        held_decisions.set()
        head = await asyncio.wait_for(busy_reader.readuntil(b"\r\n\r\n"), 5.0)
        assert head.startswith(b"HTTP/1.1 200")
        for writer in (busy, refused):
            writer.close()


async def test_bodies_sent_slowly_from_many_addresses_do_not_keep_new_connections_out(
        tls: Tls, policy_dir: Path, shared_dir: Path) -> None:
    """A request whose body is still coming is not served yet: past the share of unserved
    connections, a new connection displaces the one that has waited longest."""
    fixture = load_fixture(shared_dir, "pod-create-worker.json")
    async with running(tls, [policy_dir], max_connections=4, reserved_connections=1,
                       header_timeout=30.0, body_timeout=30.0) as srv:
        slow = []
        for i in range(4):  # each from its own address, each its body's first byte only
            slow.append(await _from(f"127.0.0.{2 + i}", srv.port, tls))
            slow[-1][1].write(_headers(1000) + b"{")
            await asyncio.sleep(0.05)
        async with client(tls) as s:
            assert (await review(s, f"{srv.url}/mutate/pods", fixture))["allowed"] is True
        assert [await _closed(r) for r, _ in slow[:2]] == [True, True]  # the oldest two
        assert metric(srv, "muster_admission_connections_closed_total", listener="admission",
                      reason="limit") == 0
        for _, writer in slow:
            writer.close()


async def test_unserved_connections_never_displace_served_ones(
        tls: Tls, policy_dir: Path, shared_dir: Path) -> None:
    """The reserve: connections still in their handshake or first headers hold at most
    max_connections - reserved slots; past that a new one displaces the oldest of them, so a
    flood of them neither refuses new clients nor closes the kept-alive ones."""
    fixture = load_fixture(shared_dir, "pod-create-worker.json")
    body = json.dumps(fixture).encode()
    async with running(tls, [policy_dir], max_connections=6, reserved_connections=2,
                       header_timeout=30.0) as srv:
        kept = []
        for _ in range(2):
            kept.append(await _tls(tls, srv.port))
            assert await _exchange(kept[-1], body) == b"HTTP/1.1 200 OK"
        flood = [await _from(f"127.0.0.{3 + i % 4}", srv.port) for i in range(12)]
        assert await _gauge_settles(srv, 6, listener="admission") == 6
        async with client(tls) as s:
            assert (await review(s, f"{srv.url}/mutate/pods", fixture))["allowed"] is True
        for stream in kept:
            assert await _exchange(stream, body) == b"HTTP/1.1 200 OK"
        assert metric(srv, "muster_admission_connections_closed_total", listener="admission",
                      reason="pending_evicted") == 12 - 4 + 1
        assert metric(srv, "muster_admission_connections_closed_total", listener="admission",
                      reason="idle_evicted") == 0
        for _, writer in (*kept, *flood):
            writer.close()


async def test_the_metrics_port_caps_its_connections_and_times_out_headers(
        tls: Tls, policy_dir: Path) -> None:
    """Security review #54: 3,000 half-sent requests to the metrics port stayed open."""
    async with running(tls, [policy_dir], metrics_port=0, metrics_host="127.0.0.1",
                       metrics_max_connections=4, header_timeout=1.0) as srv:
        half_sent = [await _from(f"127.0.0.{2 + i % 5}", srv.metrics_port or 0)
                     for i in range(10)]
        for _, writer in half_sent:
            writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        assert await _gauge_settles(srv, 4, listener="metrics") <= 4
        async with aiohttp.ClientSession() as s, s.get(srv.metrics_url) as resp:
            assert resp.status == 200
        assert [await _closed(r) for r, _ in half_sent] == [True] * 10
        assert await _gauge_settles(srv, 0, listener="metrics") == 0
        assert metric(srv, "muster_admission_connections_closed_total", listener="metrics",
                      reason="header_timeout") >= 1
        for _, writer in half_sent:
            writer.close()
