"""The binder weighs preferred node affinity, preferred pod (anti-)affinity and ScheduleAnyway
topology spread as kube-scheduler's score plugins do, after the gang's topology: among the
placements the engine finds as good (nodes, allreduce bandwidth, network domain), the one on
the nodes its members prefer."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from binder_objects import node, pod
from binder_run import CFG, planned, where

from webhook import keys
from webhook.binder.allocation import Allocation
from webhook.binder.assignment import build_assignment, encode_assignment
from webhook.binder.interpod import Neighbours
from webhook.binder.nodes import parse_node
from webhook.binder.planner import Plan, PlanConfig
from webhook.binder.pods import PodTerm, Preferences, Requirement, Term, parse_pod
from webhook.binder.prefer import Scores, as_good
from webhook.jsonpatch import apply_patch
from webhook.policy.engine import evaluate
from webhook.policy.loader import load_policy_texts
from webhook.policy.patch import render_patch
from webhook.topology.builtin import builtin
from webhook.topology.model import GangPlacement, MemberPlacement, MemberRequest
from webhook.topology.network import Levels

BLOCK, RACK, HOST = "example.com/block", "example.com/rack", "kubernetes.io/hostname"
POOL = "example.com/pool"
#: members may span nodes
SPANS = json.dumps({"v": 1, "mode": "preferred"})
TOPO = builtin("dgx1-v100")


def nodes(pools: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """2 blocks x 2 racks x 2 DGX-1 nodes, each in the pool `pools` names for it (none else)."""
    out = []
    for b in (0, 1):
        for r in (0, 1):
            for i in range(2):
                name = f"b{b}-r{r}-n{i}"
                labels = {HOST: name, BLOCK: f"b{b}", RACK: f"r{r}"}
                if pools and name in pools:
                    labels[POOL] = pools[name]
                out.append(node(name, labels=labels))
    return out


def prefer_pool(weight: int, *values: str) -> dict[str, Any]:
    return {"weight": weight, "preference": {"matchExpressions": [
        {"key": POOL, "operator": "In", "values": list(values)}]}}


def affinity(**kinds: Any) -> dict[str, Any]:
    return {"affinity": kinds}


def gang(n: int, gpus: int, spec: dict[str, Any] | None = None, *,
         topology: str = SPANS) -> list[dict[str, Any]]:
    return [pod(f"j-{i}", gang="j", min_member=n, gpus=gpus, labels={"job": "j"},
                extra_spec=spec, topology=topology) for i in range(n)]


def placed(name: str, where: str, labels: dict[str, str], gpus: int = 0) -> dict[str, Any]:
    """A pod of another scheduler already running on `where`."""
    return pod(name, gpus=gpus, node_name=where, topology=None, labels=labels,
               scheduler="default-scheduler", phase="Running")


def run(pods: list[dict[str, Any]], objs: list[dict[str, Any]] | None = None,
        levels: Levels | None = None) -> Plan:
    config = CFG if levels is None else PlanConfig(scheduler_name=CFG.scheduler_name,
                                                   levels=levels)
    return planned(pods, objs or nodes(), config)


def test_the_preferred_terms_are_read_with_their_weights() -> None:
    anti = {"weight": 30, "podAffinityTerm": {"labelSelector": {"matchLabels": {"app": "db"}},
                                              "topologyKey": HOST}}
    near = {"weight": 5, "podAffinityTerm": {"labelSelector": {"matchLabels": {"app": "c"}},
                                             "topologyKey": RACK, "namespaces": ["data"]}}
    labelled = {"weight": 5, "podAffinityTerm": {
        "labelSelector": {"matchLabels": {"app": "c"}}, "topologyKey": RACK,
        "namespaceSelector": {"matchLabels": {"team": "x"}}}}
    soft = {"maxSkew": 2, "topologyKey": RACK, "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": {"job": "j"}}}
    spec = {**affinity(
        nodeAffinity={"preferredDuringSchedulingIgnoredDuringExecution": [
            prefer_pool(20, "on-demand")]},
        podAntiAffinity={"preferredDuringSchedulingIgnoredDuringExecution": [anti]},
        podAffinity={"preferredDuringSchedulingIgnoredDuringExecution": [near, labelled]}),
        "topologySpreadConstraints": [soft]}
    (p,) = gang(1, 8, spec)
    info = parse_pod(p)
    assert not info.problems and info.spread == ()  # (a soft constraint filters nothing)
    prefs = info.preferences
    assert prefs is not None
    assert prefs.nodes == ((20, Term((Requirement(POOL, "In", ("on-demand",)),))),)
    # podAntiAffinity weighs against; a namespaceSelector with labels is not weighed
    assert prefs.pods == (
        (5, PodTerm((("In", "app", frozenset({"c"})),), frozenset({"data"}), RACK)),
        (-30, PodTerm((("In", "app", frozenset({"db"})),), frozenset({"team-a"}), HOST)))
    assert [(t.max_skew, t.topology_key) for t in prefs.spread] == [(2, RACK)]
    assert parse_pod(gang(1, 8)[0]).preferences is None
    bad = affinity(nodeAffinity={"preferredDuringSchedulingIgnoredDuringExecution": [
        prefer_pool(0, "x")]})
    assert "nodeAffinity: each preferred term needs a weight of 1-100" in \
        parse_pod(gang(1, 8, bad)[0]).problems


def test_a_gang_goes_to_the_nodes_its_members_prefer() -> None:
    pools = {"b1-r1-n0": "on-demand", "b1-r1-n1": "on-demand"}
    assert where(run(gang(2, 8), nodes(pools))) == {"j-0": "b0-r0-n0", "j-1": "b0-r0-n1"}
    spec = affinity(nodeAffinity={"preferredDuringSchedulingIgnoredDuringExecution": [
        prefer_pool(50, "on-demand")]})
    assert where(run(gang(2, 8, spec), nodes(pools))) == {"j-0": "b1-r1-n0",
                                                          "j-1": "b1-r1-n1"}


def test_a_policy_s_preferred_models_steer_the_gang_as_the_webhook_writes_them() -> None:
    """`topology.preferredModels` end to end: the policy engine's patch on the pod, the
    binder's parse of it, the plan. H100 first, then A100; V100 is allowed, not preferred."""
    ps = load_policy_texts({"p.yaml": (
        "apiVersion: muster.io/v1alpha1\nkind: SchedulingPolicy\nmetadata: {name: models}\n"
        "spec:\n  gang: {backend: muster}\n  topology:\n    mode: preferred\n"
        "    allowedModels: [NVIDIA H100 80GB HBM3, NVIDIA A100-SXM4-80GB, Tesla V100]\n"
        "    preferredModels: [NVIDIA H100 80GB HBM3, NVIDIA A100-SXM4-80GB]\n")})
    models = {"b1-r1-n1": "NVIDIA-H100-80GB-HBM3", "b1-r0-n1": "NVIDIA-A100-SXM4-80GB"}
    cluster = nodes()
    for n in cluster:
        n["metadata"]["labels"][keys.LABEL_GPU_MODEL] = models.get(n["metadata"]["name"],
                                                                   "Tesla-V100")

    def admitted(*placed_pods: dict[str, Any]) -> dict[str, str]:
        p = pod("j-0", gpus=8, topology=None)  # as its job made it: a gang of one, here
        decision = evaluate(p, namespace_labels={}, owners=[], policies=ps)
        assert decision.node_preferences and not decision.warnings, decision.warnings
        return where(run([*placed_pods, apply_patch(p, render_patch(p, decision))], cluster))
    assert admitted() == {"j-0": "b1-r1-n1"}
    assert admitted(placed("x", "b1-r1-n1", {}, gpus=8)) == {"j-0": "b1-r0-n1"}
    # a gang without the preference: best fit, by name
    assert where(run(gang(1, 8), cluster)) == {"j-0": "b0-r0-n0"}


