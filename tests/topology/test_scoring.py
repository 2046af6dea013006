"""Bandwidth scores of known sets, and the engine against brute force on random NVLink meshes."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.topology import GPU, PCIeLevel, Topology, builtin
from webhook.topology.gpu_choice import ClassTables, choose_gpus
from webhook.topology.scoring import (
    allreduce_gbps,
    bisection_gbps,
    has_nvlink_ring,
    numa_nodes,
    ring_gbps,
    to_mask,
)

from .test_exhaustive import Brute


def m(*gpus: int) -> int:
    return to_mask(gpus)


def test_known_bus_bandwidths() -> None:
    v, p = builtin("dgx1-v100"), builtin("dgx1-p100")
    assert allreduce_gbps(v, m(*range(8))) == 150.0  # three rings each way x 25 GB/s
    assert ring_gbps(v, m(*range(8))) == 50.0  # the double-link ring 0-3-2-1-5-6-7-4
    assert allreduce_gbps(v, m(0, 1, 2, 3)) == 100.0
    assert allreduce_gbps(v, m(0, 2, 3, 4, 7)) == 50.0  # docs/design.md's example
    assert allreduce_gbps(v, m(0, 1, 2, 3, 4)) == 6.0  # no NVLink ring: one PCIe ring over SYS
    assert not has_nvlink_ring(v, m(0, 1, 2, 3, 4)) and has_nvlink_ring(v, m(0, 2, 3, 4, 7))
    assert allreduce_gbps(v, m(0, 3)) == 50.0 and allreduce_gbps(v, m(0, 5)) == 6.0
    assert allreduce_gbps(p, m(*range(8))) == 80.0  # P100: two rings each way x 20 GB/s
    assert allreduce_gbps(builtin("hgx-a100"), m(0, 5)) == 300.0
    assert allreduce_gbps(builtin("hgx-h100"), m(*range(8))) == 450.0
    assert allreduce_gbps(builtin("dgx2"), m(*range(16))) == 150.0
    pcie = builtin("pcie8-dual-socket")  # Gen4: PIX 24, SYS 12
    assert allreduce_gbps(pcie, m(0, 1, 2, 3)) == 24.0 and allreduce_gbps(pcie, m(0, 4)) == 12.0
    pairs = builtin("pcie8-nvlink-pairs")
    assert allreduce_gbps(pairs, m(0, 1)) == 300.0
    assert allreduce_gbps(pairs, m(0, 1, 2, 3)) == 18.0  # ring must cross PCIe (NODE, Gen4)
    assert allreduce_gbps(v, m(0)) == 0.0 and ring_gbps(v, 0) == 0.0


def test_bisection_and_numa() -> None:
    v = builtin("dgx1-v100")
    # {0,1,2,3} | any balanced cut crosses >= 4 links (100 GB/s) plus the PHB path (10)
    assert bisection_gbps(v, m(0, 1, 2, 3)) == 135.0
    assert bisection_gbps(v, m(0, 1, 6, 7)) == 6.0  # {0,1} | {6,7}: no NVLink, SYS
    assert bisection_gbps(v, m(0, 1, 2)) == 60.0  # {0} | {1,2}: two links plus PHB (10)
    assert bisection_gbps(v, m(0, 1)) == 37.0  # one link plus PIX (12)
    assert numa_nodes(v, m(0, 1, 2, 3)) == 1 and numa_nodes(v, m(3, 4)) == 2
    assert bisection_gbps(builtin("hgx-a100"), m(*range(8))) == 1200.0


def _mesh(links: list[int], numa: list[int]) -> Topology:
    n = len(numa)
    it = iter(links)
    mat = [[0] * n for _ in range(n)]
    for i, j in itertools.combinations(range(n), 2):
        mat[i][j] = mat[j][i] = next(it)
    return Topology(
        gpus=tuple(GPU(index=i, uuid=f"GPU-r{i}", pci_bus_id="", model="X", numa_node=numa[i])
                   for i in range(n)),
        nvlinks=tuple(tuple(r) for r in mat),
        pcie=tuple(tuple(PCIeLevel.INTERNAL if i == j else
                         PCIeLevel.PIX if numa[i] == numa[j] else PCIeLevel.SYS
                         for j in range(n)) for i in range(n)),
    )


@settings(max_examples=30, deadline=None)
@given(
    links=st.lists(st.integers(0, 3), min_size=10, max_size=10),
    numa=st.lists(st.integers(0, 1), min_size=5, max_size=5),
)
def test_random_meshes_reach_the_brute_force_optimum(links: list[int], numa: list[int]) -> None:
    t = _mesh(links, numa)
    brute = Brute(t)
    tables = ClassTables(t)
    for s in range(1, 1 << 5):
        gpus = tuple(i for i in range(5) if s >> i & 1)
        assert tables.score(s).allreduce_gbps == brute.allreduce(gpus)
    for free in (0b11111, 0b10111, 0b01110):
        fs = tuple(i for i in range(5) if free >> i & 1)
        for k in range(1, len(fs) + 1):
            chosen = choose_gpus(t, fs, k)
            assert chosen is not None
            assert brute.allreduce(chosen) == brute.best(fs, k)
