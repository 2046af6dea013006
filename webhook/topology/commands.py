"""Handlers of `muster topology ...` (imported lazily by cli.py)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from webhook.failures import CommandFailed, UsageError
from webhook.topology.builtin import NAMES, builtin
from webhook.topology.codec import TopologyFormatError, decode, to_dict, topology_class
from webhook.topology.inode import choose_gpus, set_score
from webhook.topology.smi import parse_nvidia_smi_topo


def _print_topology(doc: dict[str, object], pretty: bool) -> None:
    print(json.dumps(doc, indent=2 if pretty else None,
                     separators=None if pretty else (",", ":")))


def show(args: argparse.Namespace) -> int:

    try:
        t = decode(args.file.read_text()) if args.file is not None else builtin(args.name)
    except KeyError as exc:
        raise UsageError(str(exc.args[0])) from exc
    except TopologyFormatError as exc:
        raise UsageError(f"{args.file}: {exc}") from exc
    _print_topology(to_dict(t), args.pretty)
    return 0


def list_types(args: argparse.Namespace) -> int:

    for name in NAMES:
        t = builtin(name)
        print(f"{name:20} {t.size:2} x {t.gpus[0].model:24} class {topology_class(t)}")
    return 0


def parse_smi(args: argparse.Namespace) -> int:

    try:
        text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text()
        t = parse_nvidia_smi_topo(text, model=args.model, nvlink_gbps=args.nvlink_gbps,
                                  pcie_gen=args.pcie_gen, name=args.name)
    except TopologyFormatError as exc:
        raise UsageError(f"{args.file}: {exc}") from exc
    _print_topology(to_dict(t), args.pretty)
    return 0


def choose(args: argparse.Namespace) -> int:

    try:
        t = builtin(args.name)
    except KeyError as exc:
        raise UsageError(str(exc.args[0])) from exc
    try:
        free = [int(x) for x in args.free.split(",") if x.strip()] if args.free else range(t.size)
    except ValueError as exc:
        raise UsageError(f"--free {args.free!r}: give GPU indices like 0,1,5") from exc
    chosen = choose_gpus(t, free, args.k)
    if chosen is None:
        raise CommandFailed(f"fewer than {args.k} healthy GPUs free among {sorted(free)}")
    s = set_score(t, chosen)
    print(f"GPUs {','.join(map(str, chosen))}: allreduce {s.allreduce_gbps:g} GB/s, best ring "
          f"{s.ring_gbps:g} GB/s, bisection {s.bisection_gbps:g} GB/s, "
          f"{s.numa_nodes} NUMA node(s)")
    return 0
