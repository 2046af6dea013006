"""Muster's binder against the real kube-scheduler, on the same real kube-apiserver.

    sudo .venv/bin/python bench/bench_scheduler.py [--nodes 500] [--gangs 100] [--rate 100]
        [--rounds 2] [--variants kube-scheduler,kube-scheduler-qps1000,muster,...]

etcd and kube-apiserver (the real tier's binaries, built from the Go module proxy at the pinned
release; `MUSTER_K8S_VERSION` picks another, `MUSTER_K8S_BIN` takes your own) run in a network
and PID namespace of their own (`unshare`; everything listens on that namespace's 127.0.0.1
and dies with it). No kubelet: `--nodes` fake Node objects, each a DGX-1 V100 (8 `nvidia.com/gpu`
allocatable, its topology annotation, the GPU taint), created
through the API. The pods are bench_binder's jobs: 4 workers x 1 GPU and a 0-GPU launcher.

- `kube-scheduler`: the real binary, its defaults (client QPS 50, burst 100), places the jobs'
  pods as plain pods, one by one (no gang annotations, `schedulerName: default-scheduler`);
- `kube-scheduler-qps1000`: the same with `--kube-api-qps 1000 --kube-api-burst 1000`, as busy
  clusters run it;
- `muster`: `muster bind` places the same pods as gangs (one Binding per pod, all of a gang's at
  once, each carrying the pod's GPU assignment and the gang's record);
- `coscheduling`, `coscheduling-qps1000`: the fair rival, a gang scheduler: scheduler-plugins'
  kube-scheduler with the coscheduling plugin (`e2e.node.schedulers`, built from the module proxy
  on Kubernetes 1.34), at the binary's default QPS and at 1000, places the same pods as gangs of
  the same size: each job a `scheduling.x-k8s.io` PodGroup (minMember 5, the minResources Muster
  writes) and the pods labelled into it. It is built on 1.34: run it with
  `MUSTER_K8S_VERSION=v1.34.4` (a kube-scheduler may be one minor older than its API server, no
  more), and compare the variants of the same run.
- `volcano`: the other gang scheduler, Volcano's scheduler (`e2e.node.schedulers`, v1.10.0, the
  newest release the module proxy serves) as its Helm chart runs it (its scheduler
  configuration read from the module; client QPS 2000 and a 1 s scheduling period, its
  defaults), places the same pods as gangs of the same size: each job a
  `scheduling.volcano.sh` PodGroup in queue `default` (minMember 5, the minResources Muster
  writes), the pods annotated into it. Only the scheduler runs: the PodGroups and the open
  queue are made here, as Muster's webhook and Volcano's controller would leave them.

Each runs as its own process, alone, started for its run and stopped after it. Two figures per run,
the pods deleted (grace 0) between runs, the variants in a rotated order per round:

1. burst: every pod exists, then the scheduler starts; pods bound per second from its first write
   (a Binding) to its last Binding, seen on one watch;
2. arrival: the scheduler runs (3 s to sync), pods are created at `--rate` pods/s, a job's pods one
   after another; per job, the time from its last pod created to its last pod bound (p50, p99).

For Muster's arrival runs the binder's own stage breakdown follows (bench_binder.stage_breakdown:
queued, plan, Bindings, from its /metrics).

Ratios are Muster's against each kube-scheduler variant per round, median over rounds. Target:
Muster's gang binding at least as fast as kube-scheduler's pod-by-pod binding.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.bench_binder import NS, BindWatch, gang_pods, node, pct, stage_breakdown  # noqa: E402
from bench.bench_serve import free_port  # noqa: E402
from e2e.node import schedulers, versions  # noqa: E402
from e2e.node.assets import binaries, missing_prerequisites  # noqa: E402
from e2e.node.cluster import write_pki  # noqa: E402
from e2e.node.kubectl import SHARED_CRDS  # noqa: E402
from webhook import keys  # noqa: E402
from webhook.demo.scenario import volcano_queue  # noqa: E402
from webhook.kube import (  # noqa: E402
    COSCHEDULING_PODGROUPS,
    CRDS,
    EVENTS,
    NAMESPACES,
    NODES,
    PODS,
    VOLCANO_PODGROUPS,
    VOLCANO_QUEUES,
    KubeApi,
    make_api_client,
)
from webhook.kube.api import Resource  # noqa: E402
from webhook.quantity import milli, parse_quantity, units  # noqa: E402
from webhook.topology import builtin, encode  # noqa: E402

INNER = "MUSTER_BENCH_SCHEDULER_INNER"
API = "https://127.0.0.1:6443"
VARIANTS = ("kube-scheduler", "kube-scheduler-qps1000", "muster", "coscheduling",
            "coscheduling-qps1000", "volcano")
COSCHEDULING = ("coscheduling", "coscheduling-qps1000")
MUSTER_ONLY = (keys.ANN_GANG_NAME, keys.ANN_GANG_MIN_MEMBER, keys.ANN_GPU_TOPOLOGY)
SERVICE_ACCOUNTS = Resource("", "v1", "serviceaccounts", True, "ServiceAccount")


# --- the control plane (inside the namespaces) -----------------------------------------------

class ControlPlane:
    def __init__(self, work: Path, bins: dict[str, str]) -> None:
        self.work, self.bin = work, bins
        self.token = os.urandom(16).hex()
        self.kubeconfig = work / "admin.kubeconfig"
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        pki = self.work / "pki"
        write_pki(pki)
        (pki / "tokens.csv").write_text(f'{self.token},bench-admin,1,"system:masters"\n')
        self.kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "bench",
            "clusters": [{"name": "bench", "cluster": {
                "server": API, "certificate-authority": str(pki / "ca.crt")}}],
            "users": [{"name": "admin", "user": {"token": self.token}}],
            "contexts": [{"name": "bench", "context": {"cluster": "bench", "user": "admin"}}]}))
        self.spawn("etcd", self.bin["etcd"], "--data-dir", str(self.work / "etcd"),
                   "--listen-client-urls", "http://127.0.0.1:2379",
                   "--advertise-client-urls", "http://127.0.0.1:2379",
                   "--listen-peer-urls", "http://127.0.0.1:2380",
                   "--listen-metrics-urls", "http://127.0.0.1:2381",
                   "--unsafe-no-fsync", "--log-level", "warn")
        self.spawn("kube-apiserver", self.bin["kube-apiserver"],
                   "--etcd-servers", "http://127.0.0.1:2379",
                   "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
                   # no kubernetes Service endpoint to keep: 1.37 refuses a loopback one
                   "--endpoint-reconciler-type", "none",
                   "--secure-port", "6443",
                   "--tls-cert-file", str(pki / "apiserver.crt"),
                   "--tls-private-key-file", str(pki / "apiserver.key"),
                   "--client-ca-file", str(pki / "ca.crt"),
                   "--token-auth-file", str(pki / "tokens.csv"),
                   "--authorization-mode", "RBAC",
                   "--service-account-issuer", "https://kubernetes.default.svc",
                   "--service-account-key-file", str(pki / "sa.pub"),
                   "--service-account-signing-key-file", str(pki / "sa.key"),
                   "--service-cluster-ip-range", "10.96.0.0/16",
                   "--profiling=false", "--v=1")
        ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        deadline = time.monotonic() + 120
        while True:
            try:
                req = urllib.request.Request(f"{API}/readyz",
                                             headers={"Authorization": f"Bearer {self.token}"})
                with urllib.request.urlopen(req, context=ctx, timeout=2) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                raise SystemExit("the control plane did not start:\n" + self.logs())
            time.sleep(0.3)

    def spawn(self, name: str, *argv: str) -> None:
        log = (self.work / f"{name}.log").open("ab")
        self.procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                           stdin=subprocess.DEVNULL))

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}"
                         for p in sorted(self.work.glob("*.log")))

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.terminate()
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(10)


@contextlib.asynccontextmanager
async def scheduler(variant: str, bins: dict[str, str], kubeconfig: Path,
                    log: Path) -> AsyncIterator[str | None]:
    """The variant's scheduler as a process, for the duration of the block; yields Muster's
    /metrics URL (None for kube-scheduler)."""
    metrics = None
    if variant == "muster":
        port = free_port()
        metrics = f"http://127.0.0.1:{port}/metrics"
        argv = [sys.executable, "-m", "webhook", "--log-level", "warning", "bind",
                "--kubeconfig", str(kubeconfig), "--metrics-port", str(port)]
    elif variant == "volcano":
        chart = schedulers.module_dir("volcano.sh/volcano", versions.VOLCANO) / \
            schedulers.VOLCANO_CHART
        argv = [str(schedulers.build_volcano() / "scheduler"), f"--kubeconfig={kubeconfig}",
                "--leader-elect=false", "--logtostderr", "-v=1",
                f"--scheduler-conf={chart / 'config' / 'volcano-scheduler.conf'}",
                "--listen-address=127.0.0.1:8080", "--healthz-address=127.0.0.1:11251"]
    elif variant in COSCHEDULING:
        config = log.with_suffix(".yaml")
        config.write_text(json.dumps(schedulers.coscheduling_config(
            kubeconfig, schedulers.COSCHEDULING_NAME,
            qps=1000 if variant.endswith("qps1000") else None)))
        argv = [str(schedulers.build_coscheduling()), "--config", str(config),
                "--bind-address", "127.0.0.1", "--v=1"]
    else:
        argv = [bins["kube-scheduler"], "--kubeconfig", str(kubeconfig), "--leader-elect=false",
                "--bind-address", "127.0.0.1", "--v=1"]
        if variant == "kube-scheduler-qps1000":
            argv += ["--kube-api-qps", "1000", "--kube-api-burst", "1000"]
    with log.open("ab") as out:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=out, stderr=out, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        yield metrics
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 15)
            except TimeoutError:
                proc.kill()
                await proc.wait()


# --- the jobs --------------------------------------------------------------------------------

def job_pods(g: int, variant: str) -> list[dict[str, Any]]:
    """bench_binder's job g; for kube-scheduler, the same pods without Muster's gang (plain);
    for coscheduling and Volcano, in the job's PodGroup (`pod_group`) instead."""
    pods = gang_pods(g)
    if variant != "muster":
        for p in pods:
            ann = p["metadata"]["annotations"]
            for key in MUSTER_ONLY:
                ann.pop(key, None)
            p["spec"]["schedulerName"] = "default-scheduler"
            if variant in COSCHEDULING:
                p["metadata"]["labels"][keys.COSCHEDULING_GROUP_LABEL] = f"job-{g:04d}"
                p["spec"]["schedulerName"] = schedulers.COSCHEDULING_NAME
            if variant == "volcano":
                ann[keys.VOLCANO_GROUP_ANNOTATION] = f"job-{g:04d}"
                p["spec"]["schedulerName"] = "volcano"
    return pods


