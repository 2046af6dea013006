"""Gangs placed by the network on the real control plane: 16 DGX nodes in 2 blocks x 2 racks
and an NVL72-style domain of 18 four-GPU nodes (two NVLink partitions, GFD clique labels),
with the binder's levels from the chart (`binder.networkLevels`: Topograph's spine and leaf,
then `nvidia.com/gpu.clique`) and the shipped policies of network-topology.yaml.

The Node objects carry what the node agent with fake NVML publishes (the topology annotation,
allocatable `nvidia.com/gpu`) and the labels Topograph and GFD write; no kubelet runs them, so
their pods are bound and stay Pending, and a gang "finishes" when the test marks its pods
Succeeded, as their kubelet would. A taint only these jobs tolerate keeps every other test's
pods off them."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest
from jobs import ensure_namespace
from real_helpers import NETWORK_LEVELS, failed_scheduling, fake_node

from e2e.node import image
from e2e.probes import eventually
from webhook import keys
from webhook.kube import JOBS, NODES, PODS, ApiError, KubeApi
from webhook.topology import builtin
from webhook.topology.model import GPU, PCIeLevel, Topology

SPINE, LEAF, CLIQUE = NETWORK_LEVELS
FAKE_TAINT = {"key": "example.com/fake-node", "value": "network-test", "effect": "NoSchedule"}
NVL_UUID = "2f1c6a3e-0b7d-4c55-9e1a-6d0c2b8f4a10"


def _gb200() -> Topology:
    """A four-GPU GB200-style node: every pair over NVSwitch (NVLink 5, 18 links x 50 GB/s)."""
    gpus = tuple(GPU(i, f"GPU-0000{i}-nvl72-fake-{i}", f"0000:0{i}:00.0", "NVIDIA GB200",
                     numa_node=i // 2) for i in range(4))
    return Topology(gpus, tuple((0,) * 4 for _ in range(4)),
                    tuple(tuple(PCIeLevel.SYS if i != j else PCIeLevel.INTERNAL
                                for j in range(4)) for i in range(4)),
                    nvlink_gbps=50.0, nvswitch=frozenset(range(4)), nvswitch_links=18,
                    name="", pcie_gen=5)


def _node(name: str, topology: Topology, labels: dict[str, str]) -> dict[str, Any]:
    return fake_node(name, topology, labels, FAKE_TAINT)


def _nodes() -> list[dict[str, Any]]:
    dgx = builtin("hgx-h100")
    out = [_node(f"net-s{b}-l{r}-{i}", dgx, {SPINE: f"s{b}", LEAF: f"s{b}-l{r}"})
           for b in (1, 2) for r in (1, 2) for i in range(4)]
    nvl = _gb200()
    out += [_node(f"net-nvl-{i:02d}", nvl, {SPINE: "s3", LEAF: "s3-nvl",
                                            CLIQUE: f"{NVL_UUID}.{1 + i // 9}"})
            for i in range(18)]
    return out


@pytest.fixture
async def fake_nodes(kube: KubeApi) -> AsyncIterator[dict[str, dict[str, str]]]:
    """The nodes, by name, with their labels; gone afterwards with every pod on them."""
    made = _nodes()
    try:
        for n in made:
            await kube.create(NODES, n)
            # the API server may add the not-ready taint until a node controller sees the node;
            # the jobs here tolerate every taint, and the binder reads the rest
        yield {n["metadata"]["name"]: n["metadata"]["labels"] for n in made}
    finally:
        for ns in NAMESPACES.values():
            await _drop_namespace_jobs(kube, ns)
        for n in made:
            try:
                await kube.delete(NODES, n["metadata"]["name"])
            except ApiError as exc:
                if not exc.not_found:
                    raise


NAMESPACES = {"rack": "net-rack", "block": "net-block", "nvlink-slices": "net-slices",
              "as-annotated": "net-kueue", "neighbours": "net-db", "nvlink-domain": "net-nvlink"}


async def _delete_now(kube: KubeApi, ns: str, pod: dict[str, Any]) -> None:
    """The pod gone at once (no kubelet runs these nodes' pods to finish it)."""
    await kube.request("DELETE", PODS.path(ns, pod["metadata"]["name"]), body={
        "kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0})


async def _drop_namespace_jobs(kube: KubeApi, ns: str) -> None:
    try:
        for job in (await kube.list(JOBS, namespace=ns))["items"]:
            await kube.delete(JOBS, job["metadata"]["name"], ns, propagation_policy="Orphan")
        for pod in (await kube.list(PODS, namespace=ns))["items"]:
            await _delete_now(kube, ns, pod)
    except ApiError as exc:
        if not exc.not_found:
            raise


def _job(name: str, pods: int, gpus: int, annotations: dict[str, str] | None = None, *,
         on_job: dict[str, str] | None = None, labels: dict[str, str] | None = None,
         affinity: dict[str, Any] | None = None,
         spread: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """An Indexed Job of `pods` ranks of `gpus` GPUs each (its completion index is its rank);
    `annotations`, `labels`, `affinity` and `spread` (topologySpreadConstraints) on its pod
    template, `on_job` on the Job itself."""
    more: dict[str, Any] = {"affinity": affinity} if affinity else {}
    if spread:
        more["topologySpreadConstraints"] = spread
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "annotations": on_job or {}},
            "spec": {"completionMode": "Indexed", "completions": pods, "parallelism": pods,
                     "backoffLimit": 0,
                     "template": {"metadata": {"annotations": annotations or {},
                                               "labels": labels or {}}, "spec": {
                         **more,
                         "restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                         "tolerations": [{"operator": "Exists"}],
                         "containers": [{
                             "name": "rank", "image": f"{image.IMAGE_REPOSITORY}:"
                             f"{image.IMAGE_TAG}", "imagePullPolicy": "Never",
                             "command": ["sleep", "3600"],
                             "resources": {"requests": {"cpu": "10m", "memory": "32Mi"},
                                           "limits": {keys.GPU_RESOURCE: str(gpus)}}}]}}}}


async def _pods(kube: KubeApi, ns: str, job: str) -> list[dict[str, Any]]:
    found = await kube.list(PODS, namespace=ns, label_selector=f"job-name={job}")
    return sorted(found["items"], key=lambda p: int(
        p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"]))


async def _run(kube: KubeApi, kind: str, job: dict[str, Any]) -> list[dict[str, Any]]:
    """The job in the namespace of policy network-`kind`, once every rank is bound; its pods in
    rank order."""
    ns = await ensure_namespace(kube, NAMESPACES[kind], {"muster.io/network": kind})
    await kube.create(JOBS, job, namespace=ns)
    return await _bound(kube, ns, job["metadata"]["name"], job["spec"]["parallelism"])


async def _bound(kube: KubeApi, ns: str, name: str, pods: int, *, within: float = 120
                 ) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []

    async def all_bound() -> bool:
        nonlocal found
        found = await _pods(kube, ns, name)
        return len(found) == pods and all(p["spec"].get("nodeName") for p in found)
    await eventually(all_bound, within=within, interval=1.0, what=f"{ns}/{name} bound whole")
    return found


#: Volcano's network topology on a pod template: one domain of at most tier 2
VOLCANO_HARD_2 = {keys.VOLCANO_NETWORK_TOPOLOGY_MODE: "hard",
                  keys.VOLCANO_NETWORK_TOPOLOGY_HIGHEST_TIER: "2"}


async def _delete_job(kube: KubeApi, ns: str, name: str) -> None:
    """The job and its pods gone at once."""
    await kube.delete(JOBS, name, ns, propagation_policy="Orphan")
    for pod in await _pods(kube, ns, name):
        await _delete_now(kube, ns, pod)


def _at(pods: list[dict[str, Any]], labels: dict[str, dict[str, str]], level: str) -> set[str]:
    return {labels[p["spec"]["nodeName"]].get(level, "-") for p in pods}


async def test_gangs_land_within_the_network_domains_they_ask_for(
        kube: KubeApi, fake_nodes: dict[str, dict[str, str]]) -> None:
    labels = fake_nodes
    # a required-rack gang: one leaf
    rack = await _run(kube, "rack", _job("in-one-rack", 3, 8))
    assert len(_at(rack, labels, LEAF)) == 1, _at(rack, labels, LEAF)
    assert all(p["metadata"]["annotations"][keys.ANN_POLICY].startswith("network-rack")
               for p in rack)

    # a preferred-block gang that fits no rack (6 x 8 GPUs, a rack holds 4): one block, and in
    # it the fewest racks (two)
    block = await _run(kube, "block", _job("in-one-block", 6, 8))
    assert len(_at(block, labels, SPINE)) == 1 and len(_at(block, labels, LEAF)) == 2

    # a job written for Kueue TAS: its podset-required-topology is honoured the same way
    kueue = await _run(kube, "as-annotated",
                       _job("kueue-job", 2, 8, {keys.KUEUE_REQUIRED_TOPOLOGY: LEAF}))
    assert len(_at(kueue, labels, LEAF)) == 1

    # a job written for Volcano: hard, within one domain of at most tier 2 (the binder's levels
    # counted up from the narrowest: tier 1 the clique, which no DGX node has, tier 2 the leaf)
    volcano = await _run(kube, "as-annotated", _job("volcano-job", 2, 8, VOLCANO_HARD_2))
    assert json.loads(volcano[0]["metadata"]["annotations"][keys.ANN_GPU_TOPOLOGY])[
        "network"] == {"level": "tier:1", "mode": "preferred", "maxLevel": "tier:2"}
    assert len(_at(volcano, labels, LEAF)) == 1
    await _delete_job(kube, NAMESPACES["as-annotated"], "volcano-job")

    # tensor-parallel slices of 8 ranks x 4 GPUs: each within one NVLink clique; a clique
    # (9 nodes x 4 GPUs) holds one slice, so the two take one clique each
    sliced = await _run(kube, "nvlink-slices", _job("slices", 16, 4))
    first, second = _at(sliced[:8], labels, CLIQUE), _at(sliced[8:], labels, CLIQUE)
    assert len(first) == len(second) == 1 and first != second, (first, second)

    # a required-block gang (Kueue's annotation again) that cannot fit now waits, with the
    # Event in plain words: s1 has 5 free nodes (the rack job holds one), s2 none, and the NVL
    # block's nodes hold no 8-GPU rank ...
    ns = NAMESPACES["as-annotated"]
    await kube.create(JOBS, _job("waits", 6, 8, {keys.KUEUE_REQUIRED_TOPOLOGY: SPINE}),
                      namespace=ns)

    message = await failed_scheduling(kube, ns, "waits")
    assert message == (
        f"gang {ns}/waits cannot be placed: gang {ns}/waits needs 48 GPUs (6 members x 8 GPUs) "
        f"within one {SPINE} domain; the largest free one ({SPINE}=s1) has 40 free GPUs")
    assert not any(p["spec"].get("nodeName") for p in await _pods(kube, ns, "waits"))

    # ... and starts whole, in one block, once the block gang finishes (its kubelet would
    # report its pods Succeeded)
    for p in block:
        await kube.patch(PODS, p["metadata"]["name"], {"status": {"phase": "Succeeded"}},
                         NAMESPACES["block"], subresource="status")
    placed = await _bound(kube, ns, "waits", 6)
    assert _at(placed, labels, SPINE) == _at(block, labels, SPINE)

    # a job written for KAI: its annotations on the Job itself (where KAI's pod grouper reads
    # them), the rack named by its alias in the binder's levels (KAI's Topology `alias`), and
    # segments of 2 ranks each on one node
    kai = {keys.KAI_REQUIRED_PLACEMENT: "rack", keys.KAI_SEGMENT_SIZE: "2",
           keys.KAI_SEGMENT_REQUIRED_PLACEMENT: "kubernetes.io/hostname"}
    await kube.create(JOBS, _job("kai-job", 4, 4, on_job=kai), namespace=ns)
    ranks = await _bound(kube, ns, "kai-job", 4)
    assert json.loads(ranks[0]["metadata"]["annotations"][keys.ANN_GPU_TOPOLOGY])["network"] == {
        "level": "rack", "mode": "required", "sliceLevel": "kubernetes.io/hostname",
        "sliceSize": 2}
    assert len(_at(ranks, labels, LEAF)) == 1
    by_rank = [p["spec"]["nodeName"] for p in ranks]
    assert by_rank[0] == by_rank[1] and by_rank[2] == by_rank[3], by_rank

    # a job written for Kueue's unconstrained pod set: its ranks fill the gaps, each where it
    # fits best alone. A 5-GPU rank leaves the only partly used node here (a DGX) 3 free GPUs;
    # the three 1-GPU ranks take exactly those, where the gang on its fewest nodes would take
    # the fastest 3-GPU set, on a free NVL72 node. (Both kept to these nodes: the cluster's
    # real node has gaps of its own.)
    here = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": SPINE, "operator": "Exists"}]}]}}}
    await kube.create(JOBS, _job("gap", 1, 5, affinity=here), namespace=ns)
    gap = (await _bound(kube, ns, "gap", 1))[0]["spec"]["nodeName"]
    await kube.create(JOBS, _job("fills-gaps", 3, 1, {keys.KUEUE_UNCONSTRAINED_TOPOLOGY: "true"},
                                 affinity=here), namespace=ns)
    ranks = await _bound(kube, ns, "fills-gaps", 3)
    assert json.loads(ranks[0]["metadata"]["annotations"][keys.ANN_GPU_TOPOLOGY])["network"] \
        == {"unconstrained": True}
    assert {p["spec"]["nodeName"] for p in ranks} == {gap}

    # Volcano's hard tier 2 is the leaf: five 8-GPU ranks fit no leaf (4 nodes), so they wait
    await kube.create(JOBS, _job("volcano-wide", 5, 8, VOLCANO_HARD_2), namespace=ns)
    message = await failed_scheduling(kube, ns, "volcano-wide")
    assert f"within one {LEAF} domain" in message, message
    assert not any(p["spec"].get("nodeName") for p in await _pods(kube, ns, "volcano-wide"))


#: training pods of every namespace stay out of the leaf of a pod that carries this (required
#: podAntiAffinity; without a namespaceSelector it would count its own namespace's pods alone)
NO_TRAINING_IN_MY_LEAF = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
    {"labelSelector": {"matchLabels": {"app": "train"}}, "namespaceSelector": {},
     "topologyKey": LEAF}]}}


#: the same as a preference
TRAINING_BETTER_AWAY = {"podAntiAffinity": {
    "preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 100,
         "podAffinityTerm": NO_TRAINING_IN_MY_LEAF["podAntiAffinity"][
             "requiredDuringSchedulingIgnoredDuringExecution"][0]}]}}


