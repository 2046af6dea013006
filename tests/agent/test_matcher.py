"""Pure matching of the kubelet's Allocate calls to pods' binder assignments."""

from __future__ import annotations

from agent_helpers import NODE, make_pod

from webhook import keys
from webhook.agent.deviceplugin.matcher import choose, explain, pending, served
from webhook.topology.model import Topology


def devices(topo: Topology) -> dict[int, str]:
    return {g.index: g.uuid for g in topo.gpus}


def test_exact_kubelet_pick_beats_age(dgx1: Topology) -> None:
    pods = [make_pod("old", assign={"m": [0, 1]}, topology=dgx1, created="2026-01-01T00:00:00Z"),
            make_pod("new", assign={"m": [2, 3]}, topology=dgx1, created="2026-01-02T00:00:00Z")]
    offer = pending(pods, NODE, devices(dgx1), set())
    assert [g.pod for g in offer.grants] == ["ml/old", "ml/new"]
    pick = choose(offer, 2, [dgx1.gpus[3].uuid, dgx1.gpus[2].uuid])
    assert pick is not None and pick.pod == "ml/new"
    oldest = choose(offer, 2, [dgx1.gpus[6].uuid, dgx1.gpus[7].uuid])
    assert oldest is not None and oldest.pod == "ml/old"
    assert choose(offer, 3) is None


def test_handed_out_containers_move_to_the_next_one(dgx1: Topology) -> None:
    pod = make_pod("p", assign={"init": [0], "a": [0, 1], "b": [2]}, topology=dgx1)
    offer = pending([pod], NODE, devices(dgx1), {("uid-p", "init")})
    assert [(g.container, len(g.uuids), g.next) for g in offer.grants] == [
        ("a", 2, True), ("b", 1, False)]
    assert choose(offer, 1) is None  # "b" is not asked for before "a"
    done = pending([pod], NODE, devices(dgx1), {("uid-p", "init"), ("uid-p", "a"), ("uid-p", "b")})
    assert done.grants == () and done.live == {"uid-p"}


def test_a_pod_is_served_after_its_last_container_and_then_never_offered_again(
        dgx1: Topology) -> None:
    pod = make_pod("p", assign={"a": [0, 1], "b": [2]}, topology=dgx1)
    offer = pending([pod], NODE, devices(dgx1), set())
    first, second = offer.grants
    assert not served(offer, first, {("uid-p", "a")})
    assert served(offer, second, {("uid-p", "a"), ("uid-p", "b")})
    # the mark outlives this agent: after a restart, nothing of the pod is offered
    pod["metadata"]["annotations"][keys.ANN_GPU_ALLOCATED] = NODE
    again = pending([pod], NODE, devices(dgx1), set())
    assert again.grants == () and again.refused == {} and again.live == frozenset()


def test_missing_uuids_are_resolved_from_the_local_topology(dgx1: Topology) -> None:
    pod = make_pod("p", assign={"m": [4, 5]}, topology=dgx1)
    pod["metadata"]["annotations"][keys.ANN_GPU_ASSIGNMENT] = (
        '{"v":1,"node":"gpu-node-1","containers":{"m":{"indices":[4,5],"uuids":["",""]}}}')
    grant = choose(pending([pod], NODE, devices(dgx1), set()), 2)
    assert grant is not None and grant.uuids == (dgx1.gpus[4].uuid, dgx1.gpus[5].uuid)


def test_refusals_are_explained(dgx1: Topology) -> None:
    bad = make_pod("bad")
    bad["metadata"]["annotations"][keys.ANN_GPU_ASSIGNMENT] = "{not json"
    foreign = make_pod("foreign", assign={"m": [0]}, topology=dgx1)
    foreign["metadata"]["annotations"][keys.ANN_GPU_ASSIGNMENT] = (
        '{"v":1,"node":"gpu-node-1","containers":{"m":{"indices":[0],"uuids":["GPU-other"]}}}')
    pods = [bad, foreign, make_pod("plain"), make_pod("elsewhere", node="other-node"),
            make_pod("done", assign={"m": [1]}, topology=dgx1, phase="Running")]
    offer = pending(pods, NODE, devices(dgx1), set())
    assert offer.grants == ()
    assert set(offer.refused) == {"ml/bad", "ml/foreign", "ml/plain"}
    text = explain(offer, NODE, 1)
    assert "unreadable muster.io/gpu-assignment" in text
    assert "assigned GPUs not on this node: ['GPU-other']" in text
    assert "ml/plain: no muster.io/gpu-assignment annotation" in text
    assert "elsewhere" not in text and "done" not in text


def test_available_devices_skip_containers_the_kubelet_already_served(dgx1: Topology) -> None:
    pod = make_pod("p", assign={"a": [0, 1], "b": [2, 3]}, topology=dgx1)
    offer = pending([pod], NODE, devices(dgx1), set())  # nothing remembered (agent restarted)
    free = [g.uuid for g in dgx1.gpus[2:]]
    preferred = choose(offer, 2, available=free)
    assert preferred is not None and preferred.container == "b"
    # Allocate without the kubelet's exact pick only serves a pod's next container
    assert (choose(offer, 2) or preferred).container == "a"
    exact = choose(offer, 2, wanted=[dgx1.gpus[3].uuid, dgx1.gpus[2].uuid])
    assert exact is not None and exact.container == "b"
