"""The binder through the emulator: throughput, gang latency at a fixed arrival rate, memory.

Run: .venv/bin/python bench/bench_binder.py [--nodes 500] [--gangs 200] [--rate 100]
     [--rss-nodes 5000 16384] [--rounds 3] [--only burst|arrival|memory]

Reference jobs (4 workers x 1 GPU + a 0-GPU launcher, minMember 5) on DGX-1 V100 nodes, each
node publishing its own GPU UUIDs as real nodes do (so each has its own Topology). The
binder runs as its own process (`muster bind`), exactly as deployed; the emulator, the pod
creator and a watch that timestamps bindings share this process.

1. burst: all pods exist, then the binder starts; pods bound per second from its first Binding
   seen on the watch to its last. Baseline in the same run, measured the same way: a "null
   binder" doing only the API writes the binder must do (one Binding per pod carrying its
   assignment and the gang's record, gangs concurrently, no planning), in its own process as
   the binder is, against a fresh emulator with the same cluster. Rounds alternate which goes
   first; the ratio (median of per-round ratios) is the share of the API ceiling reached.
2. arrival: pods created at --rate pods/s, members of a gang one after another; per gang, the
   time from its last pod's creation to its last Binding seen on the watch (p50/p99/max).
   Target p99 < 1 s at 100 pods/s. Then where that time went inside the binder, from its
   /metrics: muster_binder_gang_stage_duration_seconds (queued, plan, bind) and the
   cycles it ran; the rest of the end-to-end time is the watch's delivery to the binder and
   to this process.
3. memory: binder resident set (VmRSS, and peak VmHWM) with --rss-nodes nodes after binding
   the same gangs (5,000 and 16,384 nodes by default). Target < 500 MiB at 5,000 nodes.

Every binder run checks where the pods went: each gang on one node, each worker with a GPU
assignment naming that node and one GPU no other pod on the node holds. The bench fails with
the first pod that breaks this (its work did not happen as intended), and when pods stay unbound.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from prometheus_client.parser import text_string_to_metric_families

from bench.bench_serve import free_port
from webhook import keys
from webhook.binder.assignment import decode_assignment, encode_record
from webhook.doubles.emulator import ApiServerEmulator
from webhook.kube import KubeApi, make_api_client
from webhook.kube.api import NODES, PODS
from webhook.topology import builtin, encode

REPO = Path(__file__).resolve().parent.parent
NS = "team-a"
TOPOLOGY = json.dumps({"v": 1, "mode": "required", "singleNode": True, "minRingGBps": None})


def node(name: str, annotation: str) -> dict[str, Any]:
    alloc = {"cpu": "80", "memory": "512Gi", "pods": "110", keys.GPU_RESOURCE: "8"}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name,
                                                  keys.LABEL_GPU_TOPOLOGY: "enabled"},
                         "annotations": {keys.ANN_NODE_TOPOLOGY: annotation}},
            "spec": {"taints": [{"key": keys.TAINT_GPU_TOPOLOGY, "value": "enabled",
                                 "effect": "NoSchedule"}]},
            "status": {"allocatable": alloc, "capacity": dict(alloc)}}


def gang_pods(g: int) -> list[dict[str, Any]]:
    name = f"job-{g:04d}"
    out = []
    for i, role in enumerate(["worker"] * 4 + ["launcher"]):
        gpu = role == "worker"
        limits = {keys.GPU_RESOURCE: "1"} if gpu else {}
        ann = {keys.ANN_GANG_NAME: name, keys.ANN_GANG_MIN_MEMBER: "5"}
        if gpu:
            ann[keys.ANN_GPU_TOPOLOGY] = TOPOLOGY
        out.append({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{name}-{role}-{i}", "namespace": NS, "annotations": ann,
                         "labels": {"training.kubeflow.org/job-name": name}},
            "spec": {"schedulerName": keys.DEFAULT_BINDER_SCHEDULER_NAME,
                     "tolerations": [{"key": keys.TAINT_GPU_TOPOLOGY, "operator": "Exists",
                                      "effect": "NoSchedule"}],
                     "containers": [{"name": "main", "image": "train:1", "resources": {
                         "requests": {"cpu": "4" if gpu else "500m",
                                      "memory": "16Gi" if gpu else "1Gi"},
                         "limits": limits}}]}})
    return out


def cluster(nodes: int) -> ApiServerEmulator:
    api = ApiServerEmulator(history=200_000, watch_buffer=200_000)
    api.seed({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    t = builtin("dgx1-v100")
    for n in range(nodes):  # each node its own UUIDs, as its agent publishes them
        own = dataclasses.replace(t, gpus=tuple(
            dataclasses.replace(g, uuid=f"GPU-{n:05d}-{g.index}") for g in t.gpus))
        api.seed(node(f"dgx-{n:05d}", encode(own)))
    return api


class BinderProcess:
    #: where the binder's log goes (--binder-log), None to discard it
    log_path: Path | None = None

    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig
        self.proc: asyncio.subprocess.Process | None = None
        self.metrics_port = free_port()

    async def start(self) -> None:
        log = open(self.log_path, "a") if self.log_path else None  # noqa: SIM115, ASYNC230
        try:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "webhook", "--log-level", "info" if log else "warning",
                "bind", "--kubeconfig", str(self.kubeconfig),
                "--metrics-port", str(self.metrics_port),
                env={**os.environ, "PYTHONPATH": str(REPO)},
                stdout=asyncio.subprocess.DEVNULL, stderr=log or asyncio.subprocess.DEVNULL)
        finally:
            if log is not None:
                log.close()

    async def scrape(self) -> str:
        """Its /metrics text (a blocking read in a thread: the emulator shares this loop)."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"

        def get() -> str:
            with urllib.request.urlopen(url, timeout=10) as resp:
                return str(resp.read().decode())
        return await asyncio.to_thread(get)

    def memory(self) -> dict[str, int]:
        assert self.proc is not None
        out = {}
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) * 1024
        return out

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.terminate()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.proc.wait(), 10)
            if self.proc.returncode is None:
                self.proc.kill()
                await self.proc.wait()


