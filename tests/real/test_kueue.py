"""Kueue decides when, Muster decides where: Kueue's real manager (controllers and webhooks, built
from the module proxy) holds quota for topology MPIJobs, and Muster's binder places what Kueue
admits. The tests act as the MPI operator: they create an MPIJob's launcher Job and worker pods
once Kueue has unsuspended it (`mpi_launcher_job`, `mpi_worker_pods` of the admitted MPIJob,
which carries the flavor's nodeSelector and tolerations Kueue wrote into its templates).

- Over its quota, a job stays suspended: no pods, and Muster writes nothing. When quota frees,
  Kueue admits it and the binder places it whole with a GPU set, on a node tainted for the
  flavor (its toleration honoured); a scheduling-gated worker holds the gang until its gate goes.
- A flavor whose nodeSelector matches no node: admitted, never bound by the binder, and Kueue's
  waitForPodsReady evicts it (suspends the job) after its timeout.
- A flavor of a Kueue Topology (Kueue's own topology-aware scheduling): Kueue chooses each
  pod's node (or only its rack, where the Topology stops there) and ungates it with that; the
  binder binds it there with its GPU set, on the test's node, and over two racks of nodes the
  test makes (an Indexed Job, whose pods the real Job controller makes), also where the racks
  are the binder's own network levels. Where a policy keeps the gang on one node and Kueue
  spreads it, the binder waits and says why, and `muster analyze` warns of the policy.
- A Topology made through Kueue's API is the binder's levels (`--network-levels kueue:NAME`).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from jobs import delete_jobs, ensure_namespace, mpijob
from neighbours import KUEUE_PODS_READY_TIMEOUT, bound
from real_helpers import (
    NETWORK_LEVELS,
    assigned_indices,
    binder_as_chart,
    chart_binder_grant,
    delete_now,
    failed_scheduling,
    fake_node,
    gpu_pod,
)

from e2e.cluster import NAMESPACE, RELEASE
from e2e.node import schedulers
from e2e.node.cluster import NODE_NAME, NodeCluster
from e2e.probes import eventually, pods_of
from webhook import keys
from webhook.analyze.collect import collect
from webhook.analyze.findings import analyze
from webhook.binder.cli import network_levels
from webhook.binder.controller import BinderConfig
from webhook.kube import (
    COSCHEDULING_PODGROUPS,
    JOBS,
    MPIJOBS,
    NODES,
    PODS,
    VOLCANO_PODGROUPS,
    ApiError,
    KubeApi,
    Resource,
)
from webhook.kube.api import KUEUE_QUEUES, TOPOLOGIES
from webhook.policy import operators
from webhook.topology.builtin import builtin
from webhook.topology.network import Levels

pytestmark = pytest.mark.neighbour("kueue")

NS = "kueue-team"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
FLAVORS, CLUSTER_QUEUES, LOCAL_QUEUES = (KUEUE_QUEUES[plural][0] for plural in (
    "resourceflavors", "clusterqueues", "localqueues"))
WORKLOADS = Resource("kueue.x-k8s.io", "v1beta2", "workloads", True, "Workload")
KUEUE_TOPOLOGIES = TOPOLOGIES["kueue"][0]
TAINT = {"key": "muster.io/kueue-pool", "value": "gpu", "effect": "NoSchedule"}
GATE = "example.com/hold"
#: the scheduling gate Kueue's Topology Aware Scheduling holds a pod with until it has a node
KUEUE_TAS_GATE = "kueue.x-k8s.io/topology"
RACK = "example.com/rack"
#: the binder's own levels (Topograph's spine and leaf, the NVLink clique: `NETWORK_LEVELS`)
SPINE, LEAF, CLIQUE = NETWORK_LEVELS


def _kueue_topology(name: str, *labels: str) -> dict[str, Any]:
    """Kueue Topology `name` whose levels are these node labels, widest first."""
    return {"apiVersion": KUEUE_TOPOLOGIES.api_version, "kind": "Topology",
            "metadata": {"name": name},
            "spec": {"levels": [{"nodeLabel": label} for label in labels]}}


async def _queue(kube: KubeApi, name: str, node_labels: dict[str, str], gpus: int, *,
                 tolerations: list[dict[str, str]] | None = None,
                 topology: str | None = None, ns: str = NS) -> None:
    """A ResourceFlavor (of Kueue Topology `topology`: Kueue places its workloads by
    topology), a ClusterQueue of `gpus` GPUs of it, and LocalQueue `name` in `ns`."""
    flavor: dict[str, Any] = {"nodeLabels": node_labels, "tolerations": tolerations or []}
    if topology is not None:
        flavor["topologyName"] = topology
    await kube.create(FLAVORS, {
        "apiVersion": FLAVORS.api_version, "kind": "ResourceFlavor", "metadata": {"name": name},
        "spec": flavor})
    await kube.create(CLUSTER_QUEUES, {
        "apiVersion": FLAVORS.api_version, "kind": "ClusterQueue", "metadata": {"name": name},
        "spec": {"namespaceSelector": {}, "resourceGroups": [{
            "coveredResources": ["cpu", "memory", keys.GPU_RESOURCE],
            "flavors": [{"name": name, "resources": [
                {"name": "cpu", "nominalQuota": "1"}, {"name": "memory", "nominalQuota": "1Gi"},
                {"name": keys.GPU_RESOURCE, "nominalQuota": str(gpus)}]}]}]}})
    await kube.create(LOCAL_QUEUES, {
        "apiVersion": FLAVORS.api_version, "kind": "LocalQueue",
        "metadata": {"name": name, "namespace": ns}, "spec": {"clusterQueue": name}},
        namespace=ns)


async def _submit_to(kube: KubeApi, name: str, queue: str,
                     worker_annotations: dict[str, str] | None = None, *, ns: str = NS,
                     gpus: int = 1, tolerations: list[dict[str, str]] | None = None
                     ) -> dict[str, Any]:
    """A topology MPIJob of 2 workers x `gpus` GPUs in `queue`, its pods with `tolerations`;
    Kueue's webhook suspends it."""
    await eventually(lambda: _gpus(kube), within=90, what="the node's 8 GPUs registered")
    job = mpijob(name, ns, workers=2)
    job["metadata"].setdefault("labels", {})[QUEUE_LABEL] = queue
    for spec in job["spec"]["mpiReplicaSpecs"].values():
        spec["template"]["spec"].setdefault("tolerations", []).extend(tolerations or [])
    worker = job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]
    worker.setdefault("metadata", {}).setdefault("annotations", {}).update(
        worker_annotations or {})
    worker["spec"]["containers"][0]["resources"]["limits"] = {keys.GPU_RESOURCE: gpus}
    made = await kube.create(MPIJOBS, job, namespace=ns)
    assert made["spec"]["runPolicy"]["suspend"] is True  # Kueue's MPIJob webhook
    return made