async def _neighbour(kube: KubeApi, name: str, node: str,
                     affinity: dict[str, Any] = NO_TRAINING_IN_MY_LEAF) -> None:
    """A CPU-only pod on `node`, bound by its own nodeName (no scheduler), that keeps training
    pods out of the node's leaf (by default; else by `affinity`)."""
    ns = await ensure_namespace(kube, NAMESPACES["neighbours"])
    await kube.create(PODS, {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "db"}},
        "spec": {"nodeName": node, "affinity": affinity,
                 "terminationGracePeriodSeconds": 0, "tolerations": [{"operator": "Exists"}],
                 "containers": [{"name": "db", "image": f"{image.IMAGE_REPOSITORY}:"
                                 f"{image.IMAGE_TAG}", "imagePullPolicy": "Never",
                                 "command": ["sleep", "3600"],
                                 "resources": {"requests": {"cpu": "10m",
                                                            "memory": "32Mi"}}}]}},
        namespace=ns)


async def test_a_gang_that_needs_nvlink_speed_takes_one_nvlink_clique(
        kube: KubeApi, fake_nodes: dict[str, dict[str, str]]) -> None:
    """Policy network-nvlink-domain: the whole gang in one NVLink clique, its allreduce at 400
    GB/s or more. Its ranks span GB200 trays, which the clique's NVLink joins at 900 GB/s (the
    network between nodes gives 12.5): it is placed there; a gang bigger than any clique waits,
    and says so."""
    labels = fake_nodes
    pods = await _run(kube, "nvlink-domain", _job("nvlink", 6, 4))  # 6 of a clique's 9 trays
    request = json.loads(pods[0]["metadata"]["annotations"][keys.ANN_GPU_TOPOLOGY])
    assert request["minRingGBps"] == 400.0 and request["network"] == {
        "level": CLIQUE, "mode": "required"}
    cliques = _at(pods, labels, CLIQUE)
    assert len(cliques) == 1 and "-" not in cliques, cliques
    assert len({p["spec"]["nodeName"] for p in pods}) == 6  # a tray each: NVLink between them
    # 10 trays: more than a clique has (9), so it waits, with the reason in the Event
    ns = NAMESPACES["nvlink-domain"]
    await kube.create(JOBS, _job("too-wide", 10, 4), namespace=ns)
    message = await failed_scheduling(kube, ns, "too-wide")
    assert f"within one {CLIQUE} domain" in message, message
    assert not any(p["spec"].get("nodeName") for p in await _pods(kube, ns, "too-wide"))


