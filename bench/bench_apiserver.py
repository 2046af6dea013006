"""Pod creates through a real kube-apiserver (the real tier's node and release), with four admission
set-ups, each answered over TLS from a process on the node's loopback:

- `none`: no webhook is called;
- `noop`: an aiohttp webhook that answers allowed with no patch;
- `static`: the same server answering Muster's own JSON Patch for these pods, unchanged. It is
  the API server's cost of calling a webhook and applying its patch, with no decision at all;
- `muster`: `muster serve` with a Volcano gang policy. It decides each pod and writes one
  PodGroup per job before answering.

    sudo .venv/bin/python bench/bench_apiserver.py [--pods 600] [--concurrency 16] [--rounds 3]

The pods are MPIJob workers (20 per job, the MPIJobs exist), with a scheduler that does not
exist, so nothing runs. Each round creates `--pods` pods per set-up into a fresh namespace. The
set-ups go in a rotated order each round, so drift on a shared machine hits every set-up.
Figures are the median over rounds of the ratio to `static` in the same round: throughput, and
p99 of the create latency that the client sees. CPU per admission is each webhook process's
user+system time over the pods it admitted.
Target (issue 12): muster >= 0.95x static's throughput, p99 <= 1.1x.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import ssl
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.bench_serve import free_port, local_tls, process, wait_ready  # noqa: E402
from e2e.node import image, versions  # noqa: E402
from e2e.node.assets import ensure_debian_packages, missing_prerequisites  # noqa: E402
from e2e.node.cluster import NodeCluster  # noqa: E402
from e2e.node.kubectl import crd_documents, kubectl, wait_established  # noqa: E402
from e2e.probes import open_volcano_queues  # noqa: E402
from webhook.kube import (  # noqa: E402
    MPIJOBS,
    MUTATING_WEBHOOKS,
    NAMESPACES,
    PODS,
    KubeApi,
    make_api_client,
)
from webhook.policy import operators  # noqa: E402

SETUPS = ("none", "noop", "static", "muster")
WORKERS_PER_JOB = 20
JOB = REPO.parent / "shared" / "fixtures" / "jobs" / "mpijob-vgg16-4workers.yaml"
POLICY = """\
apiVersion: muster.io/v1alpha1
kind: SchedulingPolicy
metadata: {name: bench-volcano}
spec:
  match:
    namespaceSelector: {matchLabels: {muster-bench: muster}}
    ownerKinds: [kubeflow.org/MPIJob]
  gang: {backend: volcano, minAvailable: auto, queue: default, minResources: auto}
