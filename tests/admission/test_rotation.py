"""Certificate files replaced while a load runs: zero failed requests, new handshakes get the new
pair, open connections keep going."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path
from typing import Any

import aiohttp
from admission_helpers import Tls, load_fixture, running
from cryptography import x509


async def _handshake_serial(port: int, ctx: ssl.SSLContext) -> int:
    """Serial number of the certificate a new TLS handshake is served."""
    _reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
    obj: ssl.SSLObject = writer.get_extra_info("ssl_object")
    der = obj.getpeercert(binary_form=True)
    writer.close()
    await writer.wait_closed()
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


async def test_rotation_under_load_drops_nothing(tls: Tls, policy_dir: Path,
                                                 shared_dir: Path) -> None:
    body = load_fixture(shared_dir, "pod-create-worker.json")
    failures: list[str] = []
    served: set[int] = set()
    done = asyncio.Event()
    count = 0

    async def load(session: aiohttp.ClientSession, url: str) -> None:
        nonlocal count
        while not done.is_set():
            try:
                async with session.post(url, json=body) as resp:
                    answer: dict[str, Any] = await resp.json()
                    if resp.status != 200 or answer["response"]["allowed"] is not True:
                        failures.append(f"{resp.status}: {answer}")
            except (aiohttp.ClientError, OSError) as exc:
                failures.append(repr(exc))
            count += 1

    async def probe(port: int, ctx: ssl.SSLContext) -> None:
        while not done.is_set():
            try:
                served.add(await _handshake_serial(port, ctx))
            except (OSError, ssl.SSLError) as exc:
                failures.append(f"handshake: {exc!r}")
            await asyncio.sleep(0.01)

    async def rotate() -> list[int]:
        serials = []
        for i in range(8):
            await asyncio.sleep(0.15)
            if i % 2:
                pair = tls.rotate()  # atomic renames, as a Secret volume update does
            else:
                # a non-atomic writer: cert first, key a moment later (a mismatched pair that
                # must be refused until both are in place)
                pair = await tls.rotate_in_two_steps(gap=0.05)
            serials.append(x509.load_pem_x509_certificate(pair.cert_pem).serial_number)
        await asyncio.sleep(0.3)
        done.set()
        return serials

    async with running(tls, [policy_dir]) as srv:
        url = f"{srv.url}/mutate/pods?timeout=5s"
        ctx = tls.client_context()
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(
                ssl=ctx, force_close=True)) as fresh, aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=ctx, limit=10)) as kept:
            results = await asyncio.gather(rotate(), probe(srv.port, ctx),
                                           *(load(fresh, url) for _ in range(10)),
                                           *(load(kept, url) for _ in range(10)))
    written: list[int] = results[0]
    assert failures == [], failures[:5]
    assert count > 200, count
    assert written[-1] in served  # the last pair reached new handshakes
    assert len(served & set(written)) >= 3  # and so did several in between