class BindWatch:
    """Timestamps the first time each pod is seen bound, from a real watch."""

    def __init__(self, kube: KubeApi) -> None:
        self.kube = kube
        self.bound: dict[str, float] = {}
        #: each pod as last seen
        self.pods: dict[str, dict[str, Any]] = {}
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        listed = await self.kube.list(PODS, NS)
        rv = listed["metadata"]["resourceVersion"]
        self.task = asyncio.create_task(self._run(rv))

    async def _run(self, rv: str) -> None:
        while True:
            async for kind, obj in self.kube.watch(PODS, NS, resource_version=rv,
                                                   timeout_seconds=3600):
                rv = obj["metadata"].get("resourceVersion") or rv
                if kind != "BOOKMARK":
                    self._see(obj)

    def _see(self, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        self.pods[name] = obj
        if (obj.get("spec") or {}).get("nodeName") and name not in self.bound:
            self.bound[name] = time.perf_counter()

    async def wait_for(self, count: int, limit: float) -> bool:
        deadline = time.perf_counter() + limit
        while len(self.bound) < count:
            if time.perf_counter() > deadline:
                return False
            await asyncio.sleep(0.02)
        return True

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)

    def check_placement(self, gangs: int) -> None:
        """Each gang on one node; each worker assigned one GPU of that node that no other pod
        there holds. SystemExit naming the first pod that is not."""
        held: dict[tuple[str, int], str] = {}
        for g in range(gangs):
            members = [p["metadata"]["name"] for p in gang_pods(g)]
            nodes = {(self.pods[m].get("spec") or {}).get("nodeName") for m in members}
            if len(nodes) != 1:
                raise SystemExit(f"placement check: gang job-{g:04d} is on nodes {nodes}")
            (node_name,) = nodes
            for m in members:
                if "-worker-" not in m:
                    continue
                text = (self.pods[m]["metadata"].get("annotations") or {}).get(
                    keys.ANN_GPU_ASSIGNMENT)
                if text is None:
                    raise SystemExit(f"placement check: worker {m} has no GPU assignment")
                a = decode_assignment(text)
                gpus = [i for c in a.containers.values() for i in c.indices]
                if a.node != node_name or len(gpus) != 1:
                    raise SystemExit(f"placement check: worker {m} on {node_name} is assigned "
                                     f"{gpus} on {a.node}")
                other = held.setdefault((node_name, gpus[0]), m)
                if other != m:
                    raise SystemExit(f"placement check: {m} and {other} both hold GPU "
                                     f"{gpus[0]} of {node_name}")


