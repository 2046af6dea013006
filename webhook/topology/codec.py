"""The versioned JSON form of a Topology (node annotation `muster.io/gpu-topology`).

    {"v":1,"class":"3f9a…","name":"dgx1-v100","nvlinkGBps":25.0,"pcieGen":3,
     "nvswitch":[],"nvswitchLinks":0,
     "gpus":[{"index":0,"uuid":"GPU-…","bus":"00000000:06:00.0","model":"Tesla V100-SXM2-16GB",
              "numa":0,"memMiB":16160,"healthy":true}, …],
     "nvlinks":[[0,1,1,2,…],…],"pcie":[[0,10,30,…],…]}

`uuid` is null when the source did not carry one (a parsed `nvidia-smi topo -m`).

`pcie` holds NVML topology levels (0, 10, 20, 30, 40, 50). `class` is `topology_class(t)`: nodes
with the same class are interchangeable for placement and share the engine's caches.
"""

from __future__ import annotations

import functools
import hashlib
import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from webhook.topology.model import GPU, PCIeLevel, Topology

SCHEMA_VERSION = 1
CLASS_LENGTH = 16  # hex digits of sha256: short enough for a label value, collisions negligible


class TopologyFormatError(ValueError):
    """A node's topology annotation (or a topology file) cannot be read."""


