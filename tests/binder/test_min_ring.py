"""The binder and `muster topology choose` hold a gang to minRingGBps alike: the figure choose
prints passes in the binder at exactly that value and fails just above it. Also: a node whose
published topology carries no GPU UUIDs (parsed from `nvidia-smi topo -m`) is used by index."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from typing import Any

import pytest
from binder_objects import job, node, pod
from binder_run import planned as run

from webhook import keys
from webhook.binder.assignment import build_assignment, encode_assignment
from webhook.cli import main
from webhook.topology import codec
from webhook.topology.builtin import builtin
from webhook.topology.network import CLIQUE

TOPO = builtin("dgx1-v100")


def busy(taken: tuple[int, ...]) -> list[dict[str, Any]]:
    if not taken:
        return []
    a = build_assignment("n1", TOPO, taken, [("main", len(taken))])
    return [pod("busy", gpus=len(taken), node_name="n1", assignment=encode_assignment(a))]


def requesting(k: int, min_ring: float) -> list[dict[str, Any]]:
    request = json.dumps({"v": 1, "mode": "required", "singleNode": True, "minRingGBps": min_ring})
    return job("j", workers=k, topology=request)


def choose_figure(capsys: pytest.CaptureFixture[str], k: int, free: tuple[int, ...]) -> float:
    assert main(["topology", "choose", "dgx1-v100", "-k", str(k),
                 "--free", ",".join(map(str, free))]) == 0
    m = re.search(r"ring bandwidth \(minRingGBps\): ([0-9.]+) GB/s", capsys.readouterr().out)
    assert m is not None
    return float(m.group(1))


@pytest.mark.parametrize(("taken", "k"), [((), 4), ((1, 5, 6), 5), ((0, 5), 4), ((2, 3, 6), 2)])
def test_binder_and_choose_agree_at_the_threshold(capsys: pytest.CaptureFixture[str],
                                                  taken: tuple[int, ...], k: int) -> None:
    free = tuple(i for i in range(8) if i not in taken)
    figure = choose_figure(capsys, k, free)
    at = run(busy(taken) + requesting(k, figure), [node("n1")])
    assert len(at.places) == 1 and at.places[0].placement.gang_gbps == figure
    over = math.nextafter(figure, math.inf)
    above = run(busy(taken) + requesting(k, over), [node("n1")])
    assert not above.places
    assert main(["topology", "choose", "dgx1-v100", "-k", str(k), "--free",
                 ",".join(map(str, free)), "--min-ring-gbps", repr(over)]) == 1
    err = capsys.readouterr().err
    wait = next(w for w in above.waits if w.gang.key == "team-a/j")
    assert wait.kind == "unplaceable" and f"at least {over:g} GB/s (minRingGBps)" in wait.reason
    assert f"offers {figure:g} GB/s" in wait.reason and f"give {figure:g} GB/s" in err


def test_a_node_without_uuids_is_assigned_by_index_and_the_reservation_holds() -> None:
    anonymous = dataclasses.replace(TOPO, gpus=tuple(dataclasses.replace(g, uuid=None)
                                                     for g in TOPO.gpus))
    n1 = node("n1")
    n1["metadata"]["annotations"][keys.ANN_NODE_TOPOLOGY] = codec.encode(anonymous)
    pods = requesting(4, 50.0)
    first = run(pods, [n1])
    assert len(first.places) == 1
    assignments = [a for _, a in first.places[0].assignments]
    assert all(c.uuids == ("",) for a in assignments for c in a.containers.values())
    # the binder crashed after writing the assignments: the next cycle keeps them
    by_name = {p.name: a for p, a in first.places[0].assignments}
    for p in pods:
        a = by_name[p["metadata"]["name"]]
        p["metadata"]["annotations"][keys.ANN_GPU_ASSIGNMENT] = encode_assignment(a)
    again = run(pods, [n1])
    assert not again.strips and len(again.finishes) == 1


def test_the_nodes_of_one_nvlink_clique_are_held_to_their_nvlink_not_the_network() -> None:
    """Two HGX H100 nodes of one NVLink clique (GPU feature discovery's label) and one of
    another: an 8-worker gang of 2-GPU pods needing 450 GB/s (the NVSwitch figure, 18 x 25)
    takes two nodes of the clique, which their NVLink joins; the Node objects' labels say it."""
    nodes = [node(n, kind="hgx-h100", labels={CLIQUE: c}) for n, c in
             (("a0", "uuid.0"), ("a1", "uuid.0"), ("b0", "uuid.1"))]
    request = {"v": 1, "mode": "required", "singleNode": False, "minRingGBps": 450,
               "network": {"level": CLIQUE, "mode": "required"}}
    busy_b0 = build_assignment("b0", builtin("hgx-h100"), (0,), [("main", 1)])
    pods = [*job("j", workers=8, gpus=2, topology=json.dumps(request)),
            pod("busy", gpus=1, node_name="b0", assignment=encode_assignment(busy_b0))]
    at = run(pods, nodes)
    assert len(at.places) == 1, at.waits
    placed = at.places[0].placement
    assert {m.node for m in placed.members if m.gpus} == {"a0", "a1"}
    assert placed.gang_gbps == 450.0
    # above it, no clique has it: the gang waits, and says what the nodes offer
    request["minRingGBps"] = 451
    over = run([*job("j", workers=8, gpus=2, topology=json.dumps(request))], nodes)
    assert not over.places
    wait = next(w for w in over.waits if w.gang.key == "team-a/j")
    assert "at least 451 GB/s (minRingGBps)" in wait.reason, wait.reason