def pod_group(g: int, volcano: bool = False) -> dict[str, Any]:
    """Job g's coscheduling or Volcano PodGroup as Muster writes it (minMember: every pod;
    minResources: the sum of their requests, a limit standing for a missing request; Volcano's
    in queue `default`)."""
    nanos: dict[str, int] = {}
    for p in gang_pods(g):
        for c in p["spec"]["containers"]:
            wanted = {**c["resources"].get("limits", {}), **c["resources"].get("requests", {})}
            for k, v in wanted.items():
                nanos[k] = nanos.get(k, 0) + parse_quantity(v)[0]
    total = {k: f"{milli(n)}m" if k == "cpu" else str(units(n)) for k, n in nanos.items()}
    spec: dict[str, Any] = {"minMember": 5, "minResources": total}
    if volcano:
        return {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
                "metadata": {"name": f"job-{g:04d}"}, "spec": {**spec, "queue": "default"}}
    return {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
            "metadata": {"name": f"job-{g:04d}"}, "spec": spec}


async def served_crd(kube: KubeApi, name: str) -> None:
    """A CRD the real tier installs (../shared/crds/`name`.yaml), served."""
    crd = yaml.safe_load((SHARED_CRDS / f"{name}.yaml").read_text())
    await kube.create(CRDS, crd)
    for _ in range(100):
        got = await kube.get(CRDS, crd["metadata"]["name"])
        if any(c["type"] == "Established" and c["status"] == "True"
               for c in got.get("status", {}).get("conditions") or []):
            return
        await asyncio.sleep(0.1)
    raise SystemExit(f"the CRD {name} was not established")


