"""Built-in node types: the GPU servers Muster knows by name.

Link counts, PCIe hierarchy and NUMA layout follow the vendors' published block diagrams and the
`nvidia-smi topo -m` output of those machines (see docs/topology.md). UUIDs are fake but stable
(derived from the type name and index), so tests and `muster simulate` are reproducible.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable, Sequence

from webhook.topology.model import GPU, PCIeLevel, Topology

_UUID_NS = uuid.UUID("6f1d3c2e-5b1a-4c59-9d0e-6d7573746572")

#: DGX-1 V100 hybrid cube-mesh, NVLink 2.0: links between GPU i and j (docs/design.md, "Reference
#: facts")
DGX1_V100_NVLINKS = (
    (0, 1, 1, 2, 2, 0, 0, 0),
    (1, 0, 2, 1, 0, 2, 0, 0),
    (1, 2, 0, 2, 0, 0, 1, 0),
    (2, 1, 2, 0, 0, 0, 0, 1),
    (2, 0, 0, 0, 0, 1, 1, 2),
    (0, 2, 0, 0, 1, 0, 2, 1),
    (0, 0, 1, 0, 1, 2, 0, 2),
    (0, 0, 0, 1, 2, 1, 2, 0),
)


def _dgx1p_links() -> tuple[tuple[int, ...], ...]:
    # P100 has 4 NVLink 1.0 links: a full mesh inside each quad plus one link to the mirror GPU.
    m = [[0] * 8 for _ in range(8)]
    for base in (0, 4):
        for a in range(base, base + 4):
            for b in range(base, base + 4):
                if a != b:
                    m[a][b] = 1
    for a in range(4):
        m[a][a + 4] = m[a + 4][a] = 1
    return tuple(tuple(r) for r in m)


def _pcie(n: int, level: Callable[[int, int], PCIeLevel]) -> tuple[tuple[PCIeLevel, ...], ...]:
    return tuple(
        tuple(PCIeLevel.INTERNAL if i == j else level(i, j) for j in range(n)) for i in range(n)
    )


def _tiered(i: int, j: int, *, switch: int, tree: int, socket: int, inner: PCIeLevel,
            mid: PCIeLevel, same_socket: PCIeLevel) -> PCIeLevel:
    """PCIe level for servers whose GPUs hang off switches in blocks of `switch`, trees of
    `tree` GPUs and sockets of `socket` GPUs (all consecutive indices)."""
    if i // socket != j // socket:
        return PCIeLevel.SYS
    if i // switch == j // switch:
        return inner
    if i // tree == j // tree:
        return mid
    return same_socket


def synthetic_uuid(name: str, index: int) -> str:
    """The fake but stable UUID of GPU `index` of built-in node type `name`."""
    return f"GPU-{uuid.uuid5(_UUID_NS, f'{name}/{index}')}"


def _gpus(name: str, model: str, bus_ids: Sequence[str], memory_mib: int,
          gpus_per_numa: int) -> tuple[GPU, ...]:
    return tuple(
        GPU(
            index=i,
            uuid=synthetic_uuid(name, i),
            pci_bus_id=f"00000000:{bus}:00.0",
            model=model,
            numa_node=i // gpus_per_numa,
            memory_mib=memory_mib,
        )
        for i, bus in enumerate(bus_ids)
    )


def _no_links(n: int) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(0 for _ in range(n)) for _ in range(n))


def _pairs(n: int, links: int) -> tuple[tuple[int, ...], ...]:
    return tuple(
        tuple(links if i != j and i // 2 == j // 2 else 0 for j in range(n)) for i in range(n)
    )


_DGX1_BUS = ("06", "07", "0A", "0B", "85", "86", "89", "8A")


def _dgx1_pcie(i: int, j: int) -> PCIeLevel:
    return _tiered(i, j, switch=2, tree=4, socket=4, inner=PCIeLevel.PIX, mid=PCIeLevel.PHB,
                   same_socket=PCIeLevel.PHB)


def _make(name: str) -> Topology:
    if name == "dgx1-p100":
        return Topology(
            gpus=_gpus(name, "Tesla P100-SXM2-16GB", _DGX1_BUS, 16280, 4),
            nvlinks=_dgx1p_links(), pcie=_pcie(8, _dgx1_pcie), nvlink_gbps=20.0, name=name,
        )
    if name == "dgx1-v100":
        return Topology(
            gpus=_gpus(name, "Tesla V100-SXM2-16GB", _DGX1_BUS, 16160, 4),
            nvlinks=DGX1_V100_NVLINKS, pcie=_pcie(8, _dgx1_pcie), nvlink_gbps=25.0, name=name,
        )
    if name == "dgx2":
        bus: tuple[str, ...] = ("34", "36", "39", "3B", "57", "59", "5C", "5E",
               "B7", "B9", "BC", "BE", "E0", "E2", "E5", "E7")
        return Topology(
            gpus=_gpus(name, "Tesla V100-SXM3-32GB", bus, 32480, 8),
            nvlinks=_no_links(16),
            pcie=_pcie(16, lambda i, j: _tiered(
                i, j, switch=2, tree=4, socket=8, inner=PCIeLevel.PIX, mid=PCIeLevel.PXB,
                same_socket=PCIeLevel.NODE)),
            nvlink_gbps=25.0, nvswitch=frozenset(range(16)), nvswitch_links=6, name=name,
        )
    if name == "hgx-a100":
        bus = ("07", "0F", "47", "4E", "87", "90", "B7", "BD")
        return Topology(
            gpus=_gpus(name, "NVIDIA A100-SXM4-80GB", bus, 81920, 4),
            nvlinks=_no_links(8),
            pcie=_pcie(8, lambda i, j: _tiered(
                i, j, switch=2, tree=2, socket=4, inner=PCIeLevel.PXB, mid=PCIeLevel.PXB,
                same_socket=PCIeLevel.NODE)),
            nvlink_gbps=25.0, nvswitch=frozenset(range(8)), nvswitch_links=12, name=name,
            pcie_gen=4,
        )
    if name == "hgx-h100":
        bus = ("1B", "43", "52", "61", "9D", "C3", "D1", "DF")
        return Topology(
            gpus=_gpus(name, "NVIDIA H100 80GB HBM3", bus, 81559, 4),
            nvlinks=_no_links(8),
            pcie=_pcie(8, lambda i, j: _tiered(
                i, j, switch=1, tree=1, socket=4, inner=PCIeLevel.NODE, mid=PCIeLevel.NODE,
                same_socket=PCIeLevel.NODE)),
            nvlink_gbps=25.0, nvswitch=frozenset(range(8)), nvswitch_links=18, name=name,
            pcie_gen=5,
        )
    if name == "pcie8-dual-socket":
        bus = ("1A", "1B", "1C", "1D", "B1", "B2", "B3", "B4")
        return Topology(
            gpus=_gpus(name, "NVIDIA L40S", bus, 46068, 4),
            nvlinks=_no_links(8),
            pcie=_pcie(8, lambda i, j: _tiered(
                i, j, switch=4, tree=4, socket=4, inner=PCIeLevel.PIX, mid=PCIeLevel.PIX,
                same_socket=PCIeLevel.PIX)),
            name=name, pcie_gen=4,
        )
    if name == "pcie8-nvlink-pairs":
        bus = ("17", "31", "4B", "65", "98", "B1", "CA", "E3")
        return Topology(
            gpus=_gpus(name, "NVIDIA A100 80GB PCIe", bus, 81920, 4),
            nvlinks=_pairs(8, 12),  # three NVLink bridges, 4 links each, per pair
            pcie=_pcie(8, lambda i, j: _tiered(
                i, j, switch=2, tree=2, socket=4, inner=PCIeLevel.PIX, mid=PCIeLevel.PIX,
                same_socket=PCIeLevel.NODE)),
            nvlink_gbps=25.0, name=name, pcie_gen=4,
        )
    raise KeyError(name)


NAMES: tuple[str, ...] = (
    "dgx1-p100",
    "dgx1-v100",
    "dgx2",
    "hgx-a100",
    "hgx-h100",
    "pcie8-dual-socket",
    "pcie8-nvlink-pairs",
)


@functools.cache
def builtin(name: str) -> Topology:
    """The built-in node type `name` (one of NAMES); KeyError naming the known types if unknown."""
    if name not in NAMES:
        raise KeyError(f"unknown node type {name!r}; known: {', '.join(NAMES)}")
    return _make(name)