async def test_the_binder_keeps_the_anti_affinity_of_pods_already_placed(
        kube: KubeApi, fake_nodes: dict[str, dict[str, str]]) -> None:
    labels = fake_nodes
    ns = NAMESPACES["rack"]
    # one rank fills a node of some leaf: that leaf is now the fullest that holds 3 more
    filler = await _run(kube, "rack", _job("filler", 1, 8))
    (full,) = _at(filler, labels, LEAF)
    node_of = {leaf: sorted(n for n, lb in labels.items() if lb.get(LEAF) == leaf)
               for leaf in {lb[LEAF] for lb in labels.values()} if not leaf.endswith("nvl")}
    await _neighbour(kube, "db-0", node_of[full][1])
    # a training job of 3 x 8 GPUs keeps out of the database's leaf ...
    train = await _run(kube, "rack", _job("train", 3, 8, labels={"app": "train"}))
    assert len(_at(train, labels, LEAF)) == 1 and _at(train, labels, LEAF) != {full}
    # ... where best fit alone puts the same job without the label the database selects
    control = await _run(kube, "rack", _job("control", 3, 8))
    assert _at(control, labels, LEAF) == {full}

    # with such a pod in every DGX leaf, the next training job waits and says why ...
    others = sorted(set(node_of) - {full})
    for i, leaf in enumerate(others, start=1):
        await _neighbour(kube, f"db-{i}", node_of[leaf][0])
    await kube.create(JOBS, _job("waits", 1, 8, labels={"app": "train"}), namespace=ns)

    message = await failed_scheduling(kube, ns, "waits")
    # (the NVL72 trays are still allowed, but hold no 8-GPU rank)
    assert re.search(r"inter-pod affinity rules out 16 of the \d+ nodes pod ", message), message
    assert not any(p["spec"].get("nodeName") for p in await _pods(kube, ns, "waits"))
    # ... and starts in the leaf whose database goes away
    freed = others[-1]
    await kube.request("DELETE", PODS.path(NAMESPACES["neighbours"], f"db-{len(others)}"),
                       body={"kind": "DeleteOptions", "apiVersion": "v1",
                             "gracePeriodSeconds": 0})
    placed = await _bound(kube, ns, "waits", 1)
    assert _at(placed, labels, LEAF) == {freed}

    # ranks that keep one per node get a node each: best fit alone packs two 4-GPU ranks on one
    one_each = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"job": "apart"}},
         "topologyKey": "kubernetes.io/hostname"}]}}
    apart = await _run(kube, "rack", _job("apart", 2, 4, labels={"job": "apart"},
                                          affinity=one_each))
    assert len({p["spec"]["nodeName"] for p in apart}) == 2
    assert len(_at(apart, labels, LEAF)) == 1


