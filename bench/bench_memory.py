"""Resident memory of `muster serve` with 100 policies and 10,000 namespaces in its caches.

    .venv/bin/python bench/bench_memory.py [--namespaces 10000] [--policies 100] [--jobs 200]

The API server emulator runs as a process seeded with the namespaces (each labelled like a real
one, with a team label); `muster serve` runs as another process against it, loads the policies,
syncs its namespace informer (10,000 objects), and then admits one worker pod of each of
`--jobs` MPIJobs spread over as many namespaces (owner cache and PodGroup cache filled, PodGroups
created). RSS and peak RSS (VmHWM) are read from /proc. Target (issue 3): < 150 MiB.

The Volcano queues the policies and the job name are seeded Open, as in a cluster with Volcano:
without them every admission is a warning and no PodGroup, and the RSS would be an idle
webhook's. The bench fails when any pod is admitted without its gang or no PodGroup is cached.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import ssl
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.bench_serve import free_port, local_tls, process, wait_ready  # noqa: E402
from webhook.demo.scenario import QUEUES, volcano_queue  # noqa: E402

FIXTURES = REPO.parent / "shared" / "fixtures"
POLICY = """\
apiVersion: muster.io/v1alpha1
kind: SchedulingPolicy
metadata: {{name: team-{i}}}
spec:
  match:
    namespaceSelector: {{matchLabels: {{team: t{i}}}}}
    ownerKinds: [kubeflow.org/MPIJob]
  gang: {{backend: volcano, queue: q{i}}}
  istio: {{optOut: true}}
  labels: {{cost-center: cc{i}}}
