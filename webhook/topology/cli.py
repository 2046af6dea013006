"""`muster simulate` and `muster topology ...` (show, parse, choose)."""

from __future__ import annotations

import argparse

from webhook.topology import simcommand


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    simcommand.register(sub)

    topo = sub.add_parser("topology", help="GPU topologies: built-in types, nvidia-smi parsing")
    tsub = topo.add_subparsers(dest="topology_command", metavar="ACTION", required=True)

    show = tsub.add_parser("show", help="print a topology's JSON form (the node annotation)")
    _topology_source(show)
    show.add_argument("--pretty", action="store_true", help="indented JSON")
    show.set_defaults(func=_show)

    tsub.add_parser("list", help="built-in node types").set_defaults(func=_list)

    parse = tsub.add_parser(
        "parse", help="turn `nvidia-smi topo -m` output into the JSON form",
        description="Reads the matrix printed by `nvidia-smi topo -m` (a file, or - for stdin; "
        "a terminal capture with escape sequences is fine). topo -m does not show the PCIe "
        "generation, the NVLink speed, GPU UUIDs or models: give them. Without --gpu-list the "
        "GPUs have no UUID (null), never a made-up one.")
    parse.add_argument("file", help="file with the output, or - for stdin")
    parse.add_argument("--pcie-gen", type=int, choices=range(1, 8), metavar="N",
                       help="PCIe generation of the GPUs' links, required (x16 assumed): "
                       "`nvidia-smi --query-gpu=pcie.link.gen.max --format=csv` prints it")
    parse.add_argument("--nvlink-gbps", type=_gbps, metavar="G",
                       help="GB/s per NVLink link per direction, required when the matrix shows "
                       "NV#: P100 20; V100, A100, H100 25; B200 50")
    parse.add_argument("--gpu-list", metavar="FILE",
                       help="the output of `nvidia-smi -L` on the same node: each GPU's UUID "
                       "and model")
    parse.add_argument("--model", default="",
                       help='GPU model when there is no --gpu-list, e.g. "Tesla V100-SXM2-16GB"')
    parse.add_argument("--name", default="", help="a name for this node type")
    parse.add_argument("--pretty", action="store_true", help="indented JSON")
    parse.set_defaults(func=_parse)

    choose = tsub.add_parser(
        "choose", help="the GPUs Muster would pick on a node",
        description="Places k GPUs on one node as the binder does and prints their ring "
        "bandwidth: the allreduce bus bandwidth that a policy's minRingGBps is compared with.")
    _topology_source(choose)
    choose.add_argument("-k", type=int, required=True, help="how many GPUs")
    choose.add_argument("--free", default="", help="free GPU indices, e.g. 0,1,2,5 (default all)")
    choose.add_argument("--min-ring-gbps", type=_gbps, metavar="GBPS",
                        help="as a policy's minRingGBps with mode required: exit 1 when the "
                        "node cannot meet it")
    choose.set_defaults(func=_choose)


def _gbps(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: give GB/s, a number > 0")
    return value


def _topology_source(parser: argparse.ArgumentParser) -> None:
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("name", nargs="?", help="built-in node type (see `muster topology list`)")
    which.add_argument("--file", help="a topology JSON file (what `parse` and `show` write), or -")


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