def volcano_chart_crds() -> list[dict[str, Any]]:
    """The CRDs of Volcano's chart (read from its module) other than the PodGroup and Queue
    ones the real tier installs."""
    chart = schedulers.module_dir("volcano.sh/volcano", versions.VOLCANO) / \
        schedulers.VOLCANO_CHART
    files = sorted((chart / "crd" / "bases").glob("*.yaml")) + sorted(
        (chart / "charts" / "jobflow" / "crd" / "bases").glob("*.yaml"))
    return schedulers.volcano_crds([yaml.safe_load(f.read_text()) for f in files],
                                   {"podgroups.scheduling.volcano.sh",
                                    "queues.scheduling.volcano.sh"})


def ready_node(name: str, annotation: str) -> dict[str, Any]:
    n = node(name, annotation)
    n["status"]["conditions"] = [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                  "message": "fake node (bench)"}]
    return n


async def create_all(kube: KubeApi, objs: list[dict[str, Any]], resource: Resource,
                     namespace: str | None = None) -> None:
    sem = asyncio.Semaphore(16)

    async def one(obj: dict[str, Any]) -> None:
        async with sem:
            await kube.create(resource, obj, namespace)

    await asyncio.gather(*(one(o) for o in objs))


async def delete_pods(kube: KubeApi) -> None:
    """Every pod of the namespace, at once (grace 0: no kubelet will confirm)."""
    sem = asyncio.Semaphore(16)

    async def one(name: str) -> None:
        async with sem:
            await kube.request("DELETE", PODS.path(NS, name), body={
                "kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0})

    while names := [p["metadata"]["name"] for p in (await kube.list(PODS, NS))["items"]]:
        await asyncio.gather(*(one(n) for n in names), return_exceptions=True)
        await asyncio.sleep(0.5)


async def why_pending(kube: KubeApi) -> str:
    """The last scheduling events of the namespace, for a run that did not finish."""
    events = (await kube.list(EVENTS, NS))["items"][-5:]
    return "\n".join(f"  {e.get('reason')}: {e.get('message')}" for e in events) or "  no events"


async def burst(kube: KubeApi, args: argparse.Namespace, variant: str, env: Env) -> float:
    pods = [p for g in range(args.gangs) for p in job_pods(g, variant)]
    await create_all(kube, pods, PODS, NS)
    watch = BindWatch(kube)
    await watch.start()
    try:
        async with scheduler(variant, env.bins, env.kubeconfig, env.log(variant)):
            ok = await watch.wait_for(len(pods), args.timeout)
    finally:
        await watch.stop()
    if not ok:
        raise SystemExit(f"{variant} burst: {len(watch.bound)}/{len(pods)} bound in "
                         f"{args.timeout:g} s; see {env.log(variant)}\n{await why_pending(kube)}")
    first = min(watch.bound.values())
    await delete_pods(kube)
    return len(pods) / max(max(watch.bound.values()) - first, 1e-9)


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return str(resp.read().decode())


async def arrival(kube: KubeApi, args: argparse.Namespace, variant: str,
                  env: Env) -> tuple[list[float], str]:
    """Per job, its last pod created -> its last pod bound; Muster's stage breakdown ("" for
    kube-scheduler)."""
    watch = BindWatch(kube)
    last_created: dict[int, float] = {}
    stages = ""
    async with scheduler(variant, env.bins, env.kubeconfig, env.log(variant)) as metrics:
        await asyncio.sleep(3.0)  # start-up and informer sync: latency, not start-up, is measured
        await watch.start()
        try:
            t0, n = time.perf_counter(), 0
            for g in range(args.gangs):
                for p in job_pods(g, variant):
                    n += 1
                    delay = t0 + n / args.rate - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    await kube.create(PODS, p, NS)
                last_created[g] = time.perf_counter()
            ok = await watch.wait_for(args.gangs * 5, args.timeout)
            if ok and metrics is not None:
                stages = stage_breakdown(await asyncio.to_thread(scrape, metrics))
        finally:
            await watch.stop()
    if not ok:
        raise SystemExit(f"{variant} arrival: {len(watch.bound)}/{args.gangs * 5} bound\n"
                         f"{await why_pending(kube)}")
    latencies = [max(watch.bound[p["metadata"]["name"]] for p in job_pods(g, variant))
                 - last_created[g] for g in range(args.gangs)]
    await delete_pods(kube)
    return latencies, stages


class Env:
    def __init__(self, bins: dict[str, str], kubeconfig: Path, work: Path) -> None:
        self.bins, self.kubeconfig, self.work = bins, kubeconfig, work

    def log(self, variant: str) -> Path:
        return self.work / f"{variant}.log"


async def bench(args: argparse.Namespace, env: Env) -> None:
    client = await make_api_client(str(env.kubeconfig))
    kube = KubeApi(client)
    try:
        await kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace",
                                       "metadata": {"name": NS}})
        await kube.create(SERVICE_ACCOUNTS, {"apiVersion": "v1", "kind": "ServiceAccount",
                                             "metadata": {"name": "default"}}, NS)
        annotation = encode(builtin("dgx1-v100"))
        nodes = [ready_node(f"dgx-{n:05d}", annotation) for n in range(args.nodes)]
        await create_all(kube, nodes, NODES)
        # the API server taints a new node not-ready (TaintNodesByCondition) until the node
        # controller sees it Ready; there is none here, so the taint goes as it would
        await asyncio.gather(*(kube.patch(NODES, n["metadata"]["name"], {
            "spec": {"taints": n["spec"]["taints"]}}) for n in nodes))
        if set(args.variants) & set(COSCHEDULING):
            await served_crd(kube, "scheduler-plugins-podgroups")
            await create_all(kube, [pod_group(g) for g in range(args.gangs)],
                             COSCHEDULING_PODGROUPS, NS)
        if "volcano" in args.variants:
            for crd in ("volcano-queues", "volcano-podgroups"):
                await served_crd(kube, crd)
            # the scheduler's informers wait for every CRD of its chart (numatopologies, ...)
            for doc in volcano_chart_crds():
                await kube.create(CRDS, doc)
            queue = volcano_queue("default")
            await kube.create(VOLCANO_QUEUES, queue)
            await kube.patch(VOLCANO_QUEUES, "default", {"status": queue["status"]},
                             subresource="status")
            await create_all(kube, [pod_group(g, volcano=True) for g in range(args.gangs)],
                             VOLCANO_PODGROUPS, NS)
        sample = await kube.get(NODES, "dgx-00000")
        assert sample["status"]["allocatable"][keys.GPU_RESOURCE] == "8", sample["status"]
        assert sample["spec"]["taints"] == nodes[0]["spec"]["taints"], sample["spec"]
        print(f"{args.gangs} jobs ({args.gangs * 5} pods: 4 workers x 1 GPU + launcher) on "
              f"{args.nodes} fake DGX-1 V100 nodes; real kube-apiserver {versions.kubernetes()} + "
              f"etcd {versions.ETCD}",
              flush=True)
        rates: dict[str, list[float]] = {v: [] for v in args.variants}
        lat: dict[str, list[list[float]]] = {v: [] for v in args.variants}
        for r in range(args.rounds):
            k = r % len(args.variants)
            for v in args.variants[k:] + args.variants[:k]:
                rates[v].append(await burst(kube, args, v, env))
                latencies, stages = await arrival(kube, args, v, env)
                lat[v].append(latencies)
                print(f"  round {r + 1} {v:23} burst {rates[v][-1]:7.1f} pods/s; arrival at "
                      f"{args.rate:g} pods/s: p50 {pct(lat[v][-1], 0.5) * 1e3:6.0f} ms, "
                      f"p99 {pct(lat[v][-1], 0.99) * 1e3:6.0f} ms", flush=True)
                if stages:
                    print(f"  inside the binder, per job (its /metrics):\n{stages}", flush=True)
        report(args, rates, lat)
    finally:
        await client.close()


