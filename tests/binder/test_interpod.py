"""The binder keeps required podAffinity and podAntiAffinity as kube-scheduler's InterPodAffinity
filter does: the placed pods' terms and the gang's own, its members counted, and binds nothing
that breaks one."""

from __future__ import annotations

import json
from typing import Any

from binder_objects import node, pod
from binder_run import planned, where

from webhook.binder.interpod import Neighbours, violation
from webhook.binder.nodes import parse_node
from webhook.binder.planner import Plan
from webhook.binder.pods import parse_pod

BLOCK, RACK, HOST = "example.com/block", "example.com/rack", "kubernetes.io/hostname"
#: members may span nodes
SPANS = json.dumps({"v": 1, "mode": "preferred"})


def nodes() -> list[dict[str, Any]]:
    """2 blocks x 2 racks x 2 DGX-1 nodes; rack values repeat across blocks (r0, r1), as a
    topologyKey's domain is the label's value alone."""
    return [node(f"b{b}-r{r}-n{i}", labels={BLOCK: f"b{b}", RACK: f"r{r}"})
            for b in (0, 1) for r in (0, 1) for i in range(2)]


def term(key: str, **match: str) -> dict[str, Any]:
    return {"labelSelector": {"matchLabels": match}, "topologyKey": key}


def affinity(*, pod_affinity: list[dict[str, Any]] | None = None,
             anti: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    required = "requiredDuringSchedulingIgnoredDuringExecution"
    if pod_affinity:
        out["podAffinity"] = {required: pod_affinity}
    if anti:
        out["podAntiAffinity"] = {required: anti}
    return {"affinity": out}


def gang(name: str, n: int, gpus: int, labels: dict[str, str],
         spec: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    return [pod(f"{name}-{i}", gang=name, min_member=n, gpus=gpus, labels=labels,
                extra_spec=spec, topology=SPANS) for i in range(n)]


def placed(name: str, at: str, gpus: int, labels: dict[str, str],
           spec: dict[str, Any] | None = None) -> dict[str, Any]:
    return pod(name, gpus=gpus, node_name=at, topology=None, labels=labels, extra_spec=spec,
               scheduler="default-scheduler")


def run(pods: list[dict[str, Any]]) -> Plan:
    return planned(pods, nodes())


def test_a_placed_pods_anti_affinity_keeps_the_gang_off_its_node() -> None:
    # best fit would take the 4 GPUs left beside the database: the control shows it does
    db = placed("db", "b0-r0-n0", 4, {"app": "db"})
    control = run([db, *gang("j", 1, 4, {"app": "train"})])
    assert where(control) == {"j-0": "b0-r0-n0"}
    db = placed("db", "b0-r0-n0", 4, {"app": "db"}, affinity(anti=[term(HOST, app="train")]))
    p = run([db, *gang("j", 1, 4, {"app": "train"})])
    assert len(p.places) == 1 and where(p)["j-0"] != "b0-r0-n0"
    # a term that selects none of the gang's pods changes nothing
    db = placed("db", "b0-r0-n0", 4, {"app": "db"}, affinity(anti=[term(HOST, app="web")]))
    assert where(run([db, *gang("j", 1, 4, {"app": "train"})])) == {"j-0": "b0-r0-n0"}


def test_a_members_anti_affinity_keeps_it_out_of_every_node_of_that_domain_value() -> None:
    db = placed("db", "b0-r0-n0", 4, {"app": "db"})
    spec = affinity(anti=[term(RACK, app="db")])
    p = run([db, *gang("j", 2, 8, {"app": "train"}, spec)])
    assert len(p.places) == 1
    # rack r0 of block b1 is the same domain as b0's: the value is the domain
    assert all("-r1-" in n for n in where(p).values()), where(p)


def test_members_that_select_each_other_share_one_domain() -> None:
    # one free node in r1, 4-GPU holes in r0: fewest nodes alone spans both
    busy = [placed(f"r0-{at}", at, 4, {}) for at in ("b0-r0-n0", "b0-r0-n1", "b1-r0-n0",
                                                     "b1-r0-n1")]
    busy += [placed(f"r1-{at}", at, 8, {}) for at in ("b0-r1-n1", "b1-r1-n0", "b1-r1-n1")]
    labels = {"job": "j"}
    control = run([*busy, *gang("j", 3, 4, labels)])
    assert len({n.split("-")[1] for n in where(control).values()}) == 2
    p = run([*busy, *gang("j", 3, 4, labels, affinity(pod_affinity=[term(RACK, job="j")]))])
    assert len(p.places) == 1
    assert {n.split("-")[1] for n in where(p).values()} == {"r0"}, where(p)
    # a launcher without the term (an MPIJob's) rides along; the workers still share a rack
    workers = gang("k", 4, 4, labels | {"job": "k"},
                   affinity(pod_affinity=[term(RACK, job="k")]))[:3]
    launcher = pod("k-launcher", gang="k", min_member=4, gpus=0, topology=SPANS)
    p = run([*busy, *workers, launcher])
    assert len(p.places) == 1
    assert {n.split("-")[1] for k, n in where(p).items() if k != "k-launcher"} == {"r0"}


def test_affinity_to_placed_pods_follows_their_domain() -> None:
    cache = placed("cache", "b1-r1-n1", 0, {"app": "cache"})
    spec = affinity(pod_affinity=[term(BLOCK, app="cache")])
    p = run([cache, *gang("j", 2, 8, {"app": "train"}, spec)])
    assert len(p.places) == 1 and all(n.startswith("b1-") for n in where(p).values())


def test_a_gang_no_node_allows_waits_and_says_why() -> None:
    dbs = [placed("db0", "b0-r0-n0", 1, {"app": "db"}), placed("db1", "b1-r0-n0", 1,
                                                               {"app": "db"})]
    p = run([*dbs, *gang("j", 1, 8, {"app": "train"}, affinity(anti=[term(BLOCK, app="db")]))])
    assert not p.places
    assert "no node is allowed by its podAffinity and podAntiAffinity" in p.waits[0].reason
    # nodes are left, but too few: the engine's reason says what the terms took
    p = run([dbs[0], *gang("j", 5, 8, {"app": "train"}, affinity(anti=[term(BLOCK,
                                                                           app="db")]))])
    assert not p.places and p.waits[0].reason.endswith(
        "(inter-pod affinity rules out 4 of the 8 nodes pod team-a/j-0 could use otherwise)")
    lonely = affinity(pod_affinity=[term(BLOCK, app="nothing")])
    p = run(gang("k", 1, 8, {"app": "train"}, lonely))
    assert not p.places and "selects no pod on any node, and not the pod itself" in \
        p.waits[0].reason


def test_members_kept_apart_by_their_own_anti_affinity_get_a_node_each() -> None:
    # the engine packs two 1-GPU members on one node; one per node is what they ask
    control = run(gang("j", 2, 1, {"job": "j"}))
    assert len(set(where(control).values())) == 1
    p = run(gang("j", 2, 1, {"job": "j"}, affinity(anti=[term(HOST, job="j")])))
    assert len(p.places) == 1 and len(set(where(p).values())) == 2, where(p)
    # one per rack: the packed placement breaks it, so the members are placed one at a time
    p = run(gang("k", 2, 1, {"job": "k"}, affinity(anti=[term(RACK, job="k")])))
    assert len(p.places) == 1 and len({n.split("-")[1] for n in where(p).values()}) == 2
    # three cannot be: rack values r0 and r1 repeat across blocks, so there are two racks
    p = run(gang("k", 3, 1, {"job": "k"}, affinity(anti=[term(RACK, job="k")])))
    assert not p.places
    assert "podAntiAffinity (topologyKey example.com/rack) counts another pod" in \
        p.waits[0].reason and "one member at a time" in p.waits[0].reason
    # what that trial placed is forgotten: a job kept off k's nodes still takes the first one
    off_k = affinity(anti=[term(HOST, job="k")])
    p = run([*gang("k", 3, 1, {"job": "k"}, affinity(anti=[term(RACK, job="k")])),
             *gang("m", 1, 1, {"job": "m"}, off_k)])
    assert [w.gang.name for w in p.waits] == ["k"] and where(p) == {"m-0": "b0-r0-n0"}


def test_a_gang_placed_earlier_in_the_round_counts_for_the_next() -> None:
    keep_off = affinity(anti=[term(HOST, app="b")])
    first = gang("a", 1, 4, {"app": "a"}, keep_off)
    second = [pod("b-0", gang="b", min_member=1, gpus=4, labels={"app": "b"},
                  created="2026-11-21T05:00:01Z")]
    p = run([*first, *second])
    assert len(p.places) == 2
    assert where(p)["a-0"] != where(p)["b-0"]  # best fit alone puts b beside a


def test_an_affinity_namespace_selector_with_labels_is_refused_not_guessed() -> None:
    spec = affinity(pod_affinity=[{**term(BLOCK, app="x"),
                                   "namespaceSelector": {"matchLabels": {"team": "a"}}}])
    p = run(gang("j", 1, 8, {}, spec))
    assert not p.places and p.waits[0].kind == "invalid"
    assert "namespaceSelector with labels is not evaluated" in p.waits[0].reason


def test_an_anti_affinity_namespace_selector_counts_every_namespace() -> None:
    other = {**term(HOST, app="train"), "namespaceSelector": {"matchLabels": {"team": "b"}}}
    db = placed("db", "b0-r0-n0", 4, {"app": "db"}, affinity(anti=[other]))
    p = run([db, *gang("j", 1, 4, {"app": "train"})])
    assert len(p.places) == 1 and where(p)["j-0"] != "b0-r0-n0"


def test_violation_reads_the_gang_and_the_placed_pods() -> None:
    objs = {n["metadata"]["name"]: parse_node(n) for n in nodes()}
    together = affinity(pod_affinity=[term(RACK, job="j")])
    members = [parse_pod(p) for p in gang("j", 2, 8, {"job": "j"}, together)]
    nb = Neighbours((), (), objs)
    assert violation([(members[0], "b0-r0-n0"), (members[1], "b1-r0-n1")], nb) is None
    why = violation([(members[0], "b0-r0-n0"), (members[1], "b0-r1-n0")], nb)
    assert why is not None and "counts no other pod in example.com/rack=r0" in why
    # a pod of another namespace is not counted by a term that names none: the member is then
    # the first of its kind; one of its own namespace in another rack is, and it must join it
    x = placed("x", "b0-r0-n1", 0, {"job": "j"})
    elsewhere = parse_pod({**x, "metadata": {**x["metadata"], "namespace": "team-b"}})
    alone = [(members[0], "b0-r1-n0")]
    assert violation(alone, Neighbours([elsewhere], (), objs)) is None
    why = violation(alone, Neighbours([parse_pod(x)], (), objs))
    assert why is not None and "counts no other pod in example.com/rack=r1" in why


def test_three_jobs_that_keep_off_each_others_nodes_get_three_nodes_in_one_round() -> None:
    # one training job per node: each pod's anti-affinity by hostname selects every job's pods
    one_job_a_node = affinity(anti=[term(HOST, app="train")])
    jobs = [pod(f"{name}-0", gang=name, min_member=1, gpus=4, labels={"app": "train"},
                extra_spec=one_job_a_node, topology=SPANS, created=f"2026-11-21T05:00:0{i}Z")
            for i, name in enumerate("abc")]
    p = run(jobs)
    assert len(p.places) == 3, [w.reason for w in p.waits]
    assert len(set(where(p).values())) == 3


def test_subgroups_that_keep_together_and_apart_by_rack_are_placed_one_at_a_time() -> None:
    # a LeaderWorkerSet group in two subgroups with subgroup-exclusive-topology by rack: each
    # member's affinity selects its own subgroup, its anti-affinity the other's
    def member(i: int, group: str) -> dict[str, Any]:
        own = {"labelSelector": {"matchExpressions": [
            {"key": "sg", "operator": "In", "values": [group]}]}, "topologyKey": RACK}
        others = {"labelSelector": {"matchExpressions": [
            {"key": "sg", "operator": "Exists"},
            {"key": "sg", "operator": "NotIn", "values": [group]}]}, "topologyKey": RACK}
        return pod(f"j-{i}", gang="j", min_member=4, gpus=8, labels={"sg": group},
                   extra_spec=affinity(pod_affinity=[own], anti=[others]), topology=SPANS)

    p = run([member(0, "a"), member(1, "a"), member(2, "b"), member(3, "b")])
    assert len(p.places) == 1, [w.reason for w in p.waits]
    rack = {name: at.split("-")[1] for name, at in where(p).items()}
    assert rack["j-0"] == rack["j-1"] != rack["j-2"] == rack["j-3"]
