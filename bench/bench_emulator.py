"""The API server emulator under bench-sized loads, each figure a ratio against a baseline
measured in the same run with the same client (kubernetes-asyncio via webhook.kube.KubeApi):

    .venv/bin/python bench/bench_emulator.py [--nodes 5000] [--pods 2000] [--watchers 5]
        [--rounds 5]

1. create: POST of N nodes, 50 in flight, vs. an aiohttp handler that only parses the body and
   echoes it with 201 (the least any server does).
2. list: GET of all N nodes vs. the same bytes served pre-built by a plain aiohttp handler.
3. watch fan-out: P pod creations with W watchers open on all pods; time until every watcher
   has seen the last event, vs. the same creations with no watcher.
Everything runs on one event loop in one process, as in tests and `muster demo`. Each round
has a fresh emulator and measures all three, the emulator and its baseline in alternating order
(the first round: emulator first); each ratio is the median of the per-round ratios (above 1:
the emulator is faster). The bench fails when a list or a watch misses objects.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from webhook.doubles.emulator import ApiServerEmulator  # noqa: E402
from webhook.kube import NAMESPACES, NODES, PODS, KubeApi, make_api_client  # noqa: E402


def node(i: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": f"node-{i:05d}", "labels": {"muster.io/gpu-topology": "enabled",
                                            "muster.io/gpu-model": "Tesla-V100-SXM2-16GB"},
        "annotations": {"muster.io/gpu-topology": "x" * 600}},
        "status": {"capacity": {"nvidia.com/gpu": "8", "cpu": "64"},
                   "allocatable": {"nvidia.com/gpu": "8", "cpu": "64"}}}


def pod(i: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": f"w-{i:05d}", "labels": {"training.kubeflow.org/job-name": f"job-{i // 8}"}},
        "spec": {"containers": [{"name": "main", "image": "tf:2.3",
                                 "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}


async def concurrently(n: int, inflight: int, fn: Callable[[int], Awaitable[Any]]) -> float:
    sem = asyncio.Semaphore(inflight)

    async def one(i: int) -> None:
        async with sem:
            await fn(i)

    start = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    return time.perf_counter() - start


async def baseline_server(list_body: list[bytes]) -> tuple[web.AppRunner, str]:
    """The echo (create) and static (list) baselines; `list_body[0]` is what the list serves."""
    async def echo(request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        return web.json_response(body, status=201)

    async def listing(_: web.Request) -> web.Response:
        return web.Response(body=list_body[0], content_type="application/json")

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/api/v1/nodes", echo)
    app.router.add_get("/api/v1/nodes", listing)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


async def client_for(url: str, tmp: Path, name: str) -> KubeApi:
    kc = tmp / name
    kc.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": url}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    return KubeApi(await make_api_client(str(kc)))


async def watch_until(kube: KubeApi, rv: str, count: int, ready: asyncio.Event) -> float:
    seen = 0
    stream = kube.watch(PODS, resource_version=rv, timeout_seconds=600, allow_bookmarks=False)
    ready.set()
    async for kind, _ in stream:
        if kind == "ADDED":
            seen += 1
            if seen == count:
                return time.perf_counter()
    raise SystemExit(f"watch: the stream ended after {seen} of {count} events")


async def timed(first: Callable[[], Awaitable[float]], second: Callable[[], Awaitable[float]],
                swap: bool) -> tuple[float, float]:
    """Both measurements, `second` first when `swap`: drift on a shared machine hits both."""
    if swap:
        b = await second()
        return await first(), b
    a = await first()
    return a, await second()


async def one_round(args: argparse.Namespace, tmp: Path, base: KubeApi, list_body: list[bytes],
                    swap: bool) -> dict[str, float]:
    """The three ratios (baseline time / emulator time) of one round, on a fresh emulator."""
    async with ApiServerEmulator(history=args.pods + 100) as api:
        emu = await client_for(api.url, tmp, f"emu-{api.port}")
        try:
            t_emu, t_base = await timed(
                lambda: concurrently(args.nodes, 50, lambda i: emu.create(NODES, node(i))),
                lambda: concurrently(args.nodes, 50, lambda i: base.request(
                    "POST", "/api/v1/nodes", body=node(i))), swap)
            listed = await emu.request("GET", "/api/v1/nodes")
            if len(listed["items"]) != args.nodes:
                raise SystemExit(f"list: {len(listed['items'])} of {args.nodes} nodes")
            list_body[0] = json.dumps(listed).encode()

            async def lists(kube: KubeApi) -> float:
                start = time.perf_counter()
                for _ in range(LISTS):
                    got = await kube.request("GET", "/api/v1/nodes")
                    if len(got["items"]) != args.nodes:
                        raise SystemExit(f"list: {len(got['items'])} of {args.nodes} nodes")
                return (time.perf_counter() - start) / LISTS

            t_list, t_list_base = await timed(lambda: lists(emu), lambda: lists(base), swap)
            sel = await emu.list(NODES, label_selector="muster.io/gpu-topology=enabled,"
                                 "muster.io/gpu-model in (Tesla-V100-SXM2-16GB)")
            if len(sel["items"]) != args.nodes:
                raise SystemExit(f"list by labels: {len(sel['items'])} of {args.nodes} nodes")

            await emu.create(NAMESPACES, {"metadata": {"name": "bench"}})
            half = args.pods // 2
            t_plain = await concurrently(half, 50, lambda i: emu.create(PODS, pod(i), "bench"))
            rv = str(api.store.rv)
            ready = [asyncio.Event() for _ in range(args.watchers)]
            watchers = [asyncio.create_task(watch_until(emu, rv, half, ready[w]))
                        for w in range(args.watchers)]
            await asyncio.gather(*(r.wait() for r in ready))
            await asyncio.sleep(0.2)  # the watch requests are open before the writes start
            start = time.perf_counter()
            t_written = await concurrently(half, 50, lambda i: emu.create(
                PODS, pod(half + i), "bench"))
            done = await asyncio.gather(*watchers)
        finally:
            await emu.client.close()
    print(f"  round (emulator {'second' if swap else 'first'}): create {args.nodes} nodes "
          f"{args.nodes / t_emu:6.0f}/s vs echo {args.nodes / t_base:6.0f}/s; list "
          f"{t_list * 1e3:6.1f} vs static {t_list_base * 1e3:6.1f} ms; {half} pods "
          f"{half / t_plain:5.0f}/s, with {args.watchers} watchers {half / t_written:5.0f}/s "
          f"(all seen {max(done) - start:.2f} s after the first write)", flush=True)
    return {"create": t_base / t_emu, "list": t_list_base / t_list,
            "watchers": t_plain / t_written}


#: GETs of the whole node list per round and server
LISTS = 5


async def main(args: argparse.Namespace) -> None:
    print(f"emulator bench: {args.nodes} nodes, {args.pods} pods, {args.watchers} watchers, "
          f"{args.rounds} rounds")
    list_body = [b"{}"]
    with tempfile.TemporaryDirectory(prefix="muster-bench-") as tmp_dir:
        tmp = Path(tmp_dir)
        runner, base_url = await baseline_server(list_body)
        base = await client_for(base_url, tmp, "base")
        try:
            ratios = [await one_round(args, tmp, base, list_body, swap=r % 2 == 1)
                      for r in range(args.rounds)]
        finally:
            await base.client.close()
            await runner.cleanup()
    for name, what in (("create", f"create {args.nodes} nodes vs echo"),
                       ("list", f"list {args.nodes} nodes vs static bytes"),
                       ("watchers", f"create {args.pods // 2} pods, {args.watchers} watchers "
                                    "vs none")):
        values = [r[name] for r in ratios]
        print(f"{what:42} ratio {statistics.median(values):.2f} "
              f"(rounds {min(values):.2f}-{max(values):.2f})")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS (client + emulator + baseline, {args.nodes} nodes, {args.pods} pods): "
          f"{rss:.0f} MiB")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--watchers", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5)
    asyncio.run(main(parser.parse_args()))