async def _gpus(kube: KubeApi) -> bool:
    node = await kube.get(NODES, NODE_NAME)
    return bool(node["status"].get("allocatable", {}).get(keys.GPU_RESOURCE) == "8")


async def _workload(kube: KubeApi, job: str) -> dict[str, Any] | None:
    for w in (await kube.list(WORKLOADS, namespace=NS))["items"]:
        if any(o["name"] == job for o in w["metadata"].get("ownerReferences") or []):
            return dict(w)
    return None


def _condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    for c in (obj or {}).get("status", {}).get("conditions") or []:
        if c["type"] == kind:
            return dict(c)
    return {}


async def _admitted(kube: KubeApi, name: str, ns: str = NS) -> dict[str, Any] | None:
    job = await kube.get(MPIJOBS, name, namespace=ns)
    return None if job["spec"]["runPolicy"].get("suspend") else dict(job)


async def _start(kube: KubeApi, job: dict[str, Any], gated: int | None = None) -> None:
    """What the MPI operator does for an unsuspended MPIJob: its launcher Job and workers
    (worker `gated` with a scheduling gate, as a quota or topology controller would add)."""
    ns = job["metadata"]["namespace"]
    await kube.create(JOBS, operators.mpi_launcher_job(job), namespace=ns)
    for i, pod in enumerate(operators.mpi_worker_pods(job)):
        if i == gated:
            pod["spec"]["schedulingGates"] = [{"name": GATE}]
        await kube.create(PODS, pod, namespace=ns)


async def _taint(kube: KubeApi, on: bool) -> None:
    node = await kube.get(NODES, NODE_NAME)
    taints = [t for t in node["spec"].get("taints") or [] if t["key"] != TAINT["key"]]
    await kube.patch(NODES, NODE_NAME, {"spec": {"taints": taints + ([TAINT] if on else [])}})