def test_weights_add_up_and_the_best_scored_node_wins() -> None:
    pools = {"b0-r1-n0": "spot", "b1-r0-n0": "on-demand", "b1-r1-n1": "reserved"}
    spec = affinity(nodeAffinity={"preferredDuringSchedulingIgnoredDuringExecution": [
        prefer_pool(10, "spot", "reserved"), prefer_pool(40, "on-demand", "reserved")]})
    assert where(run(gang(1, 8, spec), nodes(pools))) == {"j-0": "b1-r1-n1"}
    # that node busy: the next best, on-demand (40) over spot (10)
    busy = placed("x", "b1-r1-n1", {}, gpus=8)
    assert where(run([busy, *gang(1, 8, spec)], nodes(pools))) == {"j-0": "b1-r0-n0"}


def test_a_preference_never_costs_the_gang_bandwidth() -> None:
    # the preferred node has 4 GPUs free, {0, 2, 5, 7}, which have no NVLink ring; other
    # nodes have a whole NVLink quad: the 4-GPU pod goes to one of them
    def held(where: str, gpus: tuple[int, ...]) -> dict[str, Any]:
        return pod(f"held-{where}", gpus=4, node_name=where, phase="Running",
                   assignment=encode_assignment(build_assignment(where, TOPO, gpus,
                                                                 [("main", 4)])))
    spec = affinity(nodeAffinity={"preferredDuringSchedulingIgnoredDuringExecution": [
        prefer_pool(100, "on-demand")]})
    pools = {"b1-r1-n1": "on-demand"}
    assert where(run([held("b1-r1-n1", (1, 3, 4, 6)), *gang(1, 4, spec)], nodes(pools)))[
        "j-0"] != "b1-r1-n1"
    # at the same bandwidth the preference wins over best fit, which would take the quad
    # left on b0-r0-n0
    quad = held("b0-r0-n0", (4, 5, 6, 7))
    assert where(run([quad, *gang(1, 4)], nodes(pools))) == {"j-0": "b0-r0-n0"}
    assert where(run([quad, *gang(1, 4, spec)], nodes(pools))) == {"j-0": "b1-r1-n1"}


