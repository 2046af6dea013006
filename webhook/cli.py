"""The one CLI, `muster` (also `python -m webhook`).

Each area registers its own subcommands from a light `cli.py` that imports its engine lazily,
so `muster policy check` does not pay for gRPC or the Kubernetes client.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import os
import sys
from collections.abc import Callable, Sequence

from webhook import failures, log

# module providing `register(subparsers)`; each handler is set with `parser.set_defaults(func=...)`
_AREAS = (
    "webhook.policy.cli",
    "webhook.admission.cli",
    "webhook.binder.cli",
    "webhook.agent.cli",
    "webhook.topology.cli",
    "webhook.certs.cli",
    "webhook.demo.cli",
    "webhook.analyze.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="muster",
        description="Gang scheduling and NVLink-aware GPU placement for training jobs on "
        "Kubernetes.",
    )
    parser.add_argument("--log-level", default="info",
                        choices=["debug", "info", "warning", "error"])
    parser.add_argument("--log-json", action="store_true", help="one JSON object per log line")
    parser.add_argument("--version", action=_Version, nargs=0,
                        help="print the installed version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in _AREAS:
        module = importlib.import_module(name)  # an area that does not import is a bug: raise
        register: Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None]
        register = module.register
        register(sub)
    return parser


class _Version(argparse.Action):
    """`muster --version`, from the package metadata, read only when asked."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        try:
            version = importlib.metadata.version("muster")
        except importlib.metadata.PackageNotFoundError:  # a checkout run without `pip install`
            version = "unknown (not installed)"
        print(f"muster {version}")
        parser.exit()


def main(argv: Sequence[str] | None = None) -> int:
    try:
        # every command's module loads here: a Ctrl-C while they do ends quietly too
        args = build_parser().parse_args(argv)
    except KeyboardInterrupt:
        return 130
    log.setup(args.log_level, args.log_json)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # the reader went away (`muster ... | head`): stop quietly, as Unix tools do; stdout
        # goes to /dev/null so that the interpreter's final flush does not complain either
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + 13  # killed by SIGPIPE, as the shell reports it
    except Exception as exc:
        known = failures.explain(exc)
        if known is None or args.log_level == "debug":
            raise  # a bug, or asked for: the whole traceback
        code, message = known
        print(f"muster {args.command}: {message}", file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())
