"""Real training jobs across real nodes, submitted as users submit them, on the training image
(OpenMPI, OpenSSH, mpi4py, PyTorch with gloo: `e2e.node.train_image`; the jobs:
`e2e.training`):

- an MPIJob through the real mpi-operator: the launcher's `mpirun` reaches two workers on two
  nodes over SSH, by the names of the hostfile the operator wrote (CoreDNS), and their allreduce
  over TCP sums right; Succeeded;
- a PyTorchJob through the real training operator: a master and a worker on two nodes run DDP
  steps with gloo and end with the same parameters; Succeeded.

Under Muster's binder (the admin's `training-in-one-rack` policy: required rack) each job's
GPU pods land on two nodes of one rack, and each rank saw exactly the GPUs the binder assigned
its pod; the same MPIJob under Volcano (policy mpi-volcano) and coscheduling
(mpi-coscheduling), and the PyTorchJob under Volcano (pytorchjob-volcano), run on the same
cluster: each rank saw its own 8 GPUs, none held twice.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from jobruns import TRAINER, ensure_trainer, finished, made, role
from jobs import ensure_namespace
from layout import GPUS_PER_NODE, RACKS, TRAINING_LABEL
from operator_runs import delete_all, delete_and_wait, training_operator_running
from ranks import check_assignments, check_sums, printed, visible

from e2e import training
from e2e.jobkind_scenarios import PYTORCHJOBS
from e2e.node import schedulers
from e2e.node.cluster import NodeCluster
from e2e.probes import pods_of
from webhook import keys
from webhook.kube import COSCHEDULING_PODGROUPS, MPIJOBS, VOLCANO_PODGROUPS, KubeApi, Resource

TRAIN_NS = "train-rack"
WORKERS = 2


async def run_mpijob(kube: KubeApi, cluster: NodeCluster, ns: str, name: str,
                     podgroups: Resource | None = None
                     ) -> tuple[list[dict[str, Any]], dict[str, list[str]], dict[str, Any]]:
    """The MPIJob run to Succeeded across two whole nodes: its worker pods, the GPUs each
    worker's rank saw (its line, through mpirun, in the launcher's log) and its PodGroup of
    `podgroups`, read while it runs (it goes with the job). The job goes after, whatever
    happened: its workers hold two nodes' GPUs."""
    await delete_all(kube, MPIJOBS, ns)
    await kube.create(MPIJOBS, training.mpijob(name, ns, workers=WORKERS,
                                               gpus_per_worker=GPUS_PER_NODE), namespace=ns)
    try:
        group = await made(kube, podgroups, name, ns) if podgroups else {}
        ended = await finished(kube, MPIJOBS, name, ns)
        pods = await pods_of(kube, ns, name)
        (launcher,) = role(pods, "launcher")
        lines = await printed(cluster, launcher)
    finally:
        await delete_and_wait(kube, MPIJOBS, name, ns)
    assert ended == "Succeeded", lines
    check_sums(lines, WORKERS)
    by_host = {ln["host"]: ln for ln in lines}
    workers = role(pods, "worker")
    for pod in workers:
        assert by_host[pod["metadata"]["name"]]["node"] == pod["spec"]["nodeName"], by_host
    assert len({p["spec"]["nodeName"] for p in workers}) == WORKERS, "two nodes"
    return workers, {p["metadata"]["name"]: visible(by_host[p["metadata"]["name"]])
                     for p in workers}, group


def own_gpus_each(seen: dict[str, list[str]]) -> None:
    """Another scheduler's placement, the kubelet's GPUs: each rank its node's 8, none twice."""
    assert all(len(uuids) == GPUS_PER_NODE for uuids in seen.values()), seen
    held = Counter(u for uuids in seen.values() for u in uuids)
    assert all(n == 1 for n in held.values()), held


async def test_an_mpijob_allreduces_across_two_nodes_of_one_rack_on_the_binders_gpus(
        kube: KubeApi, node_cluster: NodeCluster, mpi_operator: None) -> None:
    ns = await ensure_namespace(kube, TRAIN_NS, TRAINING_LABEL)
    workers, seen, _ = await run_mpijob(kube, node_cluster, ns, "allreduce")
    assert len({RACKS[p["spec"]["nodeName"]] for p in workers}) == 1, "required rack"
    assert {p["metadata"]["annotations"][keys.ANN_GANG_NAME] for p in workers} == {"allreduce"}
    check_assignments(workers, seen)