def test_a_preference_never_widens_the_gangs_network_domain() -> None:
    # one preferred node in each rack of b1: the gang, which prefers one rack, stays in one
    levels = Levels((BLOCK, RACK))
    topology = json.dumps({"v": 1, "mode": "preferred",
                           "network": {"level": RACK, "mode": "preferred"}})
    pools = {"b1-r0-n1": "on-demand", "b1-r1-n1": "on-demand"}
    spec = affinity(nodeAffinity={"preferredDuringSchedulingIgnoredDuringExecution": [
        prefer_pool(100, "on-demand")]})
    got = where(run(gang(2, 8, spec, topology=topology), nodes(pools), levels))
    assert len({n.rsplit("-", 1)[0] for n in got.values()}) == 1
    # both preferred nodes in one rack: it goes there
    pools = {"b1-r1-n0": "on-demand", "b1-r1-n1": "on-demand"}
    assert where(run(gang(2, 8, spec, topology=topology), nodes(pools), levels)) == \
        {"j-0": "b1-r1-n0", "j-1": "b1-r1-n1"}


def test_preferred_pod_affinity_and_anti_affinity_count_the_pods_on_nodes() -> None:
    db = placed("db", "b0-r0-n0", {"app": "db"})
    avoid = affinity(podAntiAffinity={"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 100, "podAffinityTerm": {"labelSelector": {"matchLabels": {"app": "db"}},
                                            "topologyKey": HOST}}]})
    assert where(run([db, *gang(1, 4)])) == {"j-0": "b0-r0-n0"}
    assert where(run([db, *gang(1, 4, avoid)]))["j-0"] != "b0-r0-n0"
    cache = placed("cache", "b1-r1-n1", {"app": "cache"})
    near = affinity(podAffinity={"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 100, "podAffinityTerm": {"labelSelector": {"matchLabels": {"app": "cache"}},
                                            "topologyKey": BLOCK}}]})
    assert where(run([cache, *gang(1, 4, near)]))["j-0"].startswith("b1-")
    # another namespace's pod is not counted
    other = {**cache, "metadata": {**cache["metadata"], "namespace": "team-b"}}
    assert where(run([other, *gang(1, 4, near)])) == {"j-0": "b0-r0-n0"}


def test_schedule_anyway_spread_prefers_the_emptiest_domain() -> None:
    soft = {"topologySpreadConstraints": [{
        "maxSkew": 1, "topologyKey": BLOCK, "whenUnsatisfiable": "ScheduleAnyway",
        "labelSelector": {"matchLabels": {"job": "j"}}}]}
    mine = [placed(f"old-{i}", "b0-r0-n1", {"job": "j"}) for i in range(2)]
    assert where(run([*mine, *gang(1, 4)]))["j-0"].startswith("b0-")
    assert where(run([*mine, *gang(1, 4, soft)]))["j-0"].startswith("b1-")


def test_scores_normalise_each_plugin_and_sum_them() -> None:
    objs = {n["metadata"]["name"]: parse_node(n)
            for n in nodes({"b0-r0-n0": "a", "b0-r0-n1": "b"})}
    prefs = Preferences(nodes=((30, Term((Requirement(POOL, "In", ("a",)),))),
                               (10, Term((Requirement(POOL, "In", ("b",)),)))))
    info = replace(parse_pod(gang(1, 8)[0]), preferences=prefs)
    states = {name: Allocation({}).node_state(n) for name, n in objs.items()}
    scores = Scores(objs, states, Neighbours((), (), objs))
    got = scores.of(info, MemberRequest(info.key, gpus=8))
    assert got["b0-r0-n0"] == 100 and round(got["b0-r0-n1"], 3) == 33.333
    assert {v for n, v in got.items() if n not in ("b0-r0-n0", "b0-r0-n1")} == {0}
    # only the nodes the member fits on are scored: the highest is made 100 among them
    states["b0-r0-n0"] = states["b0-r0-n0"].less(range(8), 0, 0)
    got = Scores(objs, states, Neighbours((), (), objs)).of(
        info, MemberRequest(info.key, gpus=8))
    assert "b0-r0-n0" not in got and got["b0-r0-n1"] == 100