async def test_over_quota_a_job_waits_suspended_then_the_binder_places_it_whole(
        kube: KubeApi, kueue: schedulers.Neighbour) -> None:
    await ensure_namespace(kube, NS, {keys.LABEL_GPU_TOPOLOGY: keys.LABEL_GPU_TOPOLOGY_ENABLED})
    toleration = {"key": TAINT["key"], "operator": "Equal", "value": TAINT["value"],
                  "effect": TAINT["effect"]}
    await _queue(kube, "gpu-pool", {keys.LABEL_GPU_TOPOLOGY: keys.LABEL_GPU_TOPOLOGY_ENABLED},
                 gpus=1, tolerations=[toleration])
    await _taint(kube, on=True)
    try:
        await _submit_to(kube, "kq-topo", "gpu-pool")

        async def over_quota() -> bool:
            reserved = _condition(await _workload(kube, "kq-topo"), "QuotaReserved")
            return reserved.get("status") == "False" and "insufficient" in reserved["message"]
        await eventually(over_quota, within=60, what="Kueue to hold kq-topo for want of quota")
        for _ in range(6):  # held: suspended, no pods, nothing of Muster's
            assert await _admitted(kube, "kq-topo") is None
            await asyncio.sleep(0.5)
        assert await pods_of(kube, NS, "kq-topo") == []
        for groups in (VOLCANO_PODGROUPS, COSCHEDULING_PODGROUPS):
            assert (await kube.list(groups, namespace=NS))["items"] == []

        await kube.patch(CLUSTER_QUEUES, "gpu-pool", {"spec": {"resourceGroups": [{
            "coveredResources": ["cpu", "memory", keys.GPU_RESOURCE],
            "flavors": [{"name": "gpu-pool", "resources": [
                {"name": "cpu", "nominalQuota": "1"}, {"name": "memory", "nominalQuota": "1Gi"},
                {"name": keys.GPU_RESOURCE, "nominalQuota": "8"}]}]}]}})
        job = await eventually(lambda: _admitted(kube, "kq-topo"), within=60,
                               what="Kueue to admit kq-topo once the quota is there")
        worker = job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
        assert worker["nodeSelector"][keys.LABEL_GPU_TOPOLOGY] == keys.LABEL_GPU_TOPOLOGY_ENABLED
        assert toleration in worker["tolerations"]

        await _start(kube, job, gated=1)
        # a gated worker is no member yet: the binder binds none of the gang, and says so once
        # the gang is 10 s old (docs/binder.md, "Readiness")
        said = await failed_scheduling(kube, NS, "kq-topo-worker-0", within=40)
        assert said == (f"gang {NS}/kq-topo cannot be placed: waiting for members: "
                        "2 of minMember 3 exist"), said

        async def unschedulable() -> bool:  # the launcher's condition says it too
            pods = await pods_of(kube, NS, "kq-topo")
            assert len(pods) == 3 and bound(pods) == []
            return any(c["type"] == "PodScheduled" and c.get("message") == said
                       and (c["status"], c.get("reason")) == ("False", "Unschedulable")
                       for p in pods if p["metadata"]["labels"][operators.JOB_ROLE_LABEL]
                       == "launcher" for c in p["status"].get("conditions") or ())
        await eventually(unschedulable, within=10, what="the launcher's PodScheduled condition")
        await kube.patch(PODS, "kq-topo-worker-1", {"spec": {"schedulingGates": None}},
                         namespace=NS)

        async def whole() -> list[dict[str, Any]]:
            pods = await pods_of(kube, NS, "kq-topo")
            return pods if len(pods) == 3 and len(bound(pods)) == 3 else []
        pods = await eventually(whole, within=90, what="the binder to place kq-topo whole")
        assert {p["spec"]["schedulerName"] for p in pods} == {"muster-binder"}
        gpus = [i for p in pods if p["metadata"]["labels"][operators.JOB_ROLE_LABEL] == "worker"
                for i in assigned_indices(p)]
        assert len(gpus) == 2 and len(set(gpus)) == 2
    finally:
        await _taint(kube, on=False)
        await delete_jobs(kube, NS, ["kq-topo"])


