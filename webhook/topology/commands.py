"""Handlers of `muster topology ...` (imported lazily by cli.py)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from webhook.failures import CommandFailed, UsageError
from webhook.topology.builtin import NAMES, builtin
from webhook.topology.codec import TopologyFormatError, decode, to_dict, topology_class
from webhook.topology.gpu_choice import set_score, usable_mask
from webhook.topology.hierarchy import place_gang
from webhook.topology.model import GangRequest, MemberRequest, NodeState, Topology, Unplaceable
from webhook.topology.ringfloor import meets_min_ring
from webhook.topology.smi import build_topology, read_gpu_list, read_topo_matrix


def _print_topology(doc: dict[str, object], pretty: bool) -> None:
    print(json.dumps(doc, indent=2 if pretty else None,
                     separators=None if pretty else (",", ":")))


def _read(path: str) -> str:
    return sys.stdin.read() if path == "-" else Path(path).read_text()


def _name(path: str) -> str:
    """How messages name an input file: `-` is `<stdin>`."""
    return "<stdin>" if path == "-" else path


def _load(args: argparse.Namespace) -> Topology:
    """The topology named by a built-in node type or given as a JSON file (`--file`)."""
    if args.file is None:
        try:
            return builtin(args.name)
        except KeyError as exc:
            raise UsageError(str(exc.args[0])) from exc
    try:
        return decode(_read(args.file))
    except TopologyFormatError as exc:
        raise UsageError(f"{_name(args.file)}: {exc}") from exc


def show(args: argparse.Namespace) -> int:
    _print_topology(to_dict(_load(args)), args.pretty)
    return 0


def list_types(args: argparse.Namespace) -> int:

    for name in NAMES:
        t = builtin(name)
        print(f"{name:20} {t.size:2} x {t.gpus[0].model:24} class {topology_class(t)}")
    return 0


def parse_smi(args: argparse.Namespace) -> int:
    try:
        matrix = read_topo_matrix(_read(args.file))
    except TopologyFormatError as exc:
        raise UsageError(f"{_name(args.file)}: {exc}") from exc
    missing = []
    if args.pcie_gen is None:
        missing.append("--pcie-gen N (`nvidia-smi --query-gpu=pcie.link.gen.max --format=csv` "
                       "prints it)")
    if args.nvlink_gbps is None and matrix.shows_nvlink:
        missing.append("--nvlink-gbps G (GB/s per link per direction: P100 20; V100, A100, "
                       "H100 25; B200 50)")
    if missing:
        raise UsageError(f"{_name(args.file)}: topo -m does not show the link speeds, give "
                         f"{' and '.join(missing)}")
    try:
        listed = read_gpu_list(_read(args.gpu_list)) if args.gpu_list else ()
    except TopologyFormatError as exc:
        raise UsageError(f"{_name(args.gpu_list)}: {exc}") from exc
    try:
        t = build_topology(matrix, pcie_gen=args.pcie_gen, nvlink_gbps=args.nvlink_gbps,
                           listed=listed, model=args.model, name=args.name)
    except TopologyFormatError as exc:
        raise UsageError(f"{_name(args.file)}: {exc}") from exc
    _print_topology(to_dict(t), args.pretty)
    return 0


def choose(args: argparse.Namespace) -> int:
    """The binder's own placement of one k-GPU pod on this node, and its minRingGBps figure."""
    t = _load(args)
    node = t.name or _name(args.file or "") or "node"
    if args.k < 1:
        raise UsageError(f"-k {args.k}: give how many GPUs to place, 1 or more")
    try:
        free = [int(x) for x in args.free.split(",") if x.strip()] if args.free else range(t.size)
    except ValueError as exc:
        raise UsageError(f"--free {args.free!r}: give GPU indices like 0,1,5") from exc
    absent = sorted({i for i in free if not 0 <= i < t.size})
    if absent:
        raise UsageError(f"--free {args.free!r}: {node} has no GPU "
                         f"{', '.join(map(str, absent))} (its GPUs are 0-{t.size - 1})")
    if usable_mask(t, free).bit_count() < args.k:
        raise CommandFailed(f"fewer than {args.k} healthy GPUs free among {sorted(free)}")
    # the best set, then the floor: the binder refuses a node exactly when its best set is below
    placed = place_gang(
        [NodeState(node, t, frozenset(free), free_cpu_milli=0, free_memory_bytes=0)],
        GangRequest("choose", (MemberRequest("pod", args.k),), mode="required",
                    single_node=True))
    if isinstance(placed, Unplaceable):
        raise CommandFailed(placed.reason)
    chosen = placed.members[0].gpus
    floor = args.min_ring_gbps
    if not meets_min_ring(placed.gang_gbps, floor, args.k):
        raise CommandFailed(
            f"--min-ring-gbps {_gbps_text(floor)} not met: the best {args.k} free GPUs on {node} "
            f"(GPUs {','.join(map(str, chosen))}) give {_gbps_text(placed.gang_gbps)} GB/s of "
            "allreduce bus bandwidth; a pod with this minRingGBps is not placed on this node")
    s = set_score(t, chosen)
    print(f"GPUs {','.join(map(str, chosen))} on {node}")
    if args.k < 2:
        print("  ring bandwidth (minRingGBps): none, one GPU runs no allreduce (any minimum is "
              "met)")
    else:
        print(f"  ring bandwidth (minRingGBps): {placed.gang_gbps:g} GB/s (allreduce bus "
              "bandwidth)")
        print(f"  best single ring: {s.ring_gbps:g} GB/s per direction at its slowest hop")
        print(f"  bisection: {s.bisection_gbps:g} GB/s")
    print(f"  NUMA nodes: {s.numa_nodes}")
    if args.min_ring_gbps is not None:
        print(f"  minRingGBps {args.min_ring_gbps:g}: met")
    return 0


def _gbps_text(value: float) -> str:
    """A figure as short as it can be and still exact (a floor just above a figure shows so)."""
    short = f"{value:g}"
    return short if float(short) == value else repr(value)
