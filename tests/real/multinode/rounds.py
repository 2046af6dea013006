"""The rounds `bench/bench_multinode.py` times: the same MPIJob (a launcher and 2 workers of 8
GPUs on two nodes, an allreduce over TCP) placed by Muster's binder, Volcano and coscheduling on
the multi-node cluster, the backends taking turns, each round from submit to all ranks Running
(polled) to the last rank's first allreduce done (the time it printed: one machine, one clock).

Not a test: no file name pytest collects on its own. The bench runs it by path in a session of
the multi-node tier, `MUSTER_BENCH_ROUNDS` rounds each, writing them to `MUSTER_BENCH_OUT`.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from jobs import ensure_namespace
from layout import GPUS_PER_NODE, TRAINING_LABEL
from operator_runs import delete_all, delete_and_wait
from ranks import check_sums, printed

from e2e import training
from e2e.node.cluster import NodeCluster
from e2e.probes import pods_of
from webhook.kube import MPIJOBS, KubeApi
from webhook.policy.operators import JOB_ROLE_LABEL

#: backend -> its namespace and labels (the admin's training policy; the shipped MPI ones)
BACKENDS = {"muster": ("train-rack", TRAINING_LABEL), "volcano": ("team-a", {}),
            "coscheduling": ("team-b", {})}
WORKERS = 2


async def one_round(kube: KubeApi, cluster: NodeCluster, backend: str, index: int
                    ) -> dict[str, Any]:
    ns = BACKENDS[backend][0]
    name = f"round-{backend[:4]}-{index}"
    submitted = time.time()
    await kube.create(MPIJOBS, training.mpijob(name, ns, workers=WORKERS,
                                               gpus_per_worker=GPUS_PER_NODE), namespace=ns)
    running_at = None
    while True:
        pods = await pods_of(kube, ns, name)
        if running_at is None and len(pods) == WORKERS + 1 and all(
                p["status"].get("phase") == "Running" for p in pods):
            running_at = time.time()
        job = await kube.get(MPIJOBS, name, namespace=ns)
        ended = {c["type"] for c in (job.get("status") or {}).get("conditions") or []
                 if c.get("status") == "True"} & {"Succeeded", "Failed"}
        if ended:
            break
        if time.time() - submitted > 600:
            raise AssertionError(f"{ns}/{name} did not finish within 600 s")
        await asyncio.sleep(0.1)
    launcher = next(p for p in pods if p["metadata"]["labels"].get(JOB_ROLE_LABEL) == "launcher")
    lines = await printed(cluster, launcher)
    assert ended == {"Succeeded"}, lines
    check_sums(lines, WORKERS)
    assert running_at is not None, f"{name}: never seen with every rank Running"
    await delete_and_wait(kube, MPIJOBS, name, ns)
    return {"backend": backend, "round": index, "running_s": round(running_at - submitted, 3),
            "allreduce_s": round(max(ln["first_allreduce_at"] for ln in lines) - submitted, 3),
            "nodes": sorted({p["spec"]["nodeName"] for p in pods
                             if p["metadata"]["labels"].get(JOB_ROLE_LABEL) == "worker"})}


@pytest.mark.timeout(3600)
@pytest.mark.neighbour("volcano")
@pytest.mark.neighbour("coscheduling")
async def test_rounds(kube: KubeApi, node_cluster: NodeCluster, volcano: Any, coscheduling: Any,
                      mpi_operator: None) -> None:
    rounds = int(os.environ.get("MUSTER_BENCH_ROUNDS", "3"))
    out = Path(os.environ.get("MUSTER_BENCH_OUT", "multinode-rounds.json"))
    for ns, labels in BACKENDS.values():
        await ensure_namespace(kube, ns, labels)
        await delete_all(kube, MPIJOBS, ns)
    done = []
    order = list(BACKENDS)
    for index in range(rounds):
        for backend in order[index % 3:] + order[:index % 3]:  # each goes first in turn
            done.append(await one_round(kube, node_cluster, backend, index))
            await asyncio.to_thread(out.write_text, json.dumps(done, indent=1) + "\n")
