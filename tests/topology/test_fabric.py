"""The throughput model across the network (webhook.topology.fabric, stepmodel) and
`muster simulate --placement`: small cases checked by hand."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from webhook.cli import main
from webhook.topology import builtin
from webhook.topology.fabric import Fabric, Where, bus_gbps, network_gbps, tiers_crossed
from webhook.topology.simulate import PRESETS, Links, step_seconds
from webhook.topology.stepmodel import GangOnFabric, PlacementError, model_step, parse_placement

EDR = Fabric(rail_gbps=12.5, rails=4, oversubscription=(2.0, 2.0))
WHERE = {
    "a": Where(("b1", "l1")), "b": Where(("b1", "l1")),  # one leaf
    "c": Where(("b1", "l2")),  # another leaf of the same block
    "d": Where(("b2", "l3")),  # another block
    "x": Where(("b1", "l1"), "clique-1"), "y": Where(("b1", "l1"), "clique-1"),
    "z": Where(("b1", "l2"), "clique-2"),
}


def test_tiers_crossed_count_the_switch_tiers_above_the_leaf() -> None:
    assert tiers_crossed([WHERE["a"]]) == 0
    assert tiers_crossed([WHERE["a"], WHERE["b"]]) == 0
    assert tiers_crossed([WHERE["a"], WHERE["c"]]) == 1
    assert tiers_crossed([WHERE["a"], WHERE["c"], WHERE["d"]]) == 2
    with pytest.raises(ValueError, match="same number"):
        tiers_crossed([WHERE["a"], Where(("b1",))])


def test_network_is_the_slowest_nodes_nics_over_the_oversubscription_crossed() -> None:
    # 8 + 4 GPUs: the node with 4 uses 4 NICs of 12.5 GB/s
    assert network_gbps(EDR, {"a": 8, "b": 4}, WHERE) == 50.0
    assert network_gbps(EDR, {"a": 8, "c": 8}, WHERE) == 25.0  # leaf uplinks 2:1
    assert network_gbps(EDR, {"a": 8, "d": 8}, WHERE) == 12.5  # and spine uplinks 2:1
    assert network_gbps(EDR, {"a": 8, "b": 1}, WHERE) == 12.5  # one GPU, one NIC
    assert network_gbps(EDR, {"a": 8}, WHERE) == math.inf


def test_one_clique_runs_over_nvlink_and_two_over_the_network() -> None:
    f = Fabric(rail_gbps=50, rails=4, clique_gbps=900)
    assert network_gbps(f, {"x": 4, "y": 4}, WHERE) == 900.0
    assert network_gbps(f, {"x": 4, "z": 4}, WHERE) == 200.0


def test_bus_is_the_slowest_of_the_node_sets_and_the_network() -> None:
    # DGX-1 V100: all 8 GPUs 150 GB/s, a 2-GPU pair 50; a lone GPU runs no ring on its node
    assert bus_gbps({"a": 150.0, "b": 150.0}, {"a": 8, "b": 8}, WHERE, EDR) == 50.0
    assert bus_gbps({"a": 150.0, "b": 0.0}, {"a": 8, "b": 1}, WHERE, EDR) == 12.5
    assert bus_gbps({"a": 50.0}, {"a": 2}, WHERE, EDR) == 50.0


def _gang(gpus: dict[str, tuple[int, ...]]) -> GangOnFabric:
    t = builtin("dgx1-v100")
    return GangOnFabric(gpus, dict.fromkeys(gpus, t), WHERE, EDR)


def test_model_step_is_the_ring_at_the_bottleneck_and_names_it() -> None:
    vgg = PRESETS["vgg16"]
    links = Links()
    across = model_step(_gang({"a": tuple(range(8)), "d": tuple(range(8))}), (vgg,), links)
    assert (across.bus_gbps, across.bottleneck, across.tiers_crossed) == (12.5, "network", 2)
    assert across.step_seconds["vgg16"] == pytest.approx(step_seconds(vgg, 16, 12.5, links))
    leaf = model_step(_gang({"a": tuple(range(8)), "b": tuple(range(8))}), (vgg,), links)
    assert leaf.step_seconds["vgg16"] < across.step_seconds["vgg16"]
    # GPUs 0 and 5 share no NVLink on a DGX-1 V100: PCIe across sockets, 6 GB/s
    one = model_step(_gang({"a": (0, 5)}), (vgg,), links)
    assert (one.bus_gbps, one.bottleneck) == (6.0, "node a")
    assert model_step(_gang({"a": (0,)}), (vgg,), links).bottleneck == "none"


def _file(tmp_path: Path, doc: object) -> Path:
    p = tmp_path / "placement.json"
    p.write_text(json.dumps(doc))
    return p


NODES = [
    {"name": "n1", "nodeType": "dgx1-v100", "gpus": list(range(8)),
     "labels": {"network.topology.nvidia.com/spine": "s1",
                "network.topology.nvidia.com/leaf": "l1"}},
    {"name": "n2", "nodeType": "dgx1-v100", "gpus": [0, 1, 2, 3],
     "labels": {"network.topology.nvidia.com/spine": "s1",
                "network.topology.nvidia.com/leaf": "l2"}},
]


def test_parse_placement_reads_levels_from_topograph_labels() -> None:
    g = parse_placement({"fabric": {"railGBps": 12.5, "rails": 4, "oversubscription": [2]},
                         "nodes": NODES})
    assert g.where["n2"] == Where(("s1", "l2"))
    assert g.size == 12 and g.fabric.oversubscription == (2.0,)


@pytest.mark.parametrize(("doc", "message"), [
    ({"nodes": []}, "needs `nodes`"),
    ({"nodes": [{**NODES[0], "gpus": [0, 0]}]}, "distinct GPU indices"),
    ({"nodes": [{**NODES[0], "gpus": [8]}]}, "0..7"),
    ({"nodes": [{**NODES[0], "nodeType": "nope"}]}, "nope"),
    ({"nodes": [NODES[0], {**NODES[1], "labels": {}}]}, "n2 lacks the level label"),
    ({"nodes": NODES, "fabric": {"speed": 1}}, "unknown field"),
    ({"nodes": NODES, "fabric": {"oversubscription": [0.5]}}, r"1 \(non-blocking\) or more"),
    ({"nodes": [NODES[0], NODES[0]]}, "listed twice"),
])
def test_parse_placement_says_what_is_wrong(doc: object, message: str) -> None:
    with pytest.raises(PlacementError, match=message):
        parse_placement(doc)


def test_cli_simulate_placement(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    f = _file(tmp_path, {"fabric": {"railGBps": 12.5, "rails": 4, "oversubscription": [2, 2]},
                         "nodes": NODES})
    assert main(["simulate", "--placement", str(f), "--model", "vgg16"]) == 0
    out = capsys.readouterr().out
    assert "allreduce bus bandwidth: 25 GB/s (bottleneck: network)" in out
    assert main(["simulate", "--placement", str(f), "--model", "vgg16", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["busGBps"] == 25.0 and got["tiersCrossed"] == 1
    assert got["modelledStepSeconds"]["vgg16"] == pytest.approx(
        step_seconds(PRESETS["vgg16"], 12, 25.0, Links()))
    bad = _file(tmp_path, {"nodes": [NODES[0], {**NODES[1], "labels": {}}]})
    assert main(["simulate", "--placement", str(bad)]) == 2
    assert "lacks the level label" in capsys.readouterr().err