def report(args: argparse.Namespace, rates: dict[str, list[float]],
           lat: dict[str, list[list[float]]]) -> None:
    print(f"\nmedian over {args.rounds} rounds (burst: pods/s bound; arrival: last pod created "
          "-> last pod bound, per job):")
    for v in args.variants:
        every = [x for run in lat[v] for x in run]
        print(f"  {v:23} {statistics.median(rates[v]):7.1f} pods/s   p50 "
              f"{pct(every, 0.5) * 1e3:6.0f} ms   p99 {pct(every, 0.99) * 1e3:6.0f} ms")
    if "muster" not in args.variants:
        return
    for v in args.variants:
        if v == "muster":
            continue
        thr = statistics.median(m / k for m, k in zip(rates["muster"], rates[v], strict=True))
        p99 = statistics.median(pct(m, 0.99) / pct(k, 0.99)
                                for m, k in zip(lat["muster"], lat[v], strict=True))
        verdict = "met" if thr >= 1.0 and p99 <= 1.0 else "NOT met"
        print(f"  muster / {v}: throughput {thr:.2f}x, arrival p99 {p99:.2f}x "
              f"(target: throughput >= 1, p99 <= 1: {verdict})")


def inner(args: argparse.Namespace) -> int:
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    bins = {k: str(v) for k, v in binaries().items()}
    work = Path(tempfile.mkdtemp(prefix="bench-sched-"))
    plane = ControlPlane(work, bins)
    try:
        plane.start()
        asyncio.run(bench(args, Env(bins, plane.kubeconfig, work)))
    finally:
        plane.stop()
        if args.keep:
            print(f"logs kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--gangs", type=int, default=100, help="jobs of 5 pods")
    parser.add_argument("--rate", type=float, default=100.0, help="pods created per second")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--variants", type=lambda s: s.split(","), default=list(VARIANTS),
                        help=f"comma-separated, of {', '.join(VARIANTS)}")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds a run may take to bind every pod")
    parser.add_argument("--keep", action="store_true", help="keep the work directory and logs")
    args = parser.parse_args()
    unknown = set(args.variants) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown variants: {', '.join(sorted(unknown))}")
    if os.environ.get(INNER) == "1":
        return inner(args)
    why = missing_prerequisites()
    if why is not None:
        raise SystemExit(f"bench_scheduler: {why}")
    binaries()  # built (once) here, where the Go module proxy is reachable
    if set(args.variants) & set(COSCHEDULING):
        minor = int(versions.kubernetes().split(".")[1])
        built_on = versions.SCHEDULER_PLUGINS_KUBERNETES
        if minor - int(built_on.split(".")[1]) not in (0, 1):
            parser.error(f"the coscheduling variants are built on Kubernetes {built_on}: run "
                         f"them with MUSTER_K8S_VERSION={built_on}")
        schedulers.build_coscheduling()
    if "volcano" in args.variants:
        schedulers.build_volcano()
    # a network and PID namespace of its own: every address is its 127.0.0.1, and every process
    # (etcd, kube-apiserver, the schedulers) dies with it
    return subprocess.call(
        ["unshare", "--net", "--pid", "--fork", "--mount-proc", "--kill-child=SIGTERM",
         sys.executable, __file__, *sys.argv[1:]], env={**os.environ, INNER: "1"})


if __name__ == "__main__":
    sys.exit(main())
