"""`muster simulate` and `muster topology ...` (show, parse, choose)."""

from __future__ import annotations

import argparse
from pathlib import Path

from webhook.topology import simcommand


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    simcommand.register(sub)

    topo = sub.add_parser("topology", help="GPU topologies: built-in types, nvidia-smi parsing")
    tsub = topo.add_subparsers(dest="topology_command", metavar="ACTION", required=True)

    show = tsub.add_parser("show", help="print a topology's JSON form (the node annotation)")
    which = show.add_mutually_exclusive_group(required=True)
    which.add_argument("name", nargs="?", help="built-in node type (see `muster topology list`)")
    which.add_argument("--file", type=Path, help="a topology JSON file to check and print")
    show.add_argument("--pretty", action="store_true", help="indented JSON")
    show.set_defaults(func=_show)

    tsub.add_parser("list", help="built-in node types").set_defaults(func=_list)

    parse = tsub.add_parser(
        "parse", help="turn `nvidia-smi topo -m` output into the JSON form",
        description="Reads the matrix printed by `nvidia-smi topo -m` (a file, or - for stdin). "
        "topo -m does not show the GPU model, link speed or PCIe generation: pass them.")
    parse.add_argument("file", help="file with the output, or - for stdin")
    parse.add_argument("--model", default="", help='GPU model, e.g. "Tesla V100-SXM2-16GB"')
    parse.add_argument("--nvlink-gbps", type=float, default=25.0,
                       help="GB/s per NVLink link per direction (P100: 20; default 25)")
    parse.add_argument("--pcie-gen", type=int, default=3, help="PCIe generation (default 3)")
    parse.add_argument("--name", default="", help="a name for this node type")
    parse.add_argument("--pretty", action="store_true", help="indented JSON")
    parse.set_defaults(func=_parse)

    choose = tsub.add_parser("choose", help="the GPUs Muster would pick on a node")
    choose.add_argument("name", help="built-in node type")
    choose.add_argument("-k", type=int, required=True, help="how many GPUs")
    choose.add_argument("--free", default="", help="free GPU indices, e.g. 0,1,2,5 (default all)")
    choose.set_defaults(func=_choose)


def _show(args: argparse.Namespace) -> int:
    from webhook.topology import commands  # noqa: PLC0415 (keep the CLI light)

    return commands.show(args)


def _list(args: argparse.Namespace) -> int:
    from webhook.topology import commands  # noqa: PLC0415 (keep the CLI light)

    return commands.list_types(args)


def _parse(args: argparse.Namespace) -> int:
    from webhook.topology import commands  # noqa: PLC0415 (keep the CLI light)

    return commands.parse_smi(args)


def _choose(args: argparse.Namespace) -> int:
    from webhook.topology import commands  # noqa: PLC0415 (keep the CLI light)

    return commands.choose(args)