async def test_a_flavor_with_no_node_is_never_bound_and_kueue_evicts_it(
        kube: KubeApi, kueue: schedulers.Neighbour) -> None:
    await ensure_namespace(kube, NS, {keys.LABEL_GPU_TOPOLOGY: keys.LABEL_GPU_TOPOLOGY_ENABLED})
    await _queue(kube, "nowhere", {"muster.io/pool": "nowhere"}, gpus=8)
    try:
        await _submit_to(kube, "kq-nowhere", "nowhere")
        job = await eventually(lambda: _admitted(kube, "kq-nowhere"), within=60,
                               what="Kueue to admit kq-nowhere")
        await _start(kube, job)

        async def evicted() -> dict[str, Any]:
            assert bound(await pods_of(kube, NS, "kq-nowhere")) == []  # never, all along
            return _condition(await _workload(kube, "kq-nowhere"), "Evicted")
        found = await eventually(evicted, within=KUEUE_PODS_READY_TIMEOUT + 60,
                                 what="waitForPodsReady to evict the unplaceable job")
        assert found["reason"] == "PodsReadyTimeout"
        await eventually(lambda: _suspended(kube, "kq-nowhere"), within=30,
                         what="Kueue to suspend the evicted MPIJob")
        pods = await pods_of(kube, NS, "kq-nowhere")
        assert pods and bound(pods) == []
        assert all(p["spec"]["nodeSelector"] == {"muster.io/pool": "nowhere"} for p in pods)
    finally:
        await delete_jobs(kube, NS, ["kq-nowhere"])


async def test_kueue_places_by_its_topology_and_the_binder_chooses_the_gpus_there(
        kube: KubeApi, kueue: schedulers.Neighbour) -> None:
    """Kueue's own Topology Aware Scheduling (a flavor with a topologyName): Kueue chooses the
    domain and node of each pod, gates the pods (`kueue.x-k8s.io/topology`) and ungates each
    with its node; the binder waits for the gates, honours Kueue's node, and chooses the GPU
    set there, bound whole."""
    await ensure_namespace(kube, NS, {keys.LABEL_GPU_TOPOLOGY: keys.LABEL_GPU_TOPOLOGY_ENABLED})
    topology = "muster-test-kueue-tas"
    await kube.create(KUEUE_TOPOLOGIES, _kueue_topology(topology, RACK, keys.HOSTNAME_LABEL))
    await kube.patch(NODES, NODE_NAME, {"metadata": {"labels": {RACK: "r0"}}})
    await _queue(kube, "tas-pool", {keys.LABEL_GPU_TOPOLOGY: keys.LABEL_GPU_TOPOLOGY_ENABLED},
                 gpus=8, topology=topology)
    try:
        await _submit_to(kube, "kq-tas", "tas-pool", {keys.KUEUE_REQUIRED_TOPOLOGY: RACK})
        job = await eventually(lambda: _admitted(kube, "kq-tas"), within=60,
                               what="Kueue to admit kq-tas with a topology assignment")
        workload = await _workload(kube, "kq-tas")
        assert workload is not None
        assigned = {a["name"]: a for a in workload["status"]["admission"]["podSetAssignments"]}
        assert "topologyAssignment" in assigned["worker"], assigned
        worker = job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
        assert {"name": KUEUE_TAS_GATE} in worker["schedulingGates"]

        await _start(kube, job)

        async def whole() -> list[dict[str, Any]]:
            pods = await pods_of(kube, NS, "kq-tas")
            return pods if len(pods) == 3 and len(bound(pods)) == 3 else []
        pods = await eventually(whole, within=90, what="Kueue to ungate, the binder to bind")
        workers = [p for p in pods
                   if p["metadata"]["labels"][operators.JOB_ROLE_LABEL] == "worker"]
        for p in workers:  # Kueue's choice of node, honoured
            assert not p["spec"].get("schedulingGates")
            assert p["spec"]["nodeSelector"][keys.HOSTNAME_LABEL] == p["spec"]["nodeName"]
            assert p["spec"]["schedulerName"] == "muster-binder"
        gpus = [i for p in workers for i in assigned_indices(p)]
        assert len(gpus) == 2 and len(set(gpus)) == 2
    finally:
        await delete_jobs(kube, NS, ["kq-tas"])
        await kube.patch(NODES, NODE_NAME, {"metadata": {"labels": {RACK: None}}})


