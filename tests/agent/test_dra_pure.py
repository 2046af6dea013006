"""The DRA driver's pure parts: the ResourceSlice built from a topology, which devices a claim
gets prepared, the conflict rule, the CDI spec and the checkpoint codec."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from dra_helpers import make_claim

from webhook import keys
from webhook.agent.discovery import discover
from webhook.agent.dra import claims, slices
from webhook.agent.dra.publisher import pcie_roots, sysfs_bus_id
from webhook.doubles.fakenvml import FakeNvml
from webhook.topology.model import Topology

NODE = "gpu-node-1"


@pytest.fixture(scope="module")
def hgx() -> Topology:
    topo = discover(FakeNvml.profile("hgx-a100")).topology
    assert topo is not None
    return topo


def attrs(device: dict[str, object]) -> dict[str, object]:
    out = {}
    for name, value in device["attributes"].items():  # type: ignore[attr-defined]
        ((_, v),) = value.items()  # exactly one typed value per attribute
        out[name] = v
    return out


def test_slice_names_pool_driver_and_one_device_per_gpu(dgx1: Topology) -> None:
    s = slices.resource_slice(NODE, dgx1, 3, {})
    assert s["apiVersion"] == "resource.k8s.io/v1" and s["kind"] == "ResourceSlice"
    spec = s["spec"]
    assert spec["driver"] == "gpu.muster.io" and spec["nodeName"] == NODE
    assert spec["pool"] == {"name": NODE, "generation": 3, "resourceSliceCount": 1}
    assert [d["name"] for d in spec["devices"]] == [f"gpu-{g.index}" for g in dgx1.gpus]
    for device, gpu in zip(spec["devices"], dgx1.gpus, strict=True):
        a = attrs(device)
        assert a["uuid"] == gpu.uuid and a["index"] == gpu.index and a["model"] == gpu.model
        assert a["numaNode"] == gpu.numa_node
        assert device["capacity"] == {"memory": {"value": f"{gpu.memory_mib}Mi"}}
        assert slices.PCIE_ROOT not in a  # sysfs said nothing: never made up


def test_nvlink_peers_spell_the_dgx1_link_matrix(dgx1: Topology) -> None:
    devices = slices.devices(dgx1, {})
    for i, device in enumerate(devices):
        peers = attrs(device)["nvlinkPeers"]
        assert isinstance(peers, str) and len(peers) == dgx1.size
        decoded = [0 if c == "-" else int(c, 36) for c in peers]
        assert decoded == list(dgx1.nvlinks[i])
        assert peers[i] == "-"
    assert attrs(devices[0])["nvlinkPeers"] == "-1122000"  # DESIGN.md's DGX-1V row of GPU 0
    # the DGX-1's cube mesh connects all eight: one domain, named by its lowest index
    assert {attrs(d)["nvlinkDomain"] for d in devices} == {0}
    assert all("nvswitchLinks" not in attrs(d) for d in devices)


def test_nvlink_domains_split_where_links_do(dgx1: Topology) -> None:
    cut = [[0] * 8 for _ in range(8)]
    for i, j in ((0, 1), (1, 2), (5, 6)):  # {0,1,2}, {5,6}, the rest alone
        cut[i][j] = cut[j][i] = 1
    topo = dataclasses.replace(dgx1, nvlinks=tuple(tuple(r) for r in cut))
    assert slices.nvlink_domains(topo) == [0, 0, 0, 3, 4, 5, 5, 7]


def test_nvswitch_gpus_share_a_domain_and_say_their_switch_links(hgx: Topology) -> None:
    devices = slices.devices(hgx, {})
    assert {attrs(d)["nvlinkDomain"] for d in devices} == {0}
    assert {attrs(d)["nvswitchLinks"] for d in devices} == {hgx.nvswitch_links}
    assert hgx.nvswitch_links > 0


def test_unhealthy_gpus_are_not_offered(dgx1: Topology) -> None:
    gpus = list(dgx1.gpus)
    gpus[3] = dataclasses.replace(gpus[3], healthy=False)
    names = [d["name"] for d in slices.devices(dataclasses.replace(dgx1, gpus=tuple(gpus)), {})]
    assert "gpu-3" not in names and len(names) == 7


def test_pcie_root_comes_from_the_sysfs_path(dgx1: Topology, tmp_path: Path) -> None:
    real = tmp_path / "devices" / "pci0000:80" / "0000:80:01.0" / sysfs_bus_id(
        dgx1.gpus[5].pci_bus_id)
    real.mkdir(parents=True)
    bus = tmp_path / "bus"
    bus.mkdir()
    (bus / sysfs_bus_id(dgx1.gpus[5].pci_bus_id)).symlink_to(real)
    roots = pcie_roots(dgx1, bus)
    assert roots == {5: "pci0000:80"}
    device = slices.devices(dgx1, roots)[5]
    assert attrs(device)[slices.PCIE_ROOT] == "pci0000:80"


def test_sysfs_bus_id_drops_nvmls_wide_domain() -> None:
    assert sysfs_bus_id("00000000:0A:00.0") == "0000:0a:00.0"
    assert sysfs_bus_id("0001:85:00.0") == "0001:85:00.0"


def test_same_devices_ignores_only_the_generation(dgx1: Topology) -> None:
    a = slices.resource_slice(NODE, dgx1, 1, {})
    assert slices.same_devices(a, slices.resource_slice(NODE, dgx1, 7, {}))
    assert not slices.same_devices(a, slices.resource_slice(NODE, dgx1, 1, {0: "pci0000:00"}))


GPUS = {"gpu-0": "GPU-a", "gpu-1": "GPU-b", "gpu-2": "GPU-c"}


def test_plan_takes_this_drivers_results_in_this_pool() -> None:
    claim = make_claim("c", "u1", ["gpu-2", "gpu-0"], pool=NODE)
    claim["status"]["allocation"]["devices"]["results"].append(
        {"request": "nic", "driver": "nic.example.com", "pool": NODE, "device": "eth0"})
    planned = claims.plan(claim, "ml", "c", "u1", node=NODE, gpus=GPUS)
    assert [(d.device, d.uuid, d.pool, d.request) for d in planned.devices] == [
        ("gpu-2", "GPU-c", NODE, "gpus"), ("gpu-0", "GPU-a", NODE, "gpus")]


@pytest.mark.parametrize(("claim", "uid", "said"), [
    (make_claim("c", "u1", ["gpu-0"], pool=NODE), "other", "re-created"),
    (make_claim("c", "u1", ["gpu-0"], pool=NODE, allocated=False), "u1", "not allocated"),
    (make_claim("c", "u1", ["gpu-0"], pool=NODE, reserved=False), "u1", "no consumer"),
    (make_claim("c", "u1", ["gpu-0"], pool=NODE, driver="gpu.nvidia.com"), "u1",
     "no device of driver gpu.muster.io"),
    (make_claim("c", "u1", ["gpu-0"], pool="other-node"), "u1", "not this node's"),
    (make_claim("c", "u1", ["gpu-7"], pool=NODE), "u1", "gpu-7 is not a healthy GPU"),
    (make_claim("c", "u1", ["gpu-1", "gpu-1"], pool=NODE), "u1", "one GPU twice"),
])
def test_plan_refuses_with_the_reason(claim: dict[str, object], uid: str, said: str) -> None:
    with pytest.raises(claims.Refused, match=said):
        claims.plan(claim, "ml", "c", uid, node=NODE, gpus=GPUS)


def test_conflicts_name_the_other_claim_holding_a_gpu() -> None:
    held = claims.plan(make_claim("a", "ua", ["gpu-0", "gpu-1"], pool=NODE), "ml", "a", "ua",
                       node=NODE, gpus=GPUS)
    wanted = claims.plan(make_claim("b", "ub", ["gpu-1", "gpu-2"], pool=NODE), "ml", "b", "ub",
                         node=NODE, gpus=GPUS)
    prepared = {"ua": held}
    taken = claims.conflicts(prepared, "ub", wanted)
    assert taken == {"GPU-b": "ua"}
    assert claims.conflicts(prepared, "ua", held) == {}  # a claim never conflicts with itself
    message = claims.refusal_for_conflicts("ml/b", taken, prepared)
    assert "GPU-b (held by ResourceClaim ml/a, uid ua)" in message


def test_still_holds_follows_the_api() -> None:
    claim = make_claim("a", "ua", ["gpu-0"], pool=NODE)
    assert claims.still_holds(claim, "ua", NODE, "gpu-0")
    assert not claims.still_holds(None, "ua", NODE, "gpu-0")
    assert not claims.still_holds(claim, "other-uid", NODE, "gpu-0")
    assert not claims.still_holds(claim, "ua", NODE, "gpu-1")
    assert not claims.still_holds(make_claim("a", "ua", ["gpu-0"], pool=NODE, allocated=False),
                                  "ua", NODE, "gpu-0")


def test_cdi_spec_exposes_exactly_the_claims_gpus() -> None:
    planned = claims.plan(make_claim("c", "u1", ["gpu-2", "gpu-0"], pool=NODE), "ml", "c", "u1",
                          node=NODE, gpus=GPUS)
    spec = claims.cdi_spec("u1", planned)
    assert spec["kind"] == keys.CDI_KIND == "muster.io/gpu"
    assert spec["containerEdits"] == {"env": ["NVIDIA_VISIBLE_DEVICES=GPU-c,GPU-a"]}
    assert [d["name"] for d in spec["devices"]] == ["u1-gpu-2", "u1-gpu-0"]
    assert all(d["containerEdits"]["env"] for d in spec["devices"])  # CDI needs edits per device
    assert claims.cdi_device_ids("u1", planned) == ["muster.io/gpu=u1-gpu-2",
                                                    "muster.io/gpu=u1-gpu-0"]


def test_checkpoint_round_trips_and_refuses_another_version() -> None:
    prepared = {"u1": claims.plan(make_claim("c", "u1", ["gpu-1"], pool=NODE), "ml", "c", "u1",
                                  node=NODE, gpus=GPUS)}
    assert claims.decode_checkpoint(claims.encode_checkpoint(prepared)) == prepared
    with pytest.raises(ValueError, match="version 1"):
        claims.decode_checkpoint(b'{"version": 2, "claims": {}}')
