"""`muster demo`: the whole flow on an embedded default, no cluster needed."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from webhook.demo import EXAMPLE_POLICIES
from webhook.failures import CommandFailed, UsageError
from webhook.signals import run_interruptible

if TYPE_CHECKING:
    from webhook.demo.progress import Progress


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "demo", help="run the whole flow on one machine (webhook, binder, agents, emulator)",
        description="Runs the reference scenario end to end: an in-process API server emulator "
        "with two DGX-1 V100 nodes, the admission webhook over HTTPS, the binder and a node agent "
        "per node, then prints what each pod received, its gang or PodGroup, where it was placed "
        "and the modelled throughput against regular scheduling. Steps the policies give nothing "
        "to do are skipped, with why.")
    p.add_argument("--policies", type=Path, nargs="+", default=[EXAMPLE_POLICIES],
                   metavar="DIR|FILE", help="policies to apply (default: the shipped examples, "
                   f"{EXAMPLE_POLICIES})")
    p.add_argument("--json", action="store_true", help="machine-readable result on stdout")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    """The demo; Ctrl-C at any point ends it with one line (the step's own "interrupted", or
    this command's) and exit 130, once what it started has stopped."""
    steps: list[Progress] = []
    try:
        return _demo(args, steps)
    except KeyboardInterrupt:
        if not any(p.interrupted for p in steps):
            print("muster demo: interrupted", file=sys.stderr)
        return 130


def _demo(args: argparse.Namespace, steps: list[Progress]) -> int:
    """Runs the demo; the Progress that reports its steps is added to `steps`."""
    try:
        from webhook.demo.progress import Progress  # noqa: PLC0415
        from webhook.demo.report import as_json, format_result  # noqa: PLC0415 (CLI kept light)
        from webhook.demo.run import run_demo  # noqa: PLC0415
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith("webhook.doubles"):
            raise
        # the image leaves the test doubles out (docs/architecture.md)
        raise CommandFailed("the demo runs on the API server emulator, which this installation "
                            "leaves out (the image does): run it from a checkout, "
                            "`pip install . && muster demo`") from exc

    _check_policies(args.policies)
    if args.log_level == "info":  # the components' info logs would drown the progress lines
        logging.getLogger().setLevel(logging.WARNING)
    progress = Progress(lambda text: print(text, end="", file=sys.stderr, flush=True),
                        sys.stderr.isatty())
    steps.append(progress)
    print("muster demo: starting the components", file=sys.stderr)
    result = run_interruptible(lambda: run_demo(list(args.policies), progress))
    print(as_json(result) if args.json else format_result(result))
    return 0


def _check_policies(paths: list[Path]) -> None:
    """The policies load, or a UsageError says why in one line (the webhook would start with
    none of them); their warnings, and an empty set, are said on stderr."""
    from webhook.policy import PolicyError, load_policies  # noqa: PLC0415
    from webhook.policy.commands import NO_POLICIES  # noqa: PLC0415

    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        raise UsageError(f"no such policy path: {', '.join(missing)}")
    try:
        policies = load_policies(paths)
    except PolicyError as exc:
        more = len(exc.issues) + exc.more + exc.more_warnings - 1
        raise UsageError(f"{exc.issues[0]}" + (f" (and {more} more: `muster policy check` "
                                                "lists them)" if more else "")) from exc
    for warning in policies.warnings:
        print(f"muster demo: {warning}", file=sys.stderr)
    if not policies:
        print(f"muster demo: warning: {NO_POLICIES}", file=sys.stderr)