@contextlib.asynccontextmanager
async def _two_racks(kube: KubeApi, ns: str, name: str, levels: tuple[str, ...],
                     binder_levels: bool = False) -> AsyncIterator[dict[str, str]]:
    """Nodes for Kueue to choose among: two racks of two 8-GPU nodes made by the test (no
    kubelet runs them, so their pods stay Pending), one node of rack r0 half taken, as Kueue
    Topology `muster-test-{name}` of `levels` (the first: the rack's label), and LocalQueue
    `name` in `ns` of a flavor of them. Afterwards every pod in `ns` goes, then the nodes
    (delete the jobs first).

    Yields the toleration of the nodes' taint, which the flavor has and the job's own pod
    templates must have too: Kueue v0.17 judges a node's taints by the Workload's templates
    alone, and terminates a pod that waits unbound on a node whose taint only the flavor
    tolerates (kubernetes-sigs/kueue#11152; docs/operations.md, "Beside Kueue").

    `binder_levels`: the racks are leaves of the binder's levels too, under one spine, and
    rack r1 has a third node outside Kueue's flavor, in an NVLink clique with kq-r1-1 (its
    room counts in the binder's domains; no pod of the flavor may use it)."""
    pool = {"example.com/pool": name}
    taint = {"key": "example.com/fake-node", "value": name, "effect": "NoSchedule"}
    toleration = {**taint, "operator": "Equal"}
    topology = f"muster-test-{name}"
    await kube.create(KUEUE_TOPOLOGIES, _kueue_topology(topology, *levels))
    nodes = [fake_node(f"kq-r{r}-{i}", builtin("hgx-h100"), {levels[0]: f"r{r}", **pool}, taint)
             for r in range(2) for i in range(2)]
    if binder_levels:
        outside = fake_node("kq-r1-2", builtin("hgx-h100"), {levels[0]: "r1"}, taint)
        for n in [*nodes, outside]:
            labels = n["metadata"]["labels"]
            labels[SPINE] = "kq-spine"
            if labels[levels[0]] == "r1":
                labels[CLIQUE] = "kq-cluster.0" if n["metadata"]["name"] == "kq-r1-0" \
                    else "kq-cluster.1"
        nodes.append(outside)
    try:
        for n in nodes:
            await kube.create(NODES, n)
        # the API server taints a new node not-ready until the node lifecycle controller sees
        # it: Kueue would take that taint for a failed node
        names = {n["metadata"]["name"] for n in nodes}
        await eventually(lambda: _tainted_only(kube, names, taint), within=60,
                         what="the node lifecycle controller to untaint the new nodes")
        await kube.create(PODS, gpu_pod("kq-busy", ns, "muster-binder", 4, node="kq-r0-0"),
                          namespace=ns)
        await _queue(kube, name, pool, gpus=32, tolerations=[toleration], topology=topology,
                     ns=ns)
        yield toleration
    finally:
        async def gone() -> bool:  # (no kubelet ends these pods: deleted at once, every one)
            pods = (await kube.list(PODS, namespace=ns))["items"]
            for pod in pods:
                await delete_now(kube, PODS.path(ns, pod["metadata"]["name"]))
            return not pods
        await eventually(gone, within=60, what=f"the pods in {ns} gone")
        for n in nodes:
            await delete_now(kube, NODES.path(None, n["metadata"]["name"]))


async def _tainted_only(kube: KubeApi, names: set[str], taint: dict[str, str]) -> bool:
    """Whether each of these nodes has this taint and no other."""
    nodes = [n for n in (await kube.list(NODES))["items"] if n["metadata"]["name"] in names]
    return len(nodes) == len(names) and all(
        [{k: t.get(k) for k in taint} for t in n["spec"].get("taints") or ()] == [taint]
        for n in nodes)


@pytest.mark.parametrize(("rack", "to_nodes"), [(RACK, True), (RACK, False), (LEAF, True)],
                         ids=["down-to-nodes", "racks-only", "binder-levels"])
