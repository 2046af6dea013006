"""`muster analyze`: read a cluster (read-only) and name what is misconfigured; `muster gangs`
and `muster explain job|pod`: what Muster's gangs are doing and why (read-only too)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime as dt
import json
import sys

from webhook.analyze.selection import SEVERITIES, Suppression, select

RELEASE_HELP = ("the prefix of the release's objects, the chart's fullname: the Helm release "
                "name where it contains 'muster', else <release>-muster (the chart's NOTES "
                "print it; default muster)")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "analyze", help="name what is misconfigured in a cluster (read-only)",
        description="Reads the cluster with get and list only, and reports each finding with a "
                    "severity, the object and the fix. Exits 1 when a finding at or above "
                    "--failure-threshold (an error) is found, so a pipeline can gate on it.")
    p.add_argument("--kubeconfig", help="kubeconfig (default: in-cluster, then $KUBECONFIG)")
    p.add_argument("--namespace", default="muster-system", help="Muster's release namespace")
    p.add_argument("--release", default="muster", help=RELEASE_HELP)
    p.add_argument("--output", choices=["text", "json"], default="text")
    p.add_argument("--stuck-after", type=float, default=120.0, metavar="SECONDS",
                   help="a coscheduling pod unbound this long with no PodScheduled condition "
                        "means its scheduler is not running (default 120)")
    p.add_argument("-S", "--suppress", action="append", default=[], metavar="CODE[=OBJECT]",
                   help="leave out the findings of CODE (on OBJECT, e.g. Node/gpu-*; shell "
                        "patterns) from the output and the exit code; repeatable")
    p.add_argument("--failure-threshold", choices=SEVERITIES, default="error",
                   help="exit 1 when a finding at or above this severity is found (default "
                        "error)")
    p.add_argument("--output-threshold", choices=SEVERITIES, default="info",
                   help="print only the findings at or above this severity (default info)")
    p.set_defaults(func=_run)
    _register_gangs(subparsers)
    _register_explain(subparsers)


def _cluster(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kubeconfig", help="kubeconfig (default: in-cluster, then $KUBECONFIG)")
    p.add_argument("-o", "--output", choices=["text", "json"], default="text")


def _register_gangs(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "gangs", help="list the gangs Muster made or places, and what each waits for",
        description="Reads pods and PodGroups/Workloads with get and list only. STATE is "
                    "Running (at least minimum members bound), Pending (with what it waits "
                    "for) or Finished.")
    _cluster(p)
    where = p.add_mutually_exclusive_group()
    where.add_argument("-n", "--namespace", default="default",
                       help="the jobs' namespace (default: default)")
    where.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace")
    p.add_argument("--state", type=str.capitalize, choices=["Running", "Pending", "Finished"],
                   help="only the gangs in this state")
    p.set_defaults(func=_gangs)


def _register_explain(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]
                      ) -> None:
    p = subparsers.add_parser(
        "explain", help="why a job or pod in the cluster is where it is (read-only)",
        description="Which policy matches (re-evaluated with the webhook's engine on the pods "
                    "as stored), the PodGroup or Workload Muster made and its phase, the gang's "
                    "members present/bound/minimum and what it waits for, and Muster's recent "
                    "Events on its pods and gang object. Reads with get and list only.")
    p.add_argument("what", choices=["job", "pod"], help="job: every pod of the job (an owner "
                   "named NAME up the pods' controller chain); pod: one pod")
    p.add_argument("target", metavar="NAMESPACE/NAME")
    _cluster(p)
    p.add_argument("--release-namespace", default="muster-system",
                   help="Muster's release namespace, where its policies ConfigMap is")
    p.add_argument("--release", default="muster", help=RELEASE_HELP)
    p.set_defaults(func=_explain)


def _gangs(args: argparse.Namespace) -> int:
    from webhook.analyze import gangcommands  # noqa: PLC0415 (keep the CLI light)

    return gangcommands.gangs(args)


def _explain(args: argparse.Namespace) -> int:
    from webhook.analyze import gangcommands  # noqa: PLC0415

    return gangcommands.explain(args)


def _run(args: argparse.Namespace) -> int:
    from webhook.analyze.collect import collect  # noqa: PLC0415 (keep the CLI light)
    from webhook.analyze.findings import Finding, analyze  # noqa: PLC0415
    from webhook.kube import KubeApi, make_api_client  # noqa: PLC0415

    suppressions = [Suppression.parse(text) for text in args.suppress]

    async def read() -> list[Finding]:
        client = await make_api_client(args.kubeconfig)
        try:
            snapshot = await collect(KubeApi(client), args.namespace, args.release,
                                     args.stuck_after)
        finally:
            await client.close()
        return list(analyze(snapshot, dt.datetime.now(dt.UTC)))

    chosen = select(asyncio.run(read()), suppressions, args.output_threshold)
    if args.output == "json":
        print(json.dumps([dataclasses.asdict(f) for f in chosen.shown], indent=2))
    else:
        for f in chosen.shown:
            print(f"{f.severity.upper():7} {f.code:28} {f.object}\n"
                  f"        {f.message}\n        fix: {f.fix}")
        hidden = len(chosen.kept) - len(chosen.shown)
        print(f"{len(chosen.shown)} finding(s)"
              + (f", {hidden} below --output-threshold {args.output_threshold}" if hidden else "")
              + (f", {chosen.suppressed} suppressed" if chosen.suppressed else ""),
              file=sys.stderr)
    return 1 if chosen.failed(args.failure_threshold) else 0
