"""Built-in node types and the JSON codec (node annotation)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from webhook.topology import (
    NAMES,
    PCIeLevel,
    TopologyFormatError,
    builtin,
    decode,
    encode,
    topology_class,
)
from webhook.topology.model import GPU


@pytest.mark.parametrize("name", NAMES)
def test_builtin_round_trips_and_is_consistent(name: str) -> None:
    t = builtin(name)
    assert t.name == name
    assert decode(encode(t)) == t
    n = t.size
    assert all(t.nvlinks[i][j] == t.nvlinks[j][i] for i in range(n) for j in range(n))
    assert len({g.uuid for g in t.gpus}) == n
    assert len({g.pci_bus_id for g in t.gpus}) == n
    assert all(g.numa_node is not None for g in t.gpus)


def test_dgx1v_matches_design_matrix() -> None:
    t = builtin("dgx1-v100")
    assert t.nvlinks[0] == (0, 1, 1, 2, 2, 0, 0, 0)
    assert t.nvlinks[7] == (0, 0, 0, 1, 2, 1, 2, 0)
    assert [sum(r) for r in t.nvlinks] == [6] * 8  # V100: six NVLink 2.0 links per GPU
    assert t.pcie[0][1] == PCIeLevel.PIX and t.pcie[0][2] == PCIeLevel.PHB
    assert t.pcie[0][4] == PCIeLevel.SYS
    assert [g.numa_node for g in t.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_p100_has_four_links_per_gpu() -> None:
    assert [sum(r) for r in builtin("dgx1-p100").nvlinks] == [4] * 8


def test_uuids_are_stable_and_distinct_across_types() -> None:
    a, b = builtin("dgx1-v100"), builtin("dgx1-p100")
    assert a.gpus[0].uuid.startswith("GPU-")
    assert a.gpus[0].uuid != b.gpus[0].uuid
    assert builtin.__wrapped__("dgx1-v100").gpus[3].uuid == a.gpus[3].uuid


def test_unknown_builtin_names_the_known_ones() -> None:
    with pytest.raises(KeyError, match="dgx1-v100"):
        builtin("dgx3")


def test_class_ignores_uuids_and_bus_ids_but_not_links() -> None:
    t = builtin("dgx1-v100")
    other = dataclasses.replace(
        t,
        gpus=tuple(dataclasses.replace(g, uuid=f"GPU-x{g.index}", pci_bus_id=f"0:{g.index}")
                   for g in t.gpus),
        name="",
    )
    assert topology_class(other) == topology_class(t)
    rows = [list(r) for r in t.nvlinks]
    rows[0][1] = rows[1][0] = 2
    changed = dataclasses.replace(t, nvlinks=tuple(tuple(r) for r in rows))
    assert topology_class(changed) != topology_class(t)
    numa = dataclasses.replace(
        t, gpus=tuple(dataclasses.replace(g, numa_node=0) for g in t.gpus))
    assert topology_class(numa) != topology_class(t)
    assert len({topology_class(builtin(n)) for n in NAMES}) == len(NAMES)


def test_encoding_is_compact_and_versioned() -> None:
    s = encode(builtin("hgx-h100"))
    doc = json.loads(s)
    assert doc["v"] == 1 and doc["class"] == topology_class(builtin("hgx-h100"))
    assert " " not in s.replace("NVIDIA H100 80GB HBM3", "")
    assert doc["nvswitchLinks"] == 18


def _doc() -> dict[str, object]:
    d: dict[str, object] = json.loads(encode(builtin("dgx1-v100")))
    return d


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(v=2), "schema version v=2"),
        (lambda d: d.pop("gpus"), "gpus"),
        (lambda d: d.update(nvlinks=[[0]]), "8x8"),
        (lambda d: d["nvlinks"][0].__setitem__(1, 3), "symmetric"),
        (lambda d: d["pcie"][0].__setitem__(1, 15), "PCIe level"),
        (lambda d: d.update(class_="x"), "class_"),
        (lambda d: d.update({"class": "0000"}), "does not match"),
        (lambda d: d.update(nvswitch=[9], nvswitchLinks=6), "do not exist"),
        (lambda d: d["gpus"][1].update(uuid=d["gpus"][0]["uuid"]), "unique"),
        (lambda d: d["gpus"][1].update(uuid=""), "gpus.1.uuid"),
    ],
)
def test_bad_documents_get_clear_errors(mutate: object, message: str) -> None:
    d = _doc()
    mutate(d)  # type: ignore[operator]
    with pytest.raises(TopologyFormatError, match=message):
        decode(json.dumps(d))


@pytest.mark.parametrize("raw", ["", "{", "[]", "null", "42"])
def test_not_json_objects_are_rejected(raw: str) -> None:
    with pytest.raises(TopologyFormatError):
        decode(raw)


def test_discovered_topology_without_class_decodes() -> None:
    d = _doc()
    del d["class"]
    d["name"] = ""
    t = decode(json.dumps(d))
    assert t.name == "" and topology_class(t) == topology_class(builtin("dgx1-v100"))


def test_encode_refuses_inconsistent_topology() -> None:
    t = builtin("dgx1-v100")
    broken = dataclasses.replace(
        t, gpus=(*t.gpus[:7], GPU(index=9, uuid="GPU-z", pci_bus_id="", model="")))
    with pytest.raises(TopologyFormatError, match="indices"):
        encode(broken)


def test_unknown_uuids_are_null_and_only_known_ones_must_differ() -> None:
    d = _doc()
    for g in d["gpus"][2:]:  # type: ignore[attr-defined]
        g["uuid"] = None
    del d["gpus"][0]["uuid"]  # type: ignore[index]
    t = decode(json.dumps(d))
    assert [g.uuid for g in t.gpus] == [None, builtin("dgx1-v100").gpus[1].uuid] + [None] * 6
    assert json.loads(encode(t))["gpus"][0]["uuid"] is None
    assert decode(encode(t)) == t
    assert topology_class(t) == topology_class(builtin("dgx1-v100"))