async def test_kueue_spreads_a_gang_over_a_rack_and_the_binder_binds_each_pod_where_kueue_said(
        kube: KubeApi, kueue: schedulers.Neighbour, rack: str, to_nodes: bool) -> None:
    """Over two racks of nodes (`_two_racks`), an Indexed Job of two 8-GPU pods that must
    share a rack, in a namespace whose policy honours Kueue's annotations (so Muster's request
    says the same as Kueue's): Kueue assigns rack r1, the real Job controller makes the gated
    pods, and Kueue ungates each with its domain: its node where the Topology's levels go down
    to nodes (the binder binds each pod there), else its rack (the binder chooses the nodes in
    it). Each pod gets all 8 GPUs of its node. With `binder-levels` the rack is one of the
    binder's own levels too, so the binder's network decision places members Kueue pinned to
    a node each: the rack's clique with the most room holds kq-r1-1 and a node outside
    Kueue's flavor, not kq-r1-0, so the rack is placed with each pod where it may go."""
    ns = await ensure_namespace(kube, "kueue-racks", {"muster.io/network": "as-annotated"})
    name = {(RACK, True): "kueue-racks", (RACK, False): "kueue-racks-only",
            (LEAF, True): "kueue-leaves"}[rack, to_nodes]
    job = f"kq-{name}"
    levels = (rack, keys.HOSTNAME_LABEL) if to_nodes else (rack,)
    async with _two_racks(kube, ns, name, levels, binder_levels=rack == LEAF) as toleration:
        try:
            made = await kube.create(JOBS, _indexed_job(job, ns, name, rack, toleration),
                                     namespace=ns)
            assert made["spec"]["suspend"] is True  # Kueue's Job webhook

            async def placed() -> list[dict[str, Any]]:
                pods = (await kube.list(PODS, namespace=ns,
                                        label_selector=f"batch.kubernetes.io/job-name={job}"))
                return pods["items"] if len(bound(pods["items"])) == 2 else []
            pods = await eventually(placed, within=90,
                                    what="Kueue to admit and ungate, the binder to bind")
            assert sorted(p["spec"]["nodeName"] for p in pods) == ["kq-r1-0", "kq-r1-1"]
            for p in pods:  # where Kueue's assignment put each, with all 8 GPUs of it
                selector = p["spec"]["nodeSelector"]
                if to_nodes:
                    assert selector[keys.HOSTNAME_LABEL] == p["spec"]["nodeName"]
                else:
                    assert selector.get(rack) == "r1" and keys.HOSTNAME_LABEL not in selector
                assert p["spec"]["schedulerName"] == "muster-binder"
                assert sorted(assigned_indices(p)) == list(range(8))
        finally:  # (a Job deleted with its default propagation would leave its pods behind)
            try:
                await kube.delete(JOBS, job, ns, propagation_policy="Background")
            except ApiError as exc:
                if not exc.not_found:
                    raise


async def test_a_single_node_policy_where_kueue_spreads_the_gang_waits_and_says_why(
        kube: KubeApi, kueue: schedulers.Neighbour) -> None:
    """The shipped mpi-topology policy asks one node (singleNode) for an MPIJob of two 8-GPU
    workers, and Kueue's TAS, its levels down to nodes, puts them on two nodes of rack r1. No
    placement meets both: the binder binds none, and its Event names the conflict, each
    worker's node, rather than a want of free GPUs (docs/operations.md, "Beside Kueue")."""
    ns = await ensure_namespace(kube, "kueue-mpi", {
        keys.LABEL_GPU_TOPOLOGY: keys.LABEL_GPU_TOPOLOGY_ENABLED})
    async with _two_racks(kube, ns, "kueue-mpi", (RACK, keys.HOSTNAME_LABEL)) as toleration:
        try:
            await _submit_to(kube, "kq-mpi", "kueue-mpi", {keys.KUEUE_REQUIRED_TOPOLOGY: RACK},
                             ns=ns, gpus=8, tolerations=[toleration])
            job = await eventually(lambda: _admitted(kube, "kq-mpi", ns), within=60,
                                   what="Kueue to admit kq-mpi with a topology assignment")
            await _start(kube, job)
            message = await failed_scheduling(kube, ns, "kq-mpi-worker")
            assert (f"gang {ns}/kq-mpi must be on one node, but its members' node selectors, "
                    "affinity or tolerations leave them no node in common: "
                    f"{ns}/kq-mpi-worker-0 may use kq-r1-") in message, message
            selectors = {p["metadata"]["name"]: p["spec"]["nodeSelector"][keys.HOSTNAME_LABEL]
                         for p in await pods_of(kube, ns, "kq-mpi")
                         if p["metadata"]["labels"][operators.JOB_ROLE_LABEL] == "worker"}
            assert sorted(selectors.values()) == ["kq-r1-0", "kq-r1-1"], selectors
            for pod, node in selectors.items():  # each worker's node, as Kueue chose it
                assert f"{ns}/{pod} may use {node}" in message
            assert bound(await pods_of(kube, ns, "kq-mpi")) == []
            # `muster analyze` reads Kueue's queues and flavors, and warns of the policy
            found = [f for f in analyze(await collect(kube, NAMESPACE, RELEASE),
                                        dt.datetime.now(dt.UTC))
                     if f.code == "SingleNodeBesideKueueTAS"]
            assert [f.object for f in found] == ["SchedulingPolicy/mpi-topology"], found
            assert "is placed by Kueue's topology-aware scheduling" in found[0].message
        finally:
            await delete_jobs(kube, ns, ["kq-mpi"])