"""


@dataclass
class Run:
    setup: str
    seconds: float
    latencies: list[float]
    cpu_seconds: float | None  # the webhook process's, over this run

    @property
    def throughput(self) -> float:
        return len(self.latencies) / self.seconds

    @property
    def p99(self) -> float:
        return statistics.quantiles(self.latencies, n=100)[98]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def configuration(setup: str, port: int, ca: bytes) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": f"bench-{setup}"},
        "webhooks": [{
            "name": f"{setup}.bench.muster.io",
            "clientConfig": {"url": f"https://127.0.0.1:{port}/mutate/pods",
                             "caBundle": base64.b64encode(ca).decode()},
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                       "resources": ["pods"], "scope": "Namespaced"}],
            "namespaceSelector": {"matchLabels": {"muster-bench": setup}},
            # a failed call fails the create: the bench must not count skipped admissions
            "failurePolicy": "Fail", "sideEffects": "NoneOnDryRun", "timeoutSeconds": 10,
            "admissionReviewVersions": ["v1"],
        }],
    }


def worker_pods(job: dict[str, Any]) -> list[dict[str, Any]]:
    pods = operators.mpi_worker_pods(job)
    for pod in pods:
        pod["spec"]["schedulerName"] = "bench-nobody"  # nothing is scheduled or run
    return pods


async def create_pods(kube: KubeApi, ns: str, count: int, concurrency: int
                      ) -> tuple[float, list[float]]:
    job = yaml.safe_load(JOB.read_text())
    job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] = WORKERS_PER_JOB
    pods: list[dict[str, Any]] = []
    for i in range((count + WORKERS_PER_JOB - 1) // WORKERS_PER_JOB):
        job["metadata"] = {"name": f"job-{i}", "namespace": ns}
        pods += worker_pods(await kube.create(MPIJOBS, job, namespace=ns))
    pods = pods[:count]
    latencies: list[float] = []
    queue = iter(pods)

    async def client() -> None:
        for pod in queue:
            start = time.perf_counter()
            await kube.create(PODS, pod, namespace=ns)
            latencies.append(time.perf_counter() - start)

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return time.perf_counter() - start, latencies


async def muster_patch(kube: KubeApi, url: str, cafile: Path) -> str:
    """Muster's own answer for these pods: one worker pod's AdmissionReview sent to `muster serve`
    (its MPIJob exists, so the decision is the real one); the patch, base64, as it came."""
    ns = "bench-patch"
    await kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace",
                                   "metadata": {"name": ns, "labels": {"muster-bench": "muster"}}})
    job = yaml.safe_load(JOB.read_text())
    job["metadata"] = {"name": "job-0", "namespace": ns}
    pod = worker_pods(await kube.create(MPIJOBS, job, namespace=ns))[0]
    pod["metadata"]["namespace"] = ns
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "bench", "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "name": pod["metadata"]["name"], "namespace": ns, "operation": "CREATE",
        "userInfo": {"username": "bench"}, "object": pod, "dryRun": False}}
    ctx = ssl.create_default_context(cafile=str(cafile))
    async with aiohttp.ClientSession() as http, http.post(
            f"{url}/mutate/pods", json=review, ssl=ctx) as resp:
        answer = await resp.json()
    patch: str = answer["response"]["patch"]
    return patch


async def bench(cluster: NodeCluster, args: argparse.Namespace, work: Path) -> dict[str, list[Run]]:
    cafile = local_tls(work)
    ca = cafile.read_bytes()
    (work / "policies").mkdir()
    (work / "policies" / "bench.yaml").write_text(POLICY)
    ports = {s: free_port() for s in SETUPS[1:]}
    metrics_port = free_port()
    patch_file = work / "patch.b64"
    serve = [sys.executable, str(REPO / "bench" / "bench_serve.py"), "--noop-server"]
    tls = [str(work / "tls.crt"), str(work / "tls.key")]
    client = await make_api_client(str(cluster.kubeconfig))
    kube = KubeApi(client)
    results: dict[str, list[Run]] = {s: [] for s in SETUPS}
    try:
        # the policy's queue must be open, or Muster admits the pods without their gang
        await open_volcano_queues(kube)
        with ExitStack() as stack:
            profile = ["-m", "cProfile", "-o", str(args.profile)] if args.profile else []
            procs = {"muster": stack.enter_context(process([
                sys.executable, *profile, "-m", "webhook", "serve", "--host", "127.0.0.1",
                "--port", str(ports["muster"]), "--tls-cert-file", tls[0], "--tls-key-file",
                tls[1], "--policies", str(work / "policies"), "--kubeconfig",
                str(cluster.kubeconfig), "--namespace", "muster-system",
                "--metrics-port", str(metrics_port), "--metrics-host", "127.0.0.1"],
                work / "muster.log"))}
            wait_ready(f"https://127.0.0.1:{ports['muster']}", cafile, procs["muster"],
                       work / "muster.log")
            await kube.create(MUTATING_WEBHOOKS, configuration("muster", ports["muster"], ca))
            await asyncio.sleep(2)  # the API server picks up the configuration
            patch_file.write_text(await muster_patch(
                kube, f"https://127.0.0.1:{ports['muster']}", cafile))
            procs["noop"] = stack.enter_context(process(
                [*serve, str(ports["noop"]), *tls, "json"], work / "noop.log"))
            procs["static"] = stack.enter_context(process(
                [*serve, str(ports["static"]), *tls, "json", "--noop-patch", str(patch_file)],
                work / "static.log"))
            for setup in ("noop", "static"):
                wait_ready(f"https://127.0.0.1:{ports[setup]}", cafile, procs[setup],
                           work / f"{setup}.log")
                await kube.create(MUTATING_WEBHOOKS, configuration(setup, ports[setup], ca))
            await asyncio.sleep(2)
            for r in range(args.rounds):
                order = SETUPS[r % 4:] + SETUPS[:r % 4]
                for setup in order:
                    ns = f"bench-{setup}-{r}"
                    await kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace",
                                                   "metadata": {"name": ns, "labels": {
                                                       "muster-bench": setup}}})
                    proc = procs.get(setup)
                    before = cpu_seconds(proc.pid) if proc else 0.0
                    seconds, latencies = await create_pods(kube, ns, args.pods, args.concurrency)
                    cpu = cpu_seconds(proc.pid) - before if proc else None
                    results[setup].append(Run(setup, seconds, latencies, cpu))
                    print(f"  round {r + 1} {setup:<7} {len(latencies) / seconds:7.1f} pods/s "
                          f"p99 {statistics.quantiles(latencies, n=100)[98] * 1e3:6.1f} ms",
                          file=sys.stderr)
            await check_mutated(kube, args.rounds)
            async with aiohttp.ClientSession() as http, http.get(
                    f"http://127.0.0.1:{metrics_port}/metrics") as resp:
                counts = [line for line in (await resp.text()).splitlines()
                          if line.startswith(("muster_admission_requests_total",
                                              "muster_podgroup_writes_total",
                                              "muster_admission_fail_open_total"))]
            print("muster's own counts:\n  " + "\n  ".join(counts), file=sys.stderr)
    finally:
        await client.close()
    return results


async def check_mutated(kube: KubeApi, rounds: int) -> None:
    """Every pod that went through Muster or the static patch carries the gang annotation."""
    for setup in ("static", "muster"):
        for r in range(rounds):
            pods = (await kube.list(PODS, namespace=f"bench-{setup}-{r}"))["items"]
            bare = [p["metadata"]["name"] for p in pods
                    if "scheduling.k8s.io/group-name" not in p["metadata"]["annotations"]]
            if bare:
                raise SystemExit(f"{setup}: {len(bare)} pods not mutated, e.g. {bare[0]}")


def report(results: dict[str, list[Run]], args: argparse.Namespace) -> None:
    def ratio(setup: str, what: str) -> float:
        return float(statistics.median(getattr(a, what) / getattr(b, what) for a, b in
                                       zip(results[setup], results["static"], strict=True)))
    print(f"pod creates through kube-apiserver {versions.kubernetes()}, {args.pods} pods x "
          f"{args.rounds} rounds, {args.concurrency} concurrent clients; ratios to `static` "
          f"(same round), median")
    print(f"{'set-up':<8} {'pods/s':>8} {'p99 ms':>8} {'thr ratio':>10} {'p99 ratio':>10} "
          f"{'CPU us/admission':>17}")
    for setup in SETUPS:
        runs = results[setup]
        cpu = [r.cpu_seconds / len(r.latencies) * 1e6 for r in runs if r.cpu_seconds is not None]
        print(f"{setup:<8} {statistics.median(r.throughput for r in runs):8.1f} "
              f"{statistics.median(r.p99 for r in runs) * 1e3:8.1f} "
              f"{ratio(setup, 'throughput'):9.2f}x {ratio(setup, 'p99'):9.2f}x "
              f"{(f'{statistics.median(cpu):.0f}' if cpu else '-'):>17}")
    print("target: muster >= 0.95x static throughput, p99 <= 1.1x")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=600, help="pods per set-up and round")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", type=Path, help="run muster serve under cProfile, "
                        "writing its stats here (slows it: for finding costs, not figures)")
    args = parser.parse_args()
    reason = missing_prerequisites()
    if reason:
        print(f"bench_apiserver: cannot start the real node: {reason}", file=sys.stderr)
        return 2
    ensure_debian_packages()
    cluster = NodeCluster(image.build(), {})
    try:
        cluster.start()
        with cluster.netns(), tempfile.TemporaryDirectory(prefix="bench-apiserver-") as tmp:
            crds = Path(tmp) / "crds.yaml"
            crds.write_text(yaml.safe_dump_all(crd_documents()))
            kubectl(cluster, "apply", "--server-side", "-f", str(crds))
            wait_established(cluster)
            kubectl(cluster, "create", "namespace", "muster-system")
            results = asyncio.run(bench(cluster, args, Path(tmp)))
            report(results, args)
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
