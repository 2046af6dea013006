"""`muster gangs` and `muster explain job|pod` on the real node, run as a user who may only read:
a ServiceAccount bound to the chart's reader ClusterRole (get and list of what these commands
read), so that any write the commands made, or any read the role lacks, would be refused and
fail them. Three gangs: a binder gang short of members, a binder gang
bound whole, and a coscheduling PodGroup no scheduler looks at (this node runs no
scheduler-plugins, which the shipped mpi-coscheduling policy names)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jobs import delete_jobs, ensure_namespace, mpijob, submit
from real_helpers import chart_reader, kubectl, muster_json, with_api

from e2e.node.cluster import NodeCluster
from e2e.probes import eventually
from webhook import keys
from webhook.kube import MPIJOBS, PODS, KubeApi
from webhook.policy import operators

TOPO = "explain-topo"  # labelled for topology placement: policy mpi-topology (backend muster)
COSCHED = "team-b"  # policy mpi-coscheduling
READER = "muster-explain-reader"


@pytest.fixture(scope="module")
def reader(node_cluster: NodeCluster, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[Path]:
    """A kubeconfig of a ServiceAccount bound to the chart's reader ClusterRole; the module's
    jobs go after it."""
    kubeconfig, rbac = chart_reader(node_cluster, tmp_path_factory.mktemp("reader"), READER)
    yield kubeconfig
    with node_cluster.netns():
        with_api(node_cluster, lambda kube: delete_jobs(kube, TOPO, ["short", "whole"]))
        with_api(node_cluster, lambda kube: delete_jobs(kube, COSCHED, ["idle"]))
        kubectl(node_cluster, "delete", "--ignore-not-found", "-f", str(rbac))


async def test_a_binder_gang_short_of_members_waits_for_them(kube: KubeApi, reader: Path
                                                             ) -> None:
    ns = await ensure_namespace(kube, TOPO, {
        keys.LABEL_GPU_TOPOLOGY: keys.LABEL_GPU_TOPOLOGY_ENABLED})
    made = await kube.create(MPIJOBS, mpijob("short", ns, workers=2), namespace=ns)
    await kube.create(PODS, operators.mpi_worker_pods(made)[0], namespace=ns)  # 1 pod of 3
    found = await muster_json(reader, "explain", "job", f"{ns}/short")
    assert found["job"] == "kubeflow.org/MPIJob short" and found["pods"] == 1
    verdicts = {v["policy"]: v for v in found["policies"]}
    assert verdicts["mpi-topology"]["matched"] == 1
    assert verdicts["mpi-volcano"]["matched"] == 0  # team-a only
    assert "mpi-topology" in found["applied"] and not found["notes"]
    [report] = found["gangs"]
    gang = report["gang"]
    assert (gang["backend"], gang["present"], gang["bound"], gang["minimum"], gang["state"],
            gang["waiting_kind"]) == ("muster", 1, 0, 3, "Pending", "members"), gang
    assert "1 of minMember 3" in gang["waiting"]
    assert "its other pods do not exist" in report["advice"]
    listed = await muster_json(reader, "gangs", "-n", ns, "--state", "pending")
    assert [(g["job"], g["waiting_kind"]) for g in listed] == [("MPIJob/short", "members")]


async def test_a_binder_gang_bound_whole_runs_with_the_binders_events(
        kube: KubeApi, reader: Path) -> None:
    ns = await ensure_namespace(kube, TOPO, {
        keys.LABEL_GPU_TOPOLOGY: keys.LABEL_GPU_TOPOLOGY_ENABLED})
    await submit(kube, mpijob("whole", ns, workers=1))

    async def running() -> dict[str, Any] | None:
        found = await muster_json(reader, "explain", "job", f"{ns}/whole")
        gangs = [r["gang"] for r in found["gangs"]]
        return found if found["pods"] == 2 and gangs and gangs[0]["state"] == "Running" \
            else None
    found = await eventually(running, within=300, interval=2, what="whole's gang Running")
    gang = found["gangs"][0]["gang"]
    assert (gang["present"], gang["bound"], gang["minimum"], gang["waiting"]) == (2, 2, 2, "")
    assert found["gangs"][0]["object"] == ""  # backend muster: no gang object
    scheduled = [e for e in found["events"] if e["reason"] == "Scheduled"]
    assert scheduled and all("as part of gang" in e["message"] for e in scheduled), found
    one = await muster_json(reader, "explain", "pod", f"{ns}/whole-worker-0")
    assert one["job"] == "kubeflow.org/MPIJob whole" and one["pods"] == 1
    assert [r["gang"]["name"] for r in one["gangs"]] == [gang["name"]]
    running_gangs = await muster_json(reader, "gangs", "-A", "--state", "Running")
    assert any(g["namespace"] == ns and g["job"] == "MPIJob/whole" for g in running_gangs)
    assert not [g for g in running_gangs if g["job"] == "MPIJob/short"]


async def test_a_coscheduling_podgroup_no_scheduler_looks_at(kube: KubeApi, reader: Path
                                                             ) -> None:
    ns = await ensure_namespace(kube, COSCHED)
    await submit(kube, mpijob("idle", ns, workers=1))

    async def both() -> dict[str, Any] | None:
        found = await muster_json(reader, "explain", "job", f"{ns}/idle")
        return found if found["pods"] == 2 and found["gangs"] else None
    found = await eventually(both, within=120, interval=2, what="idle's two pods")
    [report] = found["gangs"]
    gang = report["gang"]
    assert report["object"].startswith(f"PodGroup scheduling.x-k8s.io/v1alpha1 {ns}/idle")
    assert (gang["backend"], gang["present"], gang["bound"], gang["minimum"], gang["state"],
            gang["waiting_kind"]) == ("coscheduling", 2, 0, 2, "Pending", "no-scheduler")
    assert "scheduler-plugins-scheduler" in gang["waiting"]
    assert {v["policy"] for v in found["policies"] if v["matched"]} >= {"mpi-coscheduling"}