def _indexed_job(name: str, ns: str, queue: str, rack: str, toleration: dict[str, str]
                 ) -> dict[str, Any]:
    """An Indexed Job of two 8-GPU pods in Kueue `queue`, its pods within one `rack`, with
    `toleration`."""
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": ns, "labels": {QUEUE_LABEL: queue}},
            "spec": {"completionMode": "Indexed", "completions": 2, "parallelism": 2,
                     "template": {
                         "metadata": {"annotations": {keys.KUEUE_REQUIRED_TOPOLOGY: rack}},
                         "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                                  "tolerations": [toleration],
                                  "containers": [{"name": "train", "image": "train:1",
                                                  "resources": {
                                                      "requests": {"cpu": "10m",
                                                                   "memory": "32Mi"},
                                                      "limits": {keys.GPU_RESOURCE: "8"}}}]}}}}


async def _suspended(kube: KubeApi, name: str) -> bool:
    return bool((await kube.get(MPIJOBS, name, namespace=NS))["spec"]["runPolicy"]
                .get("suspend"))


async def test_the_binder_follows_a_topology_kueue_serves(
        kube: KubeApi, kueue: schedulers.Neighbour, node_cluster: NodeCluster,
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A Topology made through Kueue's API (its CRD and webhooks as the release installs them),
    named by `--network-levels kueue:NAME`: a binder run as the chart's binder service account,
    with the chart's grant, takes its levels. This release's levels are immutable, so an admin
    deletes and makes it again: the binder keeps the levels while it is gone, then takes the
    new ones."""
    caplog.set_level(logging.INFO, logger="webhook.binder.controller")
    name = "muster-test-tas"
    block, row = "example.com/block", "example.com/row"
    await kube.create(KUEUE_TOPOLOGIES, _kueue_topology(name, block, RACK, keys.HOSTNAME_LABEL))
    flag = f"kueue:{name}"
    config = BinderConfig(scheduler_name="muster-kueue-levels", network_levels=network_levels(
        flag))
    grant = chart_binder_grant(tmp_path, flag, "kueue.x-k8s.io", "muster-test-kueue-levels")
    try:
        async with binder_as_chart(kube, node_cluster, config, grant=grant, objects=[],
                                   ns=NS) as binder:
            await eventually(lambda: binder.plan_config.levels == Levels((block, RACK)),
                             within=30, what="the binder's levels from Kueue's Topology")
            edited = await kube.get(KUEUE_TOPOLOGIES, name)
            edited["spec"]["levels"][1]["nodeLabel"] = row
            with pytest.raises(ApiError, match="field is immutable"):
                await kube.replace(KUEUE_TOPOLOGIES, name, edited)
            await delete_now(kube, KUEUE_TOPOLOGIES.path(None, name))
            await eventually(lambda: any(f"Kueue Topology {name} was deleted" in r.getMessage()
                                         for r in caplog.records),
                             within=30, what="the deletion seen")
            assert binder.plan_config.levels == Levels((block, RACK))
            await kube.create(KUEUE_TOPOLOGIES,
                              _kueue_topology(name, block, row, keys.HOSTNAME_LABEL))
            await eventually(lambda: binder.plan_config.levels == Levels((block, row)),
                             within=30, what="the new levels followed")
    finally:
        await delete_now(kube, KUEUE_TOPOLOGIES.path(None, name))
