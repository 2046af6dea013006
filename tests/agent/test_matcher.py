"""Pure matching of the kubelet's Allocate calls to pods' binder assignments."""

from __future__ import annotations

import pytest
from agent_helpers import NODE, attacker_pod, make_pod

from webhook import keys
from webhook.agent.deviceplugin.matcher import (
    choose,
    explain,
    pending,
    refusal,
    served,
)
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
    assert all(g.again for g in done.grants) and done.live == {"uid-p"}
    assert choose(done, 1) is None and choose(done, 2) is None  # never for a plain Allocate


def test_a_pod_is_served_after_its_last_container_and_then_never_offered_again(
        dgx1: Topology) -> None:
    pod = make_pod("p", assign={"a": [0, 1], "b": [2]}, topology=dgx1)
    offer = pending([pod], NODE, devices(dgx1), set())
    first, second = offer.grants
    assert not served(offer, first, {("uid-p", "a")})
    assert served(offer, second, {("uid-p", "a"), ("uid-p", "b")})
    # the mark outlives this agent: after a restart, the pod is offered only as served before
    pod["metadata"]["annotations"][keys.ANN_GPU_ALLOCATED] = NODE
    again = pending([pod], NODE, devices(dgx1), set())
    assert [g.again for g in again.grants] == [True, True] and again.refused == {}
    # the kubelet holds its GPUs (it recorded them): no Allocate, preferred or not, gets them
    held = [g.uuid for g in dgx1.gpus[3:]]
    assert choose(again, 2) is None and choose(again, 2, available=held) is None
    assert choose(again, 2, wanted=[dgx1.gpus[6].uuid, dgx1.gpus[7].uuid]) is None
    assert explain(again, NODE, 2).endswith("(pending pods here: none)")


def test_a_kubelet_that_lost_its_record_gets_the_same_gpus_for_the_same_pod(
        dgx1: Topology) -> None:
    """The kubelet restarted between the agent's answer and its checkpoint: it has the served
    pod's GPUs free and asks for the pod's container again, oldest pod first, as it admits."""
    lost = make_pod("lost", assign={"main": [4, 5]}, topology=dgx1, created="2026-01-01T00:00:00Z")
    lost["metadata"]["annotations"][keys.ANN_GPU_ALLOCATED] = NODE
    fresh = make_pod("fresh", assign={"main": [0, 1]}, topology=dgx1,
                     created="2026-01-01T00:00:09Z")
    offer = pending([fresh, lost], NODE, devices(dgx1), set())
    everything = [g.uuid for g in dgx1.gpus]
    preferred = choose(offer, 2, available=everything)
    assert preferred is not None and preferred.pod == "ml/lost" and preferred.again
    again = choose(offer, 2, wanted=list(preferred.uuids))
    assert again is not None and again.pod == "ml/lost"
    nxt = choose(offer, 2, available=[u for u in everything if u not in preferred.uuids])
    assert nxt is not None and nxt.pod == "ml/fresh" and not nxt.again


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


def test_an_assignment_counts_only_on_a_pod_the_binder_scheduled(dgx1: Topology) -> None:
    """A pod another scheduler bound (a user's gate + forged annotation + ungate) names the
    GPUs another pod holds: its annotation is ignored, whoever wrote it."""
    forged = make_pod("forged", assign={"m": [0, 1]}, topology=dgx1, scheduler="default-scheduler",
                      created="2026-01-01T00:00:00Z")
    ours = make_pod("ours", assign={"m": [2, 3]}, topology=dgx1, created="2026-01-02T00:00:00Z")
    offer = pending([forged, ours], NODE, devices(dgx1), set())
    assert [g.pod for g in offer.grants] == ["ml/ours"]
    # asking for GPUs with no grant of its own, the forged pod leaves no grant to hand out
    assert choose(offer, 2, [dgx1.gpus[0].uuid, dgx1.gpus[1].uuid]) is None
    assert set(offer.ambiguous) == {"ml/forged"}
    assert "spec.schedulerName is 'default-scheduler', not the binder's 'muster-binder'" in (
        offer.refused["ml/forged"])
    # a binder of another name: only its pods count
    other = pending([forged, ours], NODE, devices(dgx1), set(), "default-scheduler")
    assert [g.pod for g in other.grants] == ["ml/forged"]