async def with_client(api: ApiServerEmulator, tmp: Path) -> tuple[Any, KubeApi, Path]:
    kubeconfig = api.write_kubeconfig(tmp / f"kubeconfig-{api.port}")
    client = await make_api_client(str(kubeconfig))
    return client, KubeApi(client), kubeconfig


async def create_all(kube: KubeApi, pods: list[dict[str, Any]], concurrency: int = 16) -> None:
    sem = asyncio.Semaphore(concurrency)

    async def one(p: dict[str, Any]) -> None:
        async with sem:
            await kube.create(PODS, p, NS)

    await asyncio.gather(*(one(p) for p in pods))


async def burst(nodes: int, gangs: int, tmp: Path, binder_class: type[BinderProcess]) -> float:
    """All pods exist, then `binder_class` starts as a process; pods bound per second from its
    first write (an assignment seen on the watch) to its last Binding."""
    pods = [p for g in range(gangs) for p in gang_pods(g)]
    async with cluster(nodes) as api:
        client, kube, kubeconfig = await with_client(api, tmp)
        try:
            await create_all(kube, pods)
            watch = BindWatch(kube)
            await watch.start()
            binder = binder_class(kubeconfig)
            await binder.start()
            try:
                ok = await watch.wait_for(len(pods), 120)
            finally:
                await binder.stop()
                await watch.stop()
        finally:
            await client.close()
    if not ok:
        raise SystemExit(f"burst: only {len(watch.bound)}/{len(pods)} pods bound in 120 s")
    if binder_class is BinderProcess:
        watch.check_placement(gangs)
    # from the binder's first write to its last: start-up and informer sync are not counted
    first, last = min(watch.bound.values()), max(watch.bound.values())
    return len(pods) / max(last - first, 1e-9)


async def null_writes(kubeconfig: Path) -> None:
    """The null binder's body (`--null-binder KUBECONFIG`, its own process as the binder is):
    list what a binder lists, then per gang bind every member with its assignment and the
    gang's record as annotations (what the binder's Bindings carry), gangs concurrently, no
    planning."""
    client = await make_api_client(str(kubeconfig))
    kube = KubeApi(client)
    try:
        nodes = sorted(n["metadata"]["name"] for n in (await kube.list(NODES))["items"])
        gangs: dict[str, list[dict[str, Any]]] = {}
        for p in (await kube.list(PODS, NS))["items"]:
            gangs.setdefault(p["metadata"]["annotations"][keys.ANN_GANG_NAME], []).append(p)
        sem = asyncio.Semaphore(64)

        async def gang(i: int, members: list[dict[str, Any]]) -> None:
            target = nodes[i % len(nodes)]
            names = sorted(m["metadata"]["name"] for m in members)
            record = encode_record(tuple((n, target, (g,)) for g, n in enumerate(names)))
            async with sem:
                await asyncio.gather(*(kube.bind(NS, m["metadata"]["name"], target,
                                                 uid=m["metadata"]["uid"], annotations={
                    keys.ANN_GPU_ASSIGNMENT: json.dumps({"v": 1, "node": target,
                                                         "containers": {}}),
                    keys.ANN_GANG_PLACEMENT: record}) for m in members))

        await asyncio.gather(*(gang(i, gangs[name]) for i, name in enumerate(sorted(gangs))))
    finally:
        await client.close()


