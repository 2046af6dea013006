"""The incremental snapshot plans exactly as a plan made from scratch from the same pods and
ResourceClaims."""

from __future__ import annotations

import functools
from typing import Any

from binder_objects import claim, node, pod
from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.binder.allocation import Allocation
from webhook.binder.assignment import build_assignment, encode_assignment
from webhook.binder.claims import ClaimInfo, allocated_status, parse_claim
from webhook.binder.fit import FitCache
from webhook.binder.nodes import NodeInfo, parse_node
from webhook.binder.planner import Plan, PlanConfig, plan, plan_gangs
from webhook.binder.pods import PodInfo, parse_pod
from webhook.binder.queue import GangQueue
from webhook.binder.snapshot import Snapshot
from webhook.topology.builtin import builtin
from webhook.topology.gpu_choice import TableCache
from webhook.topology.hierarchy import place_gang

CFG = PlanConfig(scheduler_name="muster-binder", starvation_seconds=30)
TOPO = builtin("dgx1-v100")
NODES = ("n1", "n2")
PLACE = functools.partial(place_gang, tables=TableCache())


#: one pod per node among those labelled app=x (the snapshot keeps such pods apart)
KEEP_APART = {"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
    {"labelSelector": {"matchLabels": {"app": "x"}}, "topologyKey": "kubernetes.io/hostname"}]}}}


@st.composite
def pod_versions(draw: st.DrawFn) -> PodInfo:
    """One version of one of six pods: any gang, size, binding, reservation, phase."""
    name = f"p{draw(st.integers(0, 5))}"
    gpus = draw(st.integers(0, 2))
    where = draw(st.sampled_from((None, *NODES)))
    assignment = None
    if where is not None and draw(st.booleans()):
        indices = draw(st.lists(st.integers(0, 7), min_size=gpus, max_size=gpus, unique=True))
        assignment = encode_assignment(build_assignment(where, TOPO, indices,
                                                        [("main", gpus)]))
    return parse_pod(pod(
        name, gang=draw(st.sampled_from((None, "g1", "g2"))),
        min_member=draw(st.integers(1, 3)), gpus=gpus, cpu=draw(st.sampled_from(("1", "40"))),
        node_name=where if assignment is None or draw(st.booleans()) else None,
        assignment=assignment,
        phase=draw(st.sampled_from(("Pending", "Running", "Succeeded"))),
        scheduler=draw(st.sampled_from(("muster-binder", "default-scheduler"))),
        rv=str(draw(st.integers(1, 9))),
        labels=draw(st.sampled_from(({}, {"app": "x"}))),
        extra_spec=draw(st.sampled_from(({}, KEEP_APART)))))


@st.composite
def claim_versions(draw: st.DrawFn) -> ClaimInfo:
    """One version of one of three claims: not allocated, or holding some GPUs of a node."""
    name = f"c{draw(st.integers(0, 2))}"
    where = draw(st.sampled_from((None, *NODES)))
    if where is None:
        return parse_claim(claim(name))
    indices = draw(st.lists(st.integers(0, 7), min_size=1, max_size=3, unique=True))
    return parse_claim(claim(name, count=len(indices), status=allocated_status(
        {}, where, [("gpus", i) for i in indices], "someone", "uid-someone")))


def node_version(name: str, gpus: int) -> NodeInfo:
    return parse_node(node(name, gpus=gpus))


# an op: a pod's or claim's new version, a pod or claim deleted (its name), or a node's new
# allocatable GPUs
ops = st.lists(st.one_of(pod_versions(), claim_versions(),
                         st.sampled_from([*(f"p{i}" for i in range(6)),
                                          *(f"c{i}" for i in range(3))]),
                         st.tuples(st.sampled_from(NODES), st.integers(0, 8))),
               max_size=25)


def summary(p: Plan) -> dict[str, Any]:
    return {
        "places": [(x.gang.key, [(pod.key, a) for pod, a in x.assignments]) for x in p.places],
        "finishes": [(x.gang.key, [pod.key for pod, _ in x.assignments])
                     for x in p.finishes],
        "strips": [(x.gang.key, [pod.key for pod in x.pods], x.reason) for x in p.strips],
        "waits": [(w.gang.key, w.kind, w.reason, w.timed_out, w.reserves) for w in p.waits],
        "gangs": {k: (g.min_member, g.members, g.problems) for k, g in p.gangs.items()},
        "gpus": {n: p.allocation.assigned_gpus(n) for n in NODES},
        "conflicts": {n: {i: sorted(k) for i, k in c.items()}
                      for n, c in p.allocation.conflicts().items()},
    }


@settings(max_examples=300, deadline=None)
@given(ops)
def test_incremental_snapshot_plans_as_a_plan_from_scratch(
        steps: list[PodInfo | ClaimInfo | str | tuple[str, int]]) -> None:
    pods: dict[str, PodInfo] = {}
    claims: dict[str, ClaimInfo] = {}
    nodes = {name: node_version(name, 8) for name in NODES}
    snap = Snapshot(CFG.scheduler_name)
    for step in steps:
        if isinstance(step, PodInfo):
            pods[step.key] = step
            snap.put(step)
        elif isinstance(step, ClaimInfo):
            claims[step.key] = step
            snap.put_claim(step)
        elif isinstance(step, str) and step.startswith("c"):
            claims.pop(f"team-a/{step}", None)
            snap.remove_claim(f"team-a/{step}")
        elif isinstance(step, str):
            pods.pop(f"team-a/{step}", None)
            snap.remove(f"team-a/{step}")
        else:
            nodes[step[0]] = node_version(*step)
        kw: dict[str, Any] = {"config": CFG, "fit": FitCache(), "place": PLACE, "now": 1e9}
        states = snap.node_states(nodes)
        scratch = Allocation.from_pods(pods.values(), claims.values())
        assert states == {n: scratch.node_state(info) for n, info in nodes.items()}
        full = plan(list(pods.values()), nodes, None, queue=GangQueue(),
                    claims=list(claims.values()), **kw)
        fast = plan_gangs(snap.open_gangs(None, CFG.podgroup_default_timeout),
                          snap.allocation, states, nodes, queue=GangQueue(),
                          neighbours=snap.neighbours(nodes), **kw)
        assert summary(fast) == summary(full)
