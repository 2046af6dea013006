"""Raw Kubernetes objects (plain dicts, as the API server sends them) for binder tests."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable
from typing import Any

from webhook import keys
from webhook.topology import codec
from webhook.topology.builtin import builtin
from webhook.topology.model import Topology

SCHED = keys.DEFAULT_BINDER_SCHEDULER_NAME
TOPO_REQUIRED = json.dumps({"v": 1, "mode": "required", "singleNode": True, "minRingGBps": None})


def node(name: str, *, kind: str | None = "dgx1-v100", cpu: str = "64", memory: str = "512Gi",
         pods: str = "110", gpus: int | None = None, labels: dict[str, str] | None = None,
         taints: list[dict[str, str]] | None = None, unschedulable: bool = False,
         rv: str = "1") -> dict[str, Any]:
    ann: dict[str, str] = {}
    alloc = {"cpu": cpu, "memory": memory, "pods": pods}
    if kind is not None:
        topo = builtin(kind)
        ann[keys.ANN_NODE_TOPOLOGY] = codec.encode(topo)
        alloc[keys.GPU_RESOURCE] = str(topo.size if gpus is None else gpus)
    elif gpus:
        alloc[keys.GPU_RESOURCE] = str(gpus)
    obj: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "resourceVersion": rv,
                     "labels": {"kubernetes.io/hostname": name, **(labels or {})},
                     "annotations": ann},
        "spec": {},
        "status": {"allocatable": alloc, "capacity": dict(alloc)},
    }
    if taints:
        obj["spec"]["taints"] = taints
    if unschedulable:
        obj["spec"]["unschedulable"] = True
    return obj


def pod(name: str, *, ns: str = "team-a", gang: str | None = None, min_member: int | None = None,
        gpus: int = 0, cpu: str = "1", memory: str = "1Gi", node_name: str | None = None,
        assignment: str | None = None, priority: int | None = None,
        created: str = "2026-11-21T05:00:00Z", scheduler: str = SCHED,
        topology: str | None = TOPO_REQUIRED, timeout: int | None = None,
        phase: str = "Pending", rv: str = "1", extra_spec: dict[str, Any] | None = None,
        labels: dict[str, str] | None = None, started: str | None = None) -> dict[str, Any]:
    ann: dict[str, str] = {}
    if gang is not None:
        ann[keys.ANN_GANG_NAME] = gang
        ann[keys.ANN_GANG_MIN_MEMBER] = str(min_member if min_member is not None else 1)
    if timeout is not None:
        ann[keys.ANN_GANG_TIMEOUT] = str(timeout)
    if topology is not None and gpus:
        ann[keys.ANN_GPU_TOPOLOGY] = topology
    if assignment is not None:
        ann[keys.ANN_GPU_ASSIGNMENT] = assignment
    limits: dict[str, Any] = {"cpu": cpu, "memory": memory}
    if gpus:
        limits[keys.GPU_RESOURCE] = str(gpus)
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "containers": [{"name": "main", "image": "train:1", "resources": {"limits": limits}}],
        "tolerations": [{"key": keys.TAINT_GPU_TOPOLOGY, "operator": "Exists",
                         "effect": "NoSchedule"}],
    }
    if node_name is not None:
        spec["nodeName"] = node_name
    if priority is not None:
        spec["priority"] = priority
    spec.update(extra_spec or {})
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "uid": f"uid-{ns}-{name}",
                     "resourceVersion": rv, "creationTimestamp": created,
                     "annotations": ann, "labels": labels or {}},
        "spec": spec,
        "status": {"phase": phase, **({"startTime": started} if started else {})},
    }


def job(name: str, workers: int = 4, gpus: int = 1, **kw: Any) -> list[dict[str, Any]]:
    """The reference MPIJob's pods: `workers` GPU workers and a 0-GPU launcher, one gang."""
    members = workers + 1
    out = [pod(f"{name}-worker-{i}", gang=name, min_member=members, gpus=gpus, **kw)
           for i in range(workers)]
    out.append(pod(f"{name}-launcher", gang=name, min_member=members, gpus=0, **kw))
    return out


#: the block and rack labels of `racked_nodes`
BLOCK, RACK = "example.com/block", "example.com/rack"


def racked_nodes() -> list[dict[str, Any]]:
    """2 blocks x 2 racks x 2 DGX-1 nodes; b1's racks first, so that order decides nothing."""
    return [node(f"b{b}-r{r}-n{i}", labels={BLOCK: f"b{b}", RACK: f"r{r}"})
            for b in (1, 0) for r in (1, 0) for i in range(2)]


def best_ring_links(topology: Topology, gpus: Iterable[int]) -> int:
    """Independent brute force: the most NVLink links every hop of some ring through `gpus`
    has (0: no NVLink ring)."""
    s = sorted(gpus)
    if len(s) < 2:
        return 0
    links = topology.nvlinks
    best = 0
    for rest in itertools.permutations(s[1:]):
        cycle = [s[0], *rest]
        best = max(best, min(links[cycle[i]][cycle[(i + 1) % len(cycle)]]
                             for i in range(len(cycle))))
    return best


def gpu_claims(pods: Iterable[dict[str, Any]]) -> list[tuple[str, int, str]]:
    """(node, GPU index, pod) for every GPU named by a live pod's assignment."""
    out = []
    for p in pods:
        if (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        text = (p["metadata"].get("annotations") or {}).get(keys.ANN_GPU_ASSIGNMENT)
        if text is None:
            continue
        doc = json.loads(text)
        for c in doc["containers"].values():
            out.extend((doc["node"], i, p["metadata"]["name"]) for i in c["indices"])
    return out



def claim(name: str, *, count: int = 1, ns: str = "team-a", device_class: str = keys.DRA_DRIVER,
          rv: str = "1", status: dict[str, Any] | None = None) -> dict[str, Any]:
    """A ResourceClaim asking for `count` GPUs of the class."""
    obj: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": ns, "uid": f"uid-claim-{name}",
                     "resourceVersion": rv},
        "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
            "deviceClassName": device_class, "allocationMode": "ExactCount",
            "count": count}}]}}}
    if status is not None:
        obj["status"] = status
    return obj


def dra_pod(name: str, claims: list[str], **kw: Any) -> dict[str, Any]:
    """A pod of no nvidia.com/gpu whose one container uses the named ResourceClaims."""
    obj = pod(name, **kw)
    obj["spec"]["resourceClaims"] = [{"name": f"c{i}", "resourceClaimName": c}
                                     for i, c in enumerate(claims)]
    obj["spec"]["containers"][0]["resources"]["claims"] = [
        {"name": f"c{i}"} for i in range(len(claims))]
    if claims:
        obj["metadata"]["annotations"][keys.ANN_GPU_TOPOLOGY] = TOPO_REQUIRED
    return obj


def resource_slice(node_name: str, gpus: Iterable[int]) -> dict[str, Any]:
    """The ResourceSlice our DRA driver publishes for a node."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node_name}-{keys.DRA_DRIVER}"},
            "spec": {"driver": keys.DRA_DRIVER, "nodeName": node_name,
                     "pool": {"name": node_name, "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": keys.dra_device_name(i)} for i in gpus]}}


def budget(app: str, allowed: int) -> dict[str, Any]:
    """A PodDisruptionBudget of team-a over the pods labelled app=`app`."""
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": f"pdb-{app}", "namespace": "team-a", "generation": 1},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": app}}},
            "status": {"observedGeneration": 1, "disruptionsAllowed": allowed}}