def test_as_good_reads_nodes_bandwidth_and_domain() -> None:
    def placement(*on: str, gbps: float = 10.0) -> GangPlacement:
        return GangPlacement(tuple(MemberPlacement(f"m{i}", n, (0,)) for i, n in enumerate(on)),
                             len(set(on)), gang_gbps=gbps)
    paths = {"a": ("b0", "r0"), "b": ("b0", "r0"), "c": ("b0", "r1")}
    base = placement("a", "b")
    assert as_good(placement("b", "a"), base, paths)
    assert not as_good(placement("a", "c"), base, paths)  # wider: the block
    assert as_good(placement("a", "c"), base, None)
    assert not as_good(placement("a", "b", gbps=9.0), base, paths)
    assert not as_good(placement("a", "b", "c"), placement("a", "a", "b"), None)


def test_members_placed_one_at_a_time_go_to_the_nodes_they_prefer() -> None:
    # four 1-GPU members kept one per node: the engine packs them, so they are placed one at
    # a time, each by its preference among the nodes the spread leaves it
    one_each = {"topologySpreadConstraints": [{
        "maxSkew": 1, "topologyKey": HOST, "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": {"job": "j"}}}]}
    pools = {n: "on-demand" for n in ("b1-r0-n0", "b1-r0-n1", "b1-r1-n0", "b1-r1-n1")}
    control = where(run(gang(4, 1, one_each), nodes(pools)))
    assert len(set(control.values())) == 4 and not set(control.values()) <= set(pools)
    spec = {**one_each, **affinity(nodeAffinity={
        "preferredDuringSchedulingIgnoredDuringExecution": [prefer_pool(60, "on-demand")]})}
    got = where(run(gang(4, 1, spec), nodes(pools)))
    assert set(got.values()) == set(pools)


def test_the_terms_of_pods_already_placed_that_select_the_gang_are_weighed() -> None:
    # a database that prefers training pods away from its node, and one whose required
    # podAffinity selects them (kube-scheduler's hardPodAffinityWeight): the gang, which has
    # no preference of its own, avoids the first and joins the second
    def term(weight: int) -> dict[str, Any]:
        return {"weight": weight, "podAffinityTerm": {
            "labelSelector": {"matchLabels": {"job": "j"}}, "topologyKey": HOST}}
    avoid = placed("db", "b0-r0-n0", {"app": "db"})
    avoid["spec"]["affinity"] = {
        "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [term(100)]}}
    assert where(run([placed("x", "b0-r0-n0", {}), *gang(1, 4)])) == {"j-0": "b0-r0-n0"}
    assert where(run([avoid, *gang(1, 4)]))["j-0"] != "b0-r0-n0"
    join = placed("cache", "b1-r1-n1", {"app": "cache"})
    join["spec"]["affinity"] = {"podAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [term(1)["podAffinityTerm"]]}}
    assert where(run([join, *gang(1, 4)])) == {"j-0": "b1-r1-n1"}
    # another namespace's pending pod is not selected by the database's term
    other = [{**p, "metadata": {**p["metadata"], "namespace": "team-b"}} for p in gang(1, 4)]
    assert where(run([avoid, *other])) == {"j-0": "b0-r0-n0"}


def test_a_preference_never_costs_the_gang_its_slices() -> None:
    # slices of 2 ranks within a rack, preferred; racks of 3 nodes; the preferred nodes, 3 in
    # r0 and 1 in r1, would hold the 4 ranks only with a slice over both racks
    objs = [node(f"r{r}-n{i}", labels={HOST: f"r{r}-n{i}", BLOCK: "b0", RACK: f"r{r}",
                                       POOL: "on-demand" if r == 0 or i == 0 else "spot"})
            for r in (0, 1) for i in range(3)]
    topology = json.dumps({"v": 1, "mode": "preferred", "network": {
        "level": BLOCK, "mode": "preferred", "sliceLevel": RACK, "sliceSize": 2,
        "sliceMode": "preferred"}})
    spec = affinity(nodeAffinity={"preferredDuringSchedulingIgnoredDuringExecution": [
        prefer_pool(100, "on-demand")]})
    got = where(run(gang(4, 8, spec, topology=topology), objs, Levels((BLOCK, RACK))))
    rack = {name: n.split("-")[0] for name, n in got.items()}
    assert rack["j-0"] == rack["j-1"] and rack["j-2"] == rack["j-3"], got