def _spread(key: str, job: str) -> list[dict[str, Any]]:
    """One rank of `job` more in a domain of `key` than in the emptiest, at most."""
    return [{"maxSkew": 1, "topologyKey": key, "whenUnsatisfiable": "DoNotSchedule",
             "labelSelector": {"matchLabels": {"job": job}}}]


async def test_ranks_kept_apart_by_spread_or_anti_affinity_are_placed_one_at_a_time(
        kube: KubeApi, fake_nodes: dict[str, dict[str, str]]) -> None:
    labels = fake_nodes
    # 4 ranks of 4 GPUs, one per node (the engine alone packs two on a node: the test above)
    host = await _run(kube, "block", _job("host", 4, 4, labels={"job": "host"},
                                          spread=_spread("kubernetes.io/hostname", "host")))
    assert len({p["spec"]["nodeName"] for p in host}) == 4
    assert len(_at(host, labels, LEAF)) == 1  # (placed one at a time, close to the first)
    # 3 ranks of 8 GPUs, one per leaf: the preferred spine's fullest leaf would take all three,
    # so they are placed one at a time, as kube-scheduler binds them (the NVL72 leaf is a
    # domain with no rank, so no leaf may hold two)
    leaves = await _run(kube, "block", _job("leaves", 3, 8, labels={"job": "leaves"},
                                            spread=_spread(LEAF, "leaves")))
    assert len(_at(leaves, labels, LEAF)) == 3
    # the same by podAntiAffinity: 2 ranks kept out of each other's leaf
    one_a_leaf = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"job": "apart"}}, "topologyKey": LEAF}]}}
    apart = await _run(kube, "block", _job("apart", 2, 8, labels={"job": "apart"},
                                           affinity=one_a_leaf))
    assert len(_at(apart, labels, LEAF)) == 2
    # a gang required within one leaf cannot also be one rank per leaf: it waits, and says so
    ns = await ensure_namespace(kube, NAMESPACES["rack"], {"muster.io/network": "rack"})
    await kube.create(JOBS, _job("torn", 2, 8, labels={"job": "torn"},
                                 spread=_spread(LEAF, "torn")), namespace=ns)
    message = await failed_scheduling(kube, ns, "torn")
    assert f"its topologySpreadConstraint (topologyKey {LEAF}, maxSkew 1) would make a skew " \
        "of 2 there" in message, message
    assert not any(p["spec"].get("nodeName") for p in await _pods(kube, ns, "torn"))