@pytest.mark.neighbour("volcano")
async def test_the_same_mpijob_under_volcano(
        kube: KubeApi, node_cluster: NodeCluster, volcano: Any, mpi_operator: None) -> None:
    ns = await ensure_namespace(kube, "team-a")  # mpi-volcano
    workers, seen, group = await run_mpijob(kube, node_cluster, ns, "allreduce-vc",
                                            VOLCANO_PODGROUPS)
    assert group["spec"]["minMember"] == WORKERS + 1
    assert {p["spec"]["schedulerName"] for p in workers} == {"volcano"}
    own_gpus_each(seen)


@pytest.mark.neighbour("coscheduling")
async def test_the_same_mpijob_under_coscheduling(
        kube: KubeApi, node_cluster: NodeCluster, coscheduling: Any, mpi_operator: None
        ) -> None:
    ns = await ensure_namespace(kube, "team-b")  # mpi-coscheduling
    workers, seen, group = await run_mpijob(kube, node_cluster, ns, "allreduce-co",
                                            COSCHEDULING_PODGROUPS)
    assert group["spec"]["minMember"] == WORKERS + 1
    assert {p["spec"]["schedulerName"] for p in workers} == {schedulers.COSCHEDULING_NAME}
    own_gpus_each(seen)


async def run_pytorchjob(kube: KubeApi, cluster: NodeCluster, ns: str, name: str,
                         operator_dir: Path) -> tuple[list[dict[str, Any]], dict[str, list[str]]]:
    """A master and a worker, 8 GPUs each, DDP with gloo to Succeeded: the pods and the GPUs
    each rank saw. Rank 0 then saved the model and said so on its pod, as its ServiceAccount
    (a user's Role on their pods), through the chart's annotation guard."""
    await delete_all(kube, PYTORCHJOBS, ns)
    await ensure_trainer(kube, ns)
    template = operator_dir / "init-container.yaml"
    template.write_text(training.PYTORCH_INIT_TEMPLATE)
    with training_operator_running(cluster, operator_dir, f"--namespace={ns}",
                                   *training.pytorch_operator_flags(template)):
        await kube.create(PYTORCHJOBS, training.pytorchjob(
            name, ns, workers=1, gpus_per_worker=GPUS_PER_NODE, service_account=TRAINER),
            namespace=ns)
        try:
            ended = await finished(kube, PYTORCHJOBS, name, ns)
            pods = await pods_of(kube, ns, name)
            lines = {p["metadata"]["name"]: await printed(cluster, p) for p in pods}
        finally:
            await delete_and_wait(kube, PYTORCHJOBS, name, ns)
    assert ended == "Succeeded", lines
    check_sums([ln for got in lines.values() for ln in got], 2)
    for pod in pods:
        (line,) = lines[pod["metadata"]["name"]]
        assert line["in_sync"] and line["node"] == pod["spec"]["nodeName"], line
        said = (pod["metadata"].get("annotations") or {}).get(keys.ANN_LAST_CHECKPOINT)
        # rank 0 checkpointed and said when on its own pod; no other rank said anything
        assert said == line.get("checkpoint_said") and (said is None) == (line["rank"] != 0), \
            (line, said)
    assert len({p["spec"]["nodeName"] for p in pods}) == 2, "two nodes"
    return pods, {n: visible(got[0]) for n, got in lines.items()}


async def test_a_pytorchjob_runs_ddp_across_two_nodes_of_one_rack_on_the_binders_gpus(
        kube: KubeApi, node_cluster: NodeCluster, pytorch_operator: Path) -> None:
    ns = await ensure_namespace(kube, TRAIN_NS, TRAINING_LABEL)
    pods, seen = await run_pytorchjob(kube, node_cluster, ns, "ddp", pytorch_operator)
    assert len({RACKS[p["spec"]["nodeName"]] for p in pods}) == 1, "required rack"
    check_assignments(pods, seen)


@pytest.mark.neighbour("volcano")
async def test_the_same_pytorchjob_under_volcano(
        kube: KubeApi, node_cluster: NodeCluster, volcano: Any, pytorch_operator: Path) -> None:
    ns = await ensure_namespace(kube, "team-d")  # pytorchjob-volcano
    pods, seen = await run_pytorchjob(kube, node_cluster, ns, "ddp-vc", pytorch_operator)
    assert {p["spec"]["schedulerName"] for p in pods} == {"volcano"}
    own_gpus_each(seen)