class _GpuDoc(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    index: int = Field(ge=0)
    uuid: str | None = Field(default=None, min_length=1)  # null: unknown, never made up
    bus: str = ""
    model: str = ""
    numa: int | None = None
    memMiB: int | None = None
    healthy: bool = True


class _TopologyDoc(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    v: int
    class_: str | None = Field(default=None, alias="class")
    name: str = ""
    nvlinkGBps: float = Field(default=25.0, gt=0)
    pcieGen: int = Field(default=3, ge=1, le=7)
    nvswitch: list[int] = Field(default_factory=list)
    nvswitchLinks: int = Field(default=0, ge=0)
    gpus: list[_GpuDoc]
    nvlinks: list[list[int]]
    pcie: list[list[int]]


def topology_class(t: Topology) -> str:
    """Short stable hash of what matters for placement: GPU count and models, NVLink counts and
    speed, NVSwitch membership, PCIe levels and generation, NUMA layout. Not UUIDs or bus ids."""
    canon = {
        "models": [g.model for g in t.gpus],
        "numa": [g.numa_node for g in t.gpus],
        "nvlinks": [list(r) for r in t.nvlinks],
        "pcie": [[int(x) for x in r] for r in t.pcie],
        "gbps": float(t.nvlink_gbps),  # 25 and 25.0 are one speed
        "gen": t.pcie_gen,
        "nvswitch": sorted(t.nvswitch),
        "nvswitchLinks": t.nvswitch_links if t.nvswitch else 0,
    }
    blob = json.dumps(canon, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:CLASS_LENGTH]


def to_dict(t: Topology) -> dict[str, Any]:
    return {
        "v": SCHEMA_VERSION,
        "class": topology_class(t),
        "name": t.name,
        "nvlinkGBps": t.nvlink_gbps,
        "pcieGen": t.pcie_gen,
        "nvswitch": sorted(t.nvswitch),
        "nvswitchLinks": t.nvswitch_links,
        "gpus": [
            {
                "index": g.index,
                "uuid": g.uuid,
                "bus": g.pci_bus_id,
                "model": g.model,
                "numa": g.numa_node,
                "memMiB": g.memory_mib,
                "healthy": g.healthy,
            }
            for g in t.gpus
        ],
        "nvlinks": [list(r) for r in t.nvlinks],
        "pcie": [[int(x) for x in r] for r in t.pcie],
    }


def encode(t: Topology) -> str:
    """Compact JSON (the node annotation value)."""
    validate(t)
    return json.dumps(to_dict(t), separators=(",", ":"))


def _matrix(rows: list[list[int]], n: int, what: str) -> None:
    if len(rows) != n or any(len(r) != n for r in rows):
        raise TopologyFormatError(f"{what} must be a {n}x{n} matrix (one row per GPU)")
    for i in range(n):
        for j in range(n):
            if rows[i][j] != rows[j][i]:
                raise TopologyFormatError(
                    f"{what} must be symmetric: [{i}][{j}]={rows[i][j]} but [{j}][{i}]={rows[j][i]}"
                )


def validate(t: Topology) -> None:
    """Raise TopologyFormatError unless `t` is self-consistent (indices 0..n-1, square symmetric
    matrices, no self links, NVSwitch members exist)."""
    n = t.size
    if n == 0:
        raise TopologyFormatError("a topology needs at least one GPU")
    if [g.index for g in t.gpus] != list(range(n)):
        raise TopologyFormatError(f"GPU indices must be 0..{n - 1} in order")
    known = [g.uuid for g in t.gpus if g.uuid is not None]
    if len(set(known)) != len(known):
        raise TopologyFormatError("GPU UUIDs must be unique")
    _matrix([list(r) for r in t.nvlinks], n, "nvlinks")
    _matrix([[int(x) for x in r] for r in t.pcie], n, "pcie")
    for i in range(n):
        if t.nvlinks[i][i] != 0:
            raise TopologyFormatError(f"nvlinks[{i}][{i}] must be 0 (a GPU has no link to itself)")
        if any(x < 0 for x in t.nvlinks[i]):
            raise TopologyFormatError("NVLink counts cannot be negative")
    bad = [g for g in t.nvswitch if not 0 <= g < n]
    if bad:
        raise TopologyFormatError(f"nvswitch lists GPUs {sorted(bad)} that do not exist")
    if t.nvswitch and t.nvswitch_links <= 0:
        raise TopologyFormatError("nvswitchLinks must be > 0 when GPUs are on an NVSwitch")


def from_dict(doc: Any) -> Topology:
    try:
        d = _TopologyDoc.model_validate(doc)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "document"
        raise TopologyFormatError(f"bad topology at {where}: {first['msg']}") from None
    if d.v != SCHEMA_VERSION:
        raise TopologyFormatError(
            f"unsupported topology schema version v={d.v} (this Muster reads v={SCHEMA_VERSION})"
        )
    n = len(d.gpus)
    try:
        pcie = tuple(tuple(PCIeLevel(x) for x in r) for r in d.pcie)
    except ValueError as exc:
        raise TopologyFormatError(f"bad PCIe level: {exc} (use 0,10,20,30,40,50)") from None
    if len(pcie) != n:
        raise TopologyFormatError(f"pcie must be a {n}x{n} matrix (one row per GPU)")
    t = Topology(
        gpus=tuple(
            GPU(index=g.index, uuid=g.uuid, pci_bus_id=g.bus, model=g.model, numa_node=g.numa,
                memory_mib=g.memMiB, healthy=g.healthy)
            for g in d.gpus
        ),
        nvlinks=tuple(tuple(r) for r in d.nvlinks),
        pcie=pcie,
        nvlink_gbps=d.nvlinkGBps,
        nvswitch=frozenset(d.nvswitch),
        nvswitch_links=d.nvswitchLinks,
        name=d.name,
        pcie_gen=d.pcieGen,
    )
    validate(t)
    if d.class_ is not None and d.class_ != topology_class(t):
        raise TopologyFormatError(
            f"class hash {d.class_!r} does not match the content ({topology_class(t)!r}): "
            "the annotation was edited or corrupted"
        )
    return t


@functools.lru_cache(maxsize=1024)
def decode(s: str) -> Topology:
    """Parse the JSON form. Raises TopologyFormatError with a clear message on bad input.
    Cached: every node of a class publishes the same string but for UUIDs, and the binder
    decodes on every node update."""
    try:
        doc = json.loads(s)
    except (json.JSONDecodeError, TypeError) as exc:
        raise TopologyFormatError(f"topology is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise TopologyFormatError("topology must be a JSON object")
    return from_dict(doc)