def _prefer(weight: int, **term: Any) -> dict[str, Any]:
    """Preferred node affinity: one term of `weight`."""
    return {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": weight, "preference": term}]}}


async def test_preferred_node_affinity_is_weighed_after_the_network(
        kube: KubeApi, fake_nodes: dict[str, dict[str, str]]) -> None:
    labels = fake_nodes
    # the control: best fit and the names put a required-rack gang of 2 x 8 GPUs in some leaf,
    # which it half fills; the fullest leaf is then the best fit for the next such gang ...
    control = await _run(kube, "rack", _job("control", 2, 8))
    (fullest,) = _at(control, labels, LEAF)
    other = next(lb[LEAF] for lb in labels.values()
                 if lb[LEAF] not in (fullest,) and not lb[LEAF].endswith("nvl"))
    # ... unless it prefers another leaf, where it fits as well: it goes there
    to_other = _prefer(80, matchExpressions=[{"key": LEAF, "operator": "In",
                                              "values": [other]}])
    chosen = await _run(kube, "rack", _job("chosen", 2, 8, affinity=to_other))
    assert _at(chosen, labels, LEAF) == {other}
    # two half-full leaves now, which best fit takes first; a placed pod in each that prefers
    # training pods out of its leaf: a training gang, with no preference of its own, goes to
    # an empty leaf, which holds it as well
    for i, pod in enumerate((control[0], chosen[0])):
        await _neighbour(kube, f"quiet-db-{i}", pod["spec"]["nodeName"], TRAINING_BETTER_AWAY)
    away = await _run(kube, "rack", _job("away", 2, 8, labels={"app": "train"}))
    assert len(_at(away, labels, LEAF)) == 1
    assert not _at(away, labels, LEAF) & {fullest, other}, _at(away, labels, LEAF)
    # a preference never widens the gang: two preferred nodes in two leaves of one spine, and
    # a gang that prefers one spine, and within it the fewest leaves, stays in one leaf
    spine = labels[next(iter(control))["spec"]["nodeName"]][SPINE]
    split = sorted({lb[LEAF]: n for n, lb in labels.items() if lb.get(SPINE) == spine
                    and lb[LEAF] not in (fullest, other)}.values())
    if len(split) < 2:  # (the other leaf was in another spine: take two of this spine's)
        split = sorted({lb[LEAF]: n for n, lb in labels.items()
                        if lb.get(SPINE) == spine}.values())
    # (a node field selector names one node: the hostname label names both)
    apart = _prefer(100, matchExpressions=[{"key": "kubernetes.io/hostname", "operator": "In",
                                            "values": split}])
    kept = await _run(kube, "block", _job("kept", 2, 8, affinity=apart))
    assert len(_at(kept, labels, LEAF)) == 1, [p["spec"]["nodeName"] for p in kept]
