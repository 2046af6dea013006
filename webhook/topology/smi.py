"""Parse `nvidia-smi topo -m` output into a Topology, so an admin can describe a node by pasting.

Reads the GPU-by-GPU part of the matrix (X, NV#, PIX, PXB, PHB, NODE, SYS and the older SOC),
the "CPU Affinity" and "NUMA Affinity" columns; NIC columns and rows and the legend are ignored.
Tabs or spaces both work (forum pastes turn tabs into spaces), and so does a capture taken through
a terminal: nvidia-smi underlines its header with escape sequences, `script` adds CR before LF.

Reading (`read_topo_matrix`) is apart from building (`build_topology`): what `topo -m` does not
show is the caller's to give, never a default taken silently (docs/topology.md):
- the PCIe generation, and the NVLink speed when the matrix shows NVLinks;
- GPU UUIDs and models: from `nvidia-smi -L` (`read_gpu_list`) when given; otherwise UUIDs are
  None (unknown) and the model is the caller's or "". Bus ids stay "".
What is filled in is conservative, and documented:
- a pair shown as NV# hides its PCIe level: it becomes NODE when both GPUs share a NUMA node
  (or CPU affinity) and SYS otherwise;
- NVSwitch is inferred when a GPU shows more NVLinks in total than any GPU has (18, H100): every
  such GPU is on the switch with the row's NV# as its link count (DGX-2 NV6, A100 NV12, H100 NV18).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from webhook.keys import decimal
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
#: terminal control sequences: CSI (the header's ESC[4m ... ESC[0m), OSC, and two-byte escapes
_ESCAPES = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[()][0-~]|[=>])")
#: `nvidia-smi -L`: "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-5e7d...)"; MIG lines are indented
_LISTED = re.compile(r"^GPU (\d+): (.+?) \(UUID: (GPU-[0-9A-Fa-f-]+)\)$")
#: a node without NVLink: no figure depends on the speed; the agent publishes this for such nodes,
#: so a parsed PCIe node and a discovered one share a topology class
_NO_NVLINK_GBPS = 25.0


@dataclass(frozen=True, slots=True)
class TopoMatrix:
    """What `nvidia-smi topo -m` shows about the GPUs of one node."""

    nvlinks: tuple[tuple[int, ...], ...]  # direct NVLink counts; 0 between NVSwitch members
    pcie: tuple[tuple[PCIeLevel, ...], ...]
    numa: tuple[int | None, ...]
    nvswitch: frozenset[int]
    nvswitch_links: int

    @property
    def size(self) -> int:
        return len(self.numa)

    @property
    def shows_nvlink(self) -> bool:
        return bool(self.nvswitch) or any(any(row) for row in self.nvlinks)


@dataclass(frozen=True, slots=True)
class ListedGpu:
    """One GPU line of `nvidia-smi -L`."""

    index: int
    model: str
    uuid: str


def _plain_lines(text: str) -> list[str]:
    """The lines of a capture without terminal escapes, CRs or tabs."""
    return _ESCAPES.sub("", text).replace("\r\n", "\n").expandtabs().splitlines()


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


def read_topo_matrix(text: str) -> TopoMatrix:
    """The GPU part of `nvidia-smi topo -m` text. Raises TopologyFormatError on bad input."""
    lines = _plain_lines(text)
    start, cols, trailing = _header(lines)
    gpu_cols = [c for c in cols if _GPU.match(c)]
    n = len(gpu_cols)
    if [int(_GPU.match(c).group(1)) for c in gpu_cols] != list(range(n)):  # type: ignore[union-attr]
        raise TopologyFormatError(f"GPU columns must be GPU0..GPU{n - 1}, got {gpu_cols}")
    # "NUMA Affinity" (or just "NUMA"), not "GPU NUMA ID"
    has_numa = any(w == "NUMA" and (k == 0 or trailing[k - 1] != "GPU")
                   for k, w in enumerate(trailing))
    rows = _gpu_rows(lines[start + 1:], cols, gpu_cols, has_numa)
    missing = [i for i in range(n) if i not in rows.cells]
    if missing:
        raise TopologyFormatError(f"rows missing for GPU{', GPU'.join(map(str, missing))}")
    numa = rows.numa
    if all(v is None for v in numa.values()):
        # no NUMA column: number the distinct CPU affinities in order of appearance
        groups: dict[str, int] = {}
        numa = {i: groups.setdefault(rows.affinity[i], len(groups)) for i in range(n)}
    links, pcie = _links(rows, numa, n)
    return _with_switch(links, pcie, tuple(numa[i] for i in range(n)))


@dataclass
class _Rows:
    """Each GPU row's cells (GPU columns only), CPU affinity and NUMA node."""

    cells: dict[int, list[str]] = field(default_factory=dict)
    affinity: dict[int, str] = field(default_factory=dict)
    numa: dict[int, int | None] = field(default_factory=dict)


def _gpu_rows(lines: list[str], cols: list[str], gpu_cols: list[str], has_numa: bool) -> _Rows:
    """The GPU rows under the header, until a blank line after them or the legend; NIC rows
    are skipped."""
    rows = _Rows()
    for line in lines:
        words = line.split()
        if not words:
            if rows.cells:
                break
            continue
        m = _GPU.match(words[0])
        if not m:
            if words[0].rstrip(":") == "Legend":
                break
            continue  # NIC rows
        i = int(m.group(1))
        if i >= len(gpu_cols):
            raise TopologyFormatError(f"row GPU{i} has no matching column")
        if len(words) < 1 + len(cols):
            raise TopologyFormatError(
                f"row GPU{i} has {len(words) - 1} cells, expected {len(cols)}"
            )
        row = words[1 : 1 + len(cols)]
        rows.cells[i] = [row[cols.index(c)] for c in gpu_cols]
        rest = words[1 + len(cols) :]
        rows.affinity[i] = rest[0] if rest else ""
        rows.numa[i] = decimal(rest[1]) if has_numa and len(rest) > 1 else None
    return rows