@pytest.mark.parametrize("attacker_first", [True, False])
@pytest.mark.parametrize("kubelet_pick", [False, True])
def test_a_foreign_gpu_pod_pending_beside_a_grant_gets_no_grant(
        dgx1: Topology, attacker_first: bool, kubelet_pick: bool) -> None:
    """A user's pod bound with spec.nodeName asks for GPUs while the binder's pod waits: the
    kubelet may be admitting either, so neither the oldest grant nor the exact pick is handed
    out, whichever pod is older, and the refusal names the pod in the way."""
    older, newer = "2026-01-01T00:00:00Z", "2026-01-01T00:00:05Z"
    attacker = attacker_pod(created=older if attacker_first else newer)
    victim = make_pod("victim", assign={"m": [4, 5]}, topology=dgx1,
                      created=newer if attacker_first else older)
    offer = pending([attacker, victim], NODE, devices(dgx1), set())
    assert [g.pod for g in offer.grants] == ["ml/victim"]
    assert set(offer.ambiguous) == {"ml/attacker"}
    victims = [dgx1.gpus[4].uuid, dgx1.gpus[5].uuid]
    assert choose(offer, 2) is None and choose(offer, 2, victims) is None
    assert choose(offer, 2, available=[g.uuid for g in dgx1.gpus]) is None
    why = refusal(offer, NODE, 2, kubelet_pick)
    assert why is not None and "ml/attacker (spec.schedulerName is 'default-scheduler'" in why
    # the kubelet failed the attacker's pod (refused): the victim's grant is its own again
    attacker["status"]["phase"] = "Failed"
    cleared = pending([attacker, victim], NODE, devices(dgx1), set())
    grant = choose(cleared, 2, victims)
    assert cleared.ambiguous == {} and grant is not None and grant.pod == "ml/victim"


def test_a_binder_pod_without_a_valid_assignment_is_ambiguous_too(dgx1: Topology) -> None:
    unassigned = attacker_pod("unassigned", scheduler=keys.DEFAULT_BINDER_SCHEDULER_NAME)
    elsewhere = make_pod("elsewhere", assign={"m": [0, 1]}, topology=dgx1,
                         assignment_node="other-node")
    victim = make_pod("victim", assign={"m": [4, 5]}, topology=dgx1)
    offer = pending([unassigned, elsewhere, victim], NODE, devices(dgx1), set())
    assert set(offer.ambiguous) == {"ml/unassigned", "ml/elsewhere"}
    assert choose(offer, 2) is None
    why = refusal(offer, NODE, 2, True) or ""
    assert "ml/unassigned (no muster.io/gpu-assignment annotation)" in why
    assert "ml/elsewhere (assigned GPUs on node 'other-node'" in why


def test_pods_that_ask_for_no_gpu_or_were_admitted_are_not_in_the_way(dgx1: Topology) -> None:
    """A foreign pod asking for no GPU, one asking for another resource, one the kubelet
    already admitted (it reports its containers: trusted only where a foreign pod may be
    admitted, the unassigned "kubelet" mode), and a served binder pod do not block."""
    cpu_only = make_pod("cpu-only", scheduler="default-scheduler")
    admitted = attacker_pod("admitted")
    admitted["status"]["containerStatuses"] = [{"name": "main", "state": {"waiting": {}}}]
    served_pod = make_pod("served", assign={"m": [0, 1]}, topology=dgx1)
    served_pod["metadata"]["annotations"][keys.ANN_GPU_ALLOCATED] = NODE
    other = attacker_pod("other-resource")
    victim = make_pod("victim", assign={"m": [4, 5]}, topology=dgx1)
    pods = [cpu_only, admitted, served_pod, other, victim]
    offer = pending(pods, NODE, devices(dgx1), set(), trust_admitted=True)
    assert set(offer.ambiguous) == {"ml/other-resource"}
    # container statuses are status: a user allowed pods/status could forge them
    offer = pending(pods, NODE, devices(dgx1), set())
    assert set(offer.ambiguous) == {"ml/other-resource", "ml/admitted"}
    offer = pending(pods, NODE, devices(dgx1), set(), resource="example.com/fpga")
    assert offer.ambiguous == {}
    grant = choose(offer, 2)
    assert grant is not None and grant.pod == "ml/victim"


def test_the_kubelets_pick_for_a_foreign_pod_only_when_no_grant_waits(dgx1: Topology) -> None:
    """unassigned "kubelet": a foreign pod may get the kubelet's own pick, never a grant."""
    attacker = attacker_pod()
    alone = pending([attacker], NODE, devices(dgx1), set())
    assert refusal(alone, NODE, 2, kubelet_pick=True) is None
    assert "ml/attacker" in (refusal(alone, NODE, 2, kubelet_pick=False) or "")
    # a served binder pod's GPUs are the kubelet's: its grant (offered again) blocks nothing
    served_pod = make_pod("served", assign={"m": [0, 1]}, topology=dgx1)
    served_pod["metadata"]["annotations"][keys.ANN_GPU_ALLOCATED] = NODE
    beside = pending([attacker, served_pod], NODE, devices(dgx1), set())
    assert refusal(beside, NODE, 2, kubelet_pick=True) is None
    victim = make_pod("victim", assign={"m": [4, 5]}, topology=dgx1)
    waiting = pending([attacker, victim], NODE, devices(dgx1), set())
    assert refusal(waiting, NODE, 2, kubelet_pick=True) is not None