"""


def rss_kib(pid: int) -> tuple[int, int]:
    status = Path(f"/proc/{pid}/status").read_text()
    rss = int(re.search(r"VmRSS:\s+(\d+) kB", status)[1])  # type: ignore[index]
    hwm = int(re.search(r"VmHWM:\s+(\d+) kB", status)[1])  # type: ignore[index]
    return rss, hwm


def seed_file(path: Path, namespaces: int, jobs: int) -> None:
    job = yaml.safe_load((FIXTURES / "jobs" / "mpijob-vgg16-4workers.yaml").read_text())
    docs: list[dict[str, Any]] = []
    for i in range(namespaces):
        docs.append({"apiVersion": "v1", "kind": "Namespace", "metadata": {
            "name": f"ns-{i:05d}", "labels": {"team": f"t{i % 100}", "env": "prod"},
            "annotations": {"owner": f"team-{i % 100}@example.com"}}})
    # the queues POLICY names (q<i>) and the ones the job names (research; default), Open
    docs.extend(volcano_queue(q) for q in (*(f"q{i}" for i in range(100)), *QUEUES))
    for j in range(jobs):
        doc = json.loads(json.dumps(job))
        doc["metadata"]["namespace"] = f"ns-{j:05d}"
        docs.append(doc)
    # JSON is YAML: the emulator's --seed reads it, and far faster to write and parse
    path.write_text("\n---\n".join(json.dumps(d) for d in docs))


def metric(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} ([\d.e+]+)$", text, re.M)
    return float(m[1]) if m else float("nan")


async def admit_workers(url: str, cafile: Path, server: str, template: dict[str, Any],
                        jobs: int) -> int:
    """Admits one worker of each job; how many were admitted with their gang."""
    conn = aiohttp.TCPConnector(ssl=ssl.create_default_context(cafile=str(cafile)), limit=20)
    async with aiohttp.ClientSession(connector=conn) as session:
        async def one(j: int) -> str | None:
            ns = f"ns-{j:05d}"
            path = f"{server}/apis/kubeflow.org/v2beta1/namespaces/{ns}/mpijobs/" \
                   "tensorflow-topo-4-vgg16"
            async with session.get(path) as resp:
                job = await resp.json()
            body = json.loads(json.dumps(template))
            body["request"]["uid"] = f"uid-{j}"
            body["request"]["namespace"] = ns
            pod = body["request"]["object"]
            pod["metadata"]["namespace"] = ns
            pod["metadata"]["ownerReferences"][0]["uid"] = job["metadata"]["uid"]
            async with session.post(f"{url}/mutate/pods?timeout=10s", json=body) as resp:
                answer = await resp.json()
            response = answer["response"]
            if response["allowed"] and "patch" in response and "warnings" not in response:
                return None
            return f"{ns}: allowed {response['allowed']}, warnings {response.get('warnings')}"
        results = await asyncio.gather(*(one(j) for j in range(jobs)))
    missed = [r for r in results if r is not None]
    if missed:
        print(f"admitted without its gang: {missed[0]}")
    return jobs - len(missed)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--namespaces", type=int, default=10_000)
    parser.add_argument("--policies", type=int, default=100)
    parser.add_argument("--jobs", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp:
        work = Path(tmp)
        cafile = local_tls(work)
        policies = work / "policies"
        policies.mkdir()
        for i in range(args.policies):
            (policies / f"team-{i:03d}.yaml").write_text(POLICY.format(i=i))
        seed = work / "seed.yaml"
        seed_file(seed, args.namespaces, args.jobs)
        kubeconfig = work / "kubeconfig"
        emulator = [sys.executable, "-m", "webhook.doubles.emulator", "--port", str(free_port()),
                    "--kubeconfig", str(kubeconfig), "--crds",
                    str(REPO.parent / "shared" / "crds"), "--seed", str(seed),
                    "--log-level", "warning"]
        port, metrics_port = free_port(), free_port()
        serve = [sys.executable, "-m", "webhook", "--log-level", "warning", "serve",
                 "--host", "127.0.0.1", "--port", str(port), "--policies", str(policies),
                 "--metrics-port", str(metrics_port), "--metrics-host", "127.0.0.1",
                 "--tls-cert-file", str(work / "tls.crt"), "--tls-key-file",
                 str(work / "tls.key"), "--kubeconfig", str(kubeconfig)]
        with process(emulator, work / "emulator.log") as emu:
            deadline = time.monotonic() + 120
            while not kubeconfig.exists():
                if emu.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit((work / "emulator.log").read_text()[-3000:])
                time.sleep(0.2)
            url = f"https://127.0.0.1:{port}"
            with process(serve, work / "serve.log") as srv:
                start = time.monotonic()
                wait_ready(url, cafile, srv, work / "serve.log", within=180)
                synced = time.monotonic() - start
                idle = rss_kib(srv.pid)
                server = yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
                template = json.loads(
                    (FIXTURES / "admission" / "pod-create-worker.json").read_text())
                ok = asyncio.run(admit_workers(url, cafile, server, template, args.jobs))
                time.sleep(0.5)
                loaded = rss_kib(srv.pid)
                with urllib.request.urlopen(
                        f"http://127.0.0.1:{metrics_port}/metrics") as resp:
                    text = resp.read().decode()
        loaded_policies = metric(text, 'muster_policies_loaded')
        print(f"policies loaded        {loaded_policies:.0f}")
        counts = {}
        for cache in ("namespaces", "owners", "podgroups"):
            counts[cache] = metric(text, 'muster_cache_objects{cache="' + cache + '"}')
            print(f"{cache + ' in cache':22s} {counts[cache]:.0f}")
        print(f"pods admitted with gang {ok}/{args.jobs}")
        print(f"ready after            {synced:.1f} s")
        print(f"RSS after sync         {idle[0] / 1024:.1f} MiB")
        print(f"RSS after admissions   {loaded[0] / 1024:.1f} MiB (peak {loaded[1] / 1024:.1f} "
              f"MiB)")
        print(f"target < 150 MiB: {'met' if loaded[1] / 1024 < 150 else 'NOT met'}")
    shutil.rmtree(work, ignore_errors=True)
    failed = [why for bad, why in (
        (loaded_policies != args.policies, f"{loaded_policies:.0f} of {args.policies} policies "
                                           "loaded"),
        (ok != args.jobs, f"{ok} of {args.jobs} pods admitted with their gang"),
        (not counts["podgroups"] > 0, "no PodGroup in the webhook's cache"),
        (not counts["namespaces"] >= args.namespaces, f"{counts['namespaces']:.0f} namespaces "
                                                      f"cached, {args.namespaces} seeded"),
    ) if bad]
    for why in failed:
        print(f"FAILED: {why}: the RSS above is not of the work this bench means to measure")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