class NullBinderProcess(BinderProcess):
    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--null-binder", str(self.kubeconfig),
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)


def quantile(buckets: list[tuple[float, float]], q: float) -> float:
    """histogram_quantile's linear interpolation within the bucket holding the q-quantile;
    `buckets` are (upper bound, cumulative count) ascending, +Inf last."""
    total = buckets[-1][1]
    if total == 0:
        return float("nan")
    rank, lower, below = q * total, 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if upper == float("inf"):
                return lower
            return lower + (upper - lower) * (rank - below) / max(count - below, 1e-9)
        lower, below = upper, count
    return lower


def stage_breakdown(text: str) -> str:
    """The binder's per-gang stages and cycles from its /metrics text: mean, and p50/p99 as
    estimated from the histogram's buckets, in ms."""
    stages: dict[str, dict[str, Any]] = {}
    cycles = {"count": 0.0, "sum": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if family.name == "muster_binder_gang_stage_duration_seconds":
                st = stages.setdefault(sample.labels["stage"], {"buckets": []})
                if sample.name.endswith("_bucket"):
                    st["buckets"].append((float(sample.labels["le"]), sample.value))
                else:
                    st[sample.name.rsplit("_", 1)[1]] = sample.value
            elif family.name == "muster_binder_cycle_duration_seconds" and \
                    sample.name[-4:] in ("ount", "_sum"):
                cycles["count" if sample.name.endswith("count") else "sum"] = sample.value
    lines = []
    for name in ("queued", "plan", "bind"):
        stage = stages.get(name)
        if stage is None or not stage.get("count"):
            continue
        lines.append(f"    {name:7} mean {stage['sum'] / stage['count'] * 1e3:6.1f} ms, p50 ~"
                     f"{quantile(stage['buckets'], 0.5) * 1e3:6.1f} ms, p99 ~"
                     f"{quantile(stage['buckets'], 0.99) * 1e3:6.1f} ms "
                     f"({stage['count']:.0f} gangs)")
    lines.append(f"    cycles  {cycles['count']:.0f}, mean "
                 f"{cycles['sum'] / max(cycles['count'], 1) * 1e3:.2f} ms, "
                 f"total {cycles['sum']:.2f} s")
    return "\n".join(lines)


async def arrival(nodes: int, gangs: int, rate: float, tmp: Path) -> tuple[list[float], str]:
    """Per gang, its last pod created -> its last Binding seen; and the binder's stages."""
    async with cluster(nodes) as api:
        client, kube, kubeconfig = await with_client(api, tmp)
        binder = BinderProcess(kubeconfig)
        watch = BindWatch(kube)
        try:
            await binder.start()
            await asyncio.sleep(3.0)  # let it import and sync: latency, not start-up, is measured
            await watch.start()
            last_created: dict[int, float] = {}
            interval = 1.0 / rate
            t0 = time.perf_counter()
            n = 0
            for g in range(gangs):
                for p in gang_pods(g):
                    n += 1
                    delay = t0 + n * interval - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    await kube.create(PODS, p, NS)
                last_created[g] = time.perf_counter()
            ok = await watch.wait_for(gangs * 5, 60)
            stages = stage_breakdown(await binder.scrape()) if ok else ""
        finally:
            await binder.stop()
            await watch.stop()
            await client.close()
    if not ok:
        raise SystemExit(f"arrival: only {len(watch.bound)}/{gangs * 5} pods bound")
    watch.check_placement(gangs)
    latencies = []
    for g in range(gangs):
        names = [p["metadata"]["name"] for p in gang_pods(g)]
        latencies.append(max(watch.bound[x] for x in names) - last_created[g])
    return latencies, stages


async def memory(nodes: int, gangs: int, tmp: Path) -> dict[str, int]:
    pods = [p for g in range(gangs) for p in gang_pods(g)]
    async with cluster(nodes) as api:
        client, kube, kubeconfig = await with_client(api, tmp)
        binder = BinderProcess(kubeconfig)
        watch = BindWatch(kube)
        try:
            await create_all(kube, pods)
            await watch.start()
            await binder.start()
            # its informers list every node first: minutes for 16,384 on a busy shared machine
            ok = await watch.wait_for(len(pods), 180 + nodes / 40)
            await asyncio.sleep(1.0)
            mem = binder.memory()
        finally:
            await binder.stop()
            await watch.stop()
            await client.close()
    if not ok:
        raise SystemExit(f"memory: only {len(watch.bound)}/{len(pods)} pods bound on {nodes} "
                         f"nodes in {180 + nodes / 40:.0f} s")
    watch.check_placement(gangs)
    return mem


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--gangs", type=int, default=200)
    parser.add_argument("--rate", type=float, default=100.0, help="pods created per second")
    parser.add_argument("--rss-nodes", type=int, nargs="+", default=[5000, 16384])
    parser.add_argument("--binder-log", type=Path, default=None,
                        help="append the binder processes' logs (info level) to this file")
    parser.add_argument("--only", choices=["burst", "arrival", "memory"], default=None)
    parser.add_argument("--rounds", type=int, default=3, help="burst rounds (binder, baseline)")
    parser.add_argument("--null-binder", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.null_binder is not None:
        await null_writes(args.null_binder)
        return 0
    BinderProcess.log_path = args.binder_log
    pods = args.gangs * 5
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        print(f"{args.gangs} gangs ({pods} pods: 4 workers x 1 GPU + launcher) on {args.nodes} "
              f"DGX-1 V100 nodes, binder as a process, emulator over HTTP")
        if args.only in (None, "burst"):
            rates: dict[str, list[float]] = {"null": [], "binder": []}
            for r in range(args.rounds):  # alternate who goes first: drift hits both
                order = ["null", "binder"] if r % 2 == 0 else ["binder", "null"]
                for who in order:
                    cls = NullBinderProcess if who == "null" else BinderProcess
                    rates[who].append(await burst(args.nodes, args.gangs, tmp, cls))
                print(f"  round {r + 1}: binder {rates['binder'][-1]:7.1f} pods/s, "
                      f"API-writes-only {rates['null'][-1]:7.1f} pods/s", flush=True)
            ratio = statistics.median(b / n for b, n in zip(rates["binder"], rates["null"],
                                                             strict=True))
            print(f"burst:    binder {statistics.median(rates['binder']):7.1f} pods/s bound; "
                  f"API-writes-only baseline (own process) "
                  f"{statistics.median(rates['null']):7.1f} pods/s; ratio {ratio:.2f} "
                  f"(median of {args.rounds} rounds)")
        if args.only in (None, "arrival"):
            lat, stages = await arrival(args.nodes, args.gangs, args.rate, tmp)
            verdict = "OK" if pct(lat, 0.99) < 1.0 else "ABOVE TARGET"
            print(f"arrival:  {args.rate:g} pods/s; last pod created -> last Binding per gang: "
                  f"p50 {pct(lat, 0.5) * 1000:.0f} ms, p99 {pct(lat, 0.99) * 1000:.0f} ms, "
                  f"max {max(lat) * 1000:.0f} ms, mean {statistics.mean(lat) * 1000:.0f} ms "
                  f"(target p99 < 1000 ms: {verdict})")
            print(f"  inside the binder, per gang (from its /metrics):\n{stages}")
        for size in args.rss_nodes if args.only in (None, "memory") else ():
            mem = await memory(size, args.gangs, tmp)
            rss, hwm = mem["VmRSS"] / 2**20, mem["VmHWM"] / 2**20
            verdict = "no target" if size > 5000 else "OK" if hwm < 500 else "ABOVE TARGET"
            print(f"memory:   {size} nodes, {pods} pods bound: binder RSS "
                  f"{rss:.0f} MiB, peak {hwm:.0f} MiB (target < 500 MiB at 5,000 nodes: "
                  f"{verdict})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
