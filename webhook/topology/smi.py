"""Parse `nvidia-smi topo -m` output into a Topology, so an admin can describe a node by pasting.

Reads the GPU-by-GPU part of the matrix (X, NV#, PIX, PXB, PHB, NODE, SYS and the older SOC),
the "CPU Affinity" and "NUMA Affinity" columns; NIC columns and rows and the legend are ignored.
Tabs or spaces both work (forum pastes turn tabs into spaces).

What `topo -m` does not say is filled in conservatively, and documented in docs/topology.md:
- a pair shown as NV# hides its PCIe level: it becomes NODE when both GPUs share a NUMA node
  (or CPU affinity) and SYS otherwise;
- NVSwitch is inferred when a GPU shows more NVLinks in total than any GPU has (18, H100): every
  such GPU is on the switch with the row's NV# as its link count (DGX-2 NV6, A100 NV12, H100 NV18);
- GPU model, link speed and PCIe generation come from the caller (`muster topology parse` flags);
- UUIDs and bus ids are unknown: stable placeholders are generated.
"""

from __future__ import annotations

import re
import uuid

from webhook.topology.codec import TopologyFormatError, validate
from webhook.topology.model import GPU, PCIeLevel, Topology

#: the most NVLink links one GPU has (H100 SXM: 18); more in one row means an NVSwitch
MAX_DIRECT_LINKS = 18

_LEVELS = {
    "PIX": PCIeLevel.PIX,
    "PXB": PCIeLevel.PXB,
    "PHB": PCIeLevel.PHB,
    "NODE": PCIeLevel.NODE,
    "SYS": PCIeLevel.SYS,
    "SOC": PCIeLevel.SYS,  # drivers before 384 called it SOC
}
_GPU = re.compile(r"^GPU(\d+)$")
_NV = re.compile(r"^NV(\d+)$")
_UUID_NS = uuid.UUID("0c5b6a8e-2f0b-4d53-8c8e-736d69746f70")


def _header(lines: list[str]) -> tuple[int, list[str], list[str]]:
    """(index of the header line, device column names, trailing column words)."""
    for i, line in enumerate(lines):
        words = line.split()
        if words and _GPU.match(words[0]):
            cols: list[str] = []
            for w in words:
                if w in ("CPU", "NUMA") or (w == "GPU" and cols):
                    break
                cols.append(w)
            return i, cols, words[len(cols):]
    raise TopologyFormatError("no `nvidia-smi topo -m` header found (a line starting with GPU0)")


def parse_nvidia_smi_topo(
    text: str,
    *,
    model: str = "",
    nvlink_gbps: float = 25.0,
    pcie_gen: int = 3,
    name: str = "",
) -> Topology:
    """A Topology from `nvidia-smi topo -m` text. Raises TopologyFormatError on bad input."""
    lines = text.expandtabs().splitlines()
    start, cols, trailing = _header(lines)
    gpu_cols = [c for c in cols if _GPU.match(c)]
    n = len(gpu_cols)
    if [int(_GPU.match(c).group(1)) for c in gpu_cols] != list(range(n)):  # type: ignore[union-attr]
        raise TopologyFormatError(f"GPU columns must be GPU0..GPU{n - 1}, got {gpu_cols}")
    # "NUMA Affinity" (or just "NUMA"), not "GPU NUMA ID"
    has_numa = any(w == "NUMA" and (k == 0 or trailing[k - 1] != "GPU")
                   for k, w in enumerate(trailing))
    cells: dict[int, list[str]] = {}
    affinity: dict[int, str] = {}
    numa: dict[int, int | None] = {}
    for line in lines[start + 1 :]:
        words = line.split()
        if not words:
            if cells:
                break
            continue
        m = _GPU.match(words[0])
        if not m:
            if words[0].rstrip(":") == "Legend":
                break
            continue  # NIC rows
        i = int(m.group(1))
        if i >= n:
            raise TopologyFormatError(f"row GPU{i} has no matching column")
        if len(words) < 1 + len(cols):
            raise TopologyFormatError(
                f"row GPU{i} has {len(words) - 1} cells, expected {len(cols)}"
            )
        row = words[1 : 1 + len(cols)]
        cells[i] = [row[cols.index(c)] for c in gpu_cols]
        rest = words[1 + len(cols) :]
        affinity[i] = rest[0] if rest else ""
        numa[i] = int(rest[1]) if has_numa and len(rest) > 1 and rest[1].isdigit() else None
    missing = [i for i in range(n) if i not in cells]
    if missing:
        raise TopologyFormatError(f"rows missing for GPU{', GPU'.join(map(str, missing))}")
    if all(v is None for v in numa.values()):
        # no NUMA column: number the distinct CPU affinities in order of appearance
        groups: dict[str, int] = {}
        numa = {i: groups.setdefault(affinity[i], len(groups)) for i in range(n)}

    links = [[0] * n for _ in range(n)]
    pcie = [[PCIeLevel.INTERNAL] * n for _ in range(n)]
    for i in range(n):
        for j in range(n):
            cell = cells[i][j]
            if i == j:
                if cell != "X":
                    raise TopologyFormatError(f"GPU{i} to itself must be X, got {cell!r}")
                continue
            nv = _NV.match(cell)
            if nv:
                links[i][j] = int(nv.group(1))
                same = numa[i] == numa[j] if numa[i] is not None else affinity[i] == affinity[j]
                pcie[i][j] = PCIeLevel.NODE if same else PCIeLevel.SYS
            elif cell in _LEVELS:
                pcie[i][j] = _LEVELS[cell]
            else:
                raise TopologyFormatError(f"unknown link {cell!r} between GPU{i} and GPU{j}")
    switched = {i for i in range(n) if sum(links[i]) > MAX_DIRECT_LINKS}
    switch_links = 0
    if switched:
        switch_links = max(links[i][j] for i in switched for j in switched if i != j)
        for i in switched:
            for j in switched:
                links[i][j] = 0
    t = Topology(
        gpus=tuple(
            GPU(index=i, uuid=f"GPU-{uuid.uuid5(_UUID_NS, f'{name}/{i}')}",
                pci_bus_id="", model=model, numa_node=numa[i])
            for i in range(n)
        ),
        nvlinks=tuple(tuple(r) for r in links),
        pcie=tuple(tuple(r) for r in pcie),
        nvlink_gbps=nvlink_gbps,
        nvswitch=frozenset(switched),
        nvswitch_links=switch_links,
        name=name,
        pcie_gen=pcie_gen,
    )
    validate(t)
    return t