def _links(rows: _Rows, numa: dict[int, int | None], n: int
           ) -> tuple[list[list[int]], list[list[PCIeLevel]]]:
    """NVLink counts and PCIe levels between every pair of GPUs, from the matrix cells."""
    links = [[0] * n for _ in range(n)]
    pcie = [[PCIeLevel.INTERNAL] * n for _ in range(n)]
    for i in range(n):
        for j in range(n):
            cell = rows.cells[i][j]
            if i == j:
                if cell != "X":
                    raise TopologyFormatError(f"GPU{i} to itself must be X, got {cell!r}")
                continue
            nv = _NV.match(cell)
            if nv:
                links[i][j] = int(nv.group(1))
                # (by CPU affinity where either NUMA node is unknown: the same answer both ways)
                same = numa[i] == numa[j] if numa[i] is not None and numa[j] is not None \
                    else rows.affinity[i] == rows.affinity[j]
                pcie[i][j] = PCIeLevel.NODE if same else PCIeLevel.SYS
            elif cell in _LEVELS:
                pcie[i][j] = _LEVELS[cell]
            else:
                raise TopologyFormatError(f"unknown link {cell!r} between GPU{i} and GPU{j}")
    return links, pcie


def _with_switch(links: list[list[int]], pcie: list[list[PCIeLevel]],
                 numa: tuple[int | None, ...]) -> TopoMatrix:
    """GPUs with more NVLinks than direct links allow sit on an NVSwitch: their pairwise
    counts become the switch's link count."""
    n = len(links)
    switched = {i for i in range(n) if sum(links[i]) > MAX_DIRECT_LINKS}
    switch_links = 0
    if switched:
        switch_links = max(links[i][j] for i in switched for j in switched if i != j)
        for i in switched:
            for j in switched:
                links[i][j] = 0
    return TopoMatrix(nvlinks=tuple(tuple(r) for r in links), pcie=tuple(tuple(r) for r in pcie),
                      numa=numa, nvswitch=frozenset(switched), nvswitch_links=switch_links)


def read_gpu_list(text: str) -> tuple[ListedGpu, ...]:
    """The GPUs of `nvidia-smi -L` text, in index order. Raises TopologyFormatError."""
    listed = []
    for line in _plain_lines(text):
        if not line.startswith("GPU "):
            continue  # MIG devices (indented under their GPU), blank lines
        m = _LISTED.match(line.rstrip())
        if m is None:
            raise TopologyFormatError(
                f"cannot read {line.strip()!r}: expected `GPU 0: <model> (UUID: GPU-...)`")
        listed.append(ListedGpu(int(m.group(1)), m.group(2), m.group(3)))
    if not listed:
        raise TopologyFormatError("no `GPU 0: <model> (UUID: GPU-...)` line (`nvidia-smi -L`)")
    if [g.index for g in listed] != list(range(len(listed))):
        raise TopologyFormatError(
            f"GPU lines must be GPU 0..GPU {len(listed) - 1} in order, got "
            f"{[g.index for g in listed]}")
    return tuple(listed)


def build_topology(
    matrix: TopoMatrix,
    *,
    pcie_gen: int,
    nvlink_gbps: float | None,
    listed: Sequence[ListedGpu] = (),
    model: str = "",
    name: str = "",
) -> Topology:
    """A Topology from a matrix and what it does not show. `nvlink_gbps` may be None only when
    the matrix shows no NVLink (then the model's default stands: no figure depends on it).
    `listed` (from `nvidia-smi -L`) gives UUIDs and models; without it UUIDs are None and every
    GPU has `model`. Raises TopologyFormatError when the inputs disagree, ValueError when an
    NVLink speed is needed and missing."""
    if nvlink_gbps is None and matrix.shows_nvlink:
        raise ValueError("the matrix shows NVLinks: their speed is needed")
    n = matrix.size
    if listed and len(listed) != n:
        raise TopologyFormatError(
            f"nvidia-smi -L lists {len(listed)} GPUs but topo -m shows {n}: capture both on the "
            "same node")
    if listed and model and any(g.model != model for g in listed):
        raise TopologyFormatError(
            f"the model given ({model!r}) differs from nvidia-smi -L's "
            f"({', '.join(sorted({g.model for g in listed}))})")
    t = Topology(
        gpus=tuple(
            GPU(index=i, uuid=listed[i].uuid if listed else None, pci_bus_id="",
                model=listed[i].model if listed else model, numa_node=matrix.numa[i])
            for i in range(n)
        ),
        nvlinks=matrix.nvlinks,
        pcie=matrix.pcie,
        nvswitch=matrix.nvswitch,
        nvswitch_links=matrix.nvswitch_links,
        name=name,
        pcie_gen=pcie_gen,
        nvlink_gbps=_NO_NVLINK_GBPS if nvlink_gbps is None else nvlink_gbps,
    )
    validate(t)
    return t


def parse_nvidia_smi_topo(
    text: str,
    *,
    pcie_gen: int,
    nvlink_gbps: float | None,
    gpu_list: str = "",
    model: str = "",
    name: str = "",
) -> Topology:
    """A Topology from `nvidia-smi topo -m` text and, optionally, `nvidia-smi -L` text
    (`gpu_list`). Raises TopologyFormatError on bad input."""
    listed = read_gpu_list(gpu_list) if gpu_list else ()
    return build_topology(read_topo_matrix(text), pcie_gen=pcie_gen, nvlink_gbps=nvlink_gbps,
                          listed=listed, model=model, name=name)
