"""The binder's planning path places a gang within the network domain it asks for, from the
nodes' labels, and says in its wait why one that cannot fit waits."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from binder_objects import BLOCK, RACK, job, node, pod, racked_nodes
from binder_run import planned, serving

from e2e.probes import eventually
from webhook import keys
from webhook.binder.cli import network_levels
from webhook.binder.controller import Binder, BinderConfig
from webhook.binder.fit import FitCache
from webhook.binder.nodes import parse_node
from webhook.binder.planner import Plan, PlanConfig, plan
from webhook.binder.pods import parse_pod, parse_topology_request, pod_rank
from webhook.binder.queue import GangQueue
from webhook.doubles.emulator import ApiServerEmulator
from webhook.failures import UsageError
from webhook.kube import KubeApi
from webhook.kube.api import PODS
from webhook.topology.hierarchy import place_gang
from webhook.topology.model import NetworkRequest
from webhook.topology.network import Levels

#: with KAI-style aliases for both levels
CFG = PlanConfig(scheduler_name=keys.DEFAULT_BINDER_SCHEDULER_NAME,
                 levels=Levels((BLOCK, RACK), (("block", BLOCK), ("rack", RACK))))


def topo(level: str, mode: str = "required", **more: Any) -> str:
    return json.dumps({"v": 1, "mode": "preferred",
                       "network": {"level": level, "mode": mode, **more}})


def run(pods: list[dict[str, Any]], objs: list[dict[str, Any]], fit: FitCache | None = None
        ) -> Plan:
    return planned(pods, objs, CFG, fit)


def racks(p: Plan) -> set[tuple[str, str]]:
    return {tuple(n.split("-")[:2]) for place in p.places for pod_, a in place.assignments
            if pod_.gpus for n in [a.node]}  # type: ignore[misc]


def test_a_required_rack_gang_lands_in_one_rack() -> None:
    taken = [pod("busy", gpus=4, node_name="b0-r0-n0", topology=None)]
    p = run([*job("j", workers=3, gpus=4, topology=topo(RACK)), *taken], racked_nodes())
    assert len(p.places) == 1 and racks(p) == {("b0", "r0")}  # the fullest rack that fits


def test_a_replaced_member_of_a_required_rack_gang_joins_its_rack() -> None:
    """Worker 0 of a 2 x 8-GPU gang died and its controller made it again; worker 1 and the
    launcher still run in rack b0-r0. The other node of that rack is the only place for it,
    though rack b1-r1's nodes are emptier and come first; with that node full it waits, saying
    why, rather than splitting the gang across racks."""
    nodes = racked_nodes()
    gang = job("j", workers=2, gpus=8, topology=topo(RACK))
    gang[1]["spec"]["nodeName"] = "b0-r0-n1"
    gang[2]["spec"]["nodeName"] = "b0-r0-n1"
    p = run(gang, nodes)
    assert {pod_.name: a.node for place in p.places for pod_, a in place.assignments} == \
        {"j-worker-0": "b0-r0-n0"}
    squatter = pod("busy", gpus=8, node_name="b0-r0-n0", topology=None)
    p = run([*gang, squatter], nodes)
    assert not p.places
    assert p.waits[0].kind == "unplaceable"
    assert p.waits[0].reason.endswith(f"(kept to {RACK}=r0, where its bound members run)")


def test_a_replaced_member_joins_no_rack_where_its_bound_ones_are_in_none_or_two() -> None:
    """Worker 1 runs on a node without the rack label, or worker 1 and the launcher in two
    racks: no one rack is theirs, so worker 0 goes where the placement puts it, with no note."""
    unlabelled = racked_nodes()
    del unlabelled[7]["metadata"]["labels"][RACK]  # b0-r0-n1
    gang = job("j", workers=2, gpus=8, topology=topo(RACK))
    gang[1]["spec"]["nodeName"] = gang[2]["spec"]["nodeName"] = "b0-r0-n1"
    apart = [gang[0], gang[1], {**gang[2], "spec": {**gang[2]["spec"], "nodeName": "b1-r1-n0"}}]
    for pods, nodes in ((gang, unlabelled), (apart, racked_nodes())):
        p = run(pods, nodes)
        assert [a.node for place in p.places for _, a in place.assignments] and not p.waits


def test_a_preferred_rack_gang_that_fits_no_rack_spans_the_racks_of_one_block() -> None:
    p = run(job("j", workers=3, gpus=8, topology=topo(RACK, "preferred")), racked_nodes())
    assert len(p.places) == 1 and len({b for b, _ in racks(p)}) == 1 and len(racks(p)) == 2


def test_a_level_named_by_its_alias_is_that_level() -> None:
    taken = [pod("busy", gpus=4, node_name="b0-r0-n0", topology=None)]
    p = run([*job("j", workers=3, gpus=4, topology=topo("rack")), *taken], racked_nodes())
    assert len(p.places) == 1 and racks(p) == {("b0", "r0")}
    p = run(job("j", workers=3, gpus=8, topology=topo("rack")), racked_nodes())
    assert "within one example.com/rack domain" in p.waits[0].reason


@pytest.mark.parametrize(("labels", "rank"), [
    ({keys.COMPLETION_INDEX_LABEL: "10"}, (10,)),
    ({keys.COMPLETION_INDEX_LABEL: "3", keys.JOBSET_JOB_INDEX_LABEL: "1"}, (1, 3)),
    ({keys.REPLICA_INDEX_LABEL: "0", keys.REPLICA_TYPE_LABEL: "master"}, (0, 0)),
    ({keys.REPLICA_INDEX_LABEL: "0", keys.REPLICA_TYPE_LABEL: "worker"}, (1, 0)),
    ({keys.LWS_WORKER_INDEX_LABEL: "2"}, (2,)),
    ({keys.KUEUE_POD_GROUP_INDEX_LABEL: "7"}, (7,)),
    ({keys.COMPLETION_INDEX_LABEL: "-1"}, ()),
    ({keys.KUEUE_POD_GROUP_INDEX_LABEL: "²"}, ()),
    ({}, ()),
])
def test_a_pods_rank_is_what_its_operators_labels_say(labels: dict[str, str],
                                                       rank: tuple[int, ...]) -> None:
    assert pod_rank(labels) == rank


def test_slices_follow_the_ranks_the_labels_give_not_the_names() -> None:
    """Pods named at random (generateName) with their index labelled, as a Kueue pod group's:
    each slice of 2 is 2 consecutive ranks, within one rack."""
    names = ["p-zq", "p-ab", "p-m1", "p-c7"]
    topology = topo(BLOCK, sliceLevel=RACK, sliceSize=2)
    pods = [pod(name, gang="g", min_member=4, gpus=8, topology=topology,
                labels={keys.KUEUE_POD_GROUP_INDEX_LABEL: str(i)})
            for i, name in enumerate(names)]
    p = run(pods, racked_nodes())
    [place] = p.places
    rack = {pod_.name: a.node.rsplit("-", 1)[0] for pod_, a in place.assignments}
    assert rack["p-zq"] == rack["p-ab"] and rack["p-m1"] == rack["p-c7"]
    assert rack["p-zq"] != rack["p-m1"]  # by name, p-ab and p-c7 would share a rack


def test_topograph_levels_follow_the_labels_the_nodes_carry() -> None:
    """`--network-levels topograph` on nodes labelled by Topograph v1 (two fabric tiers): a
    gang bound to tier 1 (the leaf switch, Topograph's tier 0) lands in one leaf; once a third
    tier is labelled, the levels follow it (as the binder clears its FitCache on node changes)."""
    tier = "fabric.topograph.run/tier-"
    objs = [node(f"b{b}-r{r}-n{i}", labels={f"{tier}1": f"b{b}", f"{tier}0": f"r{r}"})
            for b in (1, 0) for r in (1, 0) for i in range(2)]
    cfg = replace(CFG, levels=Levels(topograph=True))
    fit = FitCache()
    for labelled in ((f"{tier}1", f"{tier}0"), (f"{tier}2", f"{tier}1", f"{tier}0")):
        for n in objs:
            n["metadata"]["labels"].setdefault(labelled[0], "core")
        parsed = {n["metadata"]["name"]: parse_node(n) for n in objs}
        fit.clear()
        p = plan([parse_pod(p) for p in job("j", workers=2, gpus=8, topology=topo("tier:1"))],
                 parsed, None, config=cfg, queue=GangQueue(), fit=fit, place=place_gang,
                 now=1795237200.0)
        assert len(p.places) == 1 and len(racks(p)) == 1
        assert fit.network(parsed, cfg.levels).levels == labelled


def test_a_level_named_by_its_tier_counts_from_the_narrowest() -> None:
    """Volcano's tiers (`volcano.sh/network-topology-*`, as the webhook writes them): tier 1 is
    the rack here, tier 2 the block, and a tier above the widest level is the whole cluster."""
    taken = [pod("busy", gpus=4, node_name="b0-r0-n0", topology=None)]
    p = run([*job("j", workers=3, gpus=4, topology=topo("tier:1")), *taken], racked_nodes())
    assert len(p.places) == 1 and racks(p) == {("b0", "r0")}
    hard2 = topo("tier:1", "preferred", maxLevel="tier:2")
    p = run(job("j", workers=3, gpus=8, topology=hard2), racked_nodes())
    assert len(p.places) == 1 and len({b for b, _ in racks(p)}) == 1 and len(racks(p)) == 2
    p = run(job("j", workers=5, gpus=8, topology=hard2), racked_nodes())
    assert not p.places and "within one example.com/block domain" in p.waits[0].reason
    hard3 = topo("tier:1", "preferred", maxLevel="tier:3")  # above the block: no bound
    p = run(job("j", workers=5, gpus=8, topology=hard3), racked_nodes())
    assert len(p.places) == 1 and len({b for b, _ in racks(p)}) == 2


def test_a_preferred_rack_bounded_by_a_block_waits_beyond_it() -> None:
    p = run(job("j", workers=3, gpus=8, topology=topo("rack", "preferred", maxLevel="block")),
            racked_nodes())
    assert len(p.places) == 1 and len({b for b, _ in racks(p)}) == 1
    p = run(job("j", workers=5, gpus=8, topology=topo("rack", "preferred", maxLevel="block")),
            racked_nodes())
    assert not p.places and "within one example.com/block domain" in p.waits[0].reason


def test_a_gang_that_cannot_fit_waits_with_the_reason() -> None:
    p = run(job("j", workers=3, gpus=8, topology=topo(RACK)), racked_nodes())
    assert not p.places
    [wait] = p.waits
    assert wait.kind == "unplaceable"
    assert wait.reason == ("gang team-a/j needs 24 GPUs (3 members x 8 GPUs) within one "
                           "example.com/rack domain; the largest free one "
                           "(example.com/rack=r1) has 16 free GPUs")


def test_the_network_is_made_once_per_node_set() -> None:
    fit = FitCache()
    run(job("j", workers=2, gpus=8, topology=topo(RACK)), racked_nodes(), fit)
    made = fit.network({}, CFG.levels)
    assert fit.network({}, CFG.levels) is made
    fit.clear()
    assert fit.network({}, CFG.levels) is not made


def test_the_annotation_carries_the_request() -> None:
    req = parse_topology_request(topo(BLOCK, "preferred", sliceLevel=RACK, sliceSize=2))
    assert req.network == NetworkRequest(BLOCK, "preferred", RACK, 2)
    req = parse_topology_request(topo(RACK, "preferred", maxLevel=BLOCK, sliceLevel=RACK,
                                      sliceSize=2, sliceMode="preferred"))
    assert req.network == NetworkRequest(RACK, "preferred", RACK, 2, "preferred", BLOCK)
    req = parse_topology_request('{"v": 1, "network": {"unconstrained": true}}')
    assert req.network == NetworkRequest(unconstrained=True)
    req = parse_topology_request(topo("rack", topology="kai:gb200"))
    assert req.network == NetworkRequest("rack", topology="kai:gb200")


@pytest.mark.parametrize(("network", "error"), [
    ("[]", "must be an object"),
    ('{"mode": "sometimes"}', "mode must be"),
    ('{"level": 3}', "node label key"),
    ('{"sliceLevel": "x"}', "go together"),
    ('{"sliceLevel": "x", "sliceSize": -1}', "whole number"),
    ('{"sliceLevel": "x", "sliceSize": 2, "sliceMode": "soft"}', "sliceMode must be"),
    ('{"level": "x", "maxLevel": "y"}', "maxLevel bounds a preferred level"),
    ('{"level": "x", "mode": "preferred", "maxLevel": 1}', "maxLevel must be a node label"),
    ('{"unconstrained": "yes"}', "unconstrained must be true or false"),
    ('{"unconstrained": true, "level": "x"}', "no level and no slices"),
    ('{"unconstrained": true, "sliceLevel": "x", "sliceSize": 2}', "no level and no slices"),
    ('{"level": "tier:0"}', "a tier is tier:N, N >= 1"),
    ('{"level": "tier:one"}', "a tier is tier:N"),
    ('{"level": "tier:1", "mode": "preferred", "maxLevel": "tier:\u00b2"}', "a tier is tier:N"),
    ('{"level": "x", "topology": "gb200"}', "topology must be kai:NAME or kueue:NAME"),
    ('{"level": "x", "topology": "kai:GB_200"}', "topology must be kai:NAME"),
    ('{"level": "x", "topology": 7}', "topology must be kai:NAME"),
])
def test_a_malformed_request_is_a_problem(network: str, error: str) -> None:
    text = '{"v": 1, "network": ' + network + "}"
    with pytest.raises(ValueError, match=error):
        parse_topology_request(text)


def test_levels_flag(tmp_path: Any) -> None:
    assert network_levels("") == Levels()
    assert network_levels("topograph") == Levels(topograph=True)
    assert network_levels("volcano") == Levels(hypernodes=True)
    assert network_levels(f"{BLOCK}, {RACK}") == Levels((BLOCK, RACK))
    assert network_levels(f"block={BLOCK}, {RACK}") == Levels((BLOCK, RACK),
                                                              (("block", BLOCK),))
    f = tmp_path / "topology.yaml"
    f.write_text("apiVersion: kueue.x-k8s.io/v1beta2\nkind: Topology\nmetadata: {name: t}\n"
                 f"spec:\n  levels:\n  - nodeLabel: {BLOCK}\n  - nodeLabel: {RACK}\n")
    assert network_levels(f"@{f}") == Levels((BLOCK, RACK))
    f.write_text("apiVersion: kai.scheduler/v1alpha1\nkind: Topology\nmetadata: {name: t}\n"
                 f"spec:\n  levels:\n  - nodeLabel: {BLOCK}\n  - nodeLabel: {RACK}\n"
                 "    alias: rack\n")
    assert network_levels(f"@{f}") == Levels((BLOCK, RACK), (("rack", RACK),))
    with pytest.raises(UsageError, match="alias x names two levels"):
        network_levels(f"x={BLOCK},x={RACK}")
    with pytest.raises(UsageError, match="declared twice"):
        network_levels(f"{RACK},{RACK}")
    with pytest.raises(UsageError, match="--network-levels @"):
        network_levels(f"@{tmp_path}/missing.yaml")
    # read as policies are (security review #54): an alias is refused where it appears
    f.write_text(f"a: &a [{BLOCK}]\nspec:\n  levels: *a\n")
    with pytest.raises(UsageError, match=f"--network-levels {f}:3:11: alias \\*a: aliases are "
                       "not accepted"):
        network_levels(f"@{f}")


async def test_the_binder_binds_by_the_network_and_reports_a_gang_that_cannot_fit(
        apiserver: ApiServerEmulator, kube: KubeApi) -> None:
    """Through the emulator: a required-rack gang bound whole in one rack, a required-block one
    in one block; one too big for any rack waits, with the Event."""
    for n in racked_nodes():
        apiserver.seed(n)
    b = Binder(kube, BinderConfig(backoff_initial=0.05, backoff_max=0.2,
                                  network_levels=CFG.levels))
    async with serving(b):
        for p in job("first", workers=2, gpus=8, topology=topo(RACK)):
            await kube.create(PODS, p)

        def bound(prefix: str) -> list[dict[str, Any]]:
            found = [p for p in apiserver.objects("pods", "team-a")
                     if p["metadata"]["name"].startswith(prefix) and p["spec"].get("nodeName")]
            return found if len(found) == 3 else []
        first = await eventually(lambda: bound("first-"), within=5)
        assert len({tuple(p["spec"]["nodeName"].split("-")[:2]) for p in first}) == 1
        for p in job("second", workers=2, gpus=8, topology=topo(BLOCK)):
            await kube.create(PODS, p)
        assert await eventually(lambda: bound("second-"), within=5)
        for p in job("third", workers=3, gpus=8, topology=topo(RACK)):
            await kube.create(PODS, p)
        told = await eventually(lambda: [e for e in apiserver.objects("events", "team-a")
                                         if e["reason"] == "FailedScheduling"
                                         and e["involvedObject"]["name"].startswith("third")])
        assert "needs 24 GPUs (3 members x 8 GPUs) within one example.com/rack domain; the " \
            "largest free one (example.com/rack=r1) has 16 free GPUs" in told[0]["message"]


async def test_the_binder_places_by_topographs_labels_and_says_which_it_read(
        apiserver: ApiServerEmulator, kube: KubeApi, caplog: pytest.LogCaptureFixture) -> None:
    """Through the emulator, `--network-levels topograph` on nodes labelled by Topograph v1 (no
    third tier): a gang bound to one leaf switch lands in one, and the log names the levels."""
    tier = "fabric.topograph.run/tier-"
    for n in [node(f"b{b}-r{r}-n{i}", labels={f"{tier}1": f"b{b}", f"{tier}0": f"r{r}"})
              for b in (1, 0) for r in (1, 0) for i in range(2)]:
        apiserver.seed(n)
    caplog.set_level("INFO", logger="webhook.binder.controller")
    b = Binder(kube, BinderConfig(backoff_initial=0.05, backoff_max=0.2,
                                  network_levels=network_levels("topograph")))
    async with serving(b):
        for p in job("j", workers=2, gpus=8, topology=topo(f"{tier}0")):
            await kube.create(PODS, p)

        def racks_bound() -> set[tuple[str, ...]]:
            found = [p["spec"].get("nodeName") for p in apiserver.objects("pods", "team-a")
                     if p["metadata"]["name"].startswith("j-")]
            return {tuple(n.split("-")[:2]) for n in found} if None not in found else set()
        assert len(await eventually(racks_bound, within=5)) == 1
        said = [r for r in caplog.records if r.getMessage().startswith("network levels from")]
        assert [r.levels for r in said] == [[f"{tier}1", f"{tier}0"]]  # type: ignore[attr-defined]
