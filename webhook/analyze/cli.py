"""`muster analyze`: read a cluster (read-only) and name what is misconfigured."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime as dt
import json
import sys


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "analyze", help="name what is misconfigured in a cluster (read-only)",
        description="Reads the cluster with get and list only, and reports each finding with a "
                    "severity, the object and the fix. Exits 1 when an error is found, so a "
                    "pipeline can gate on it.")
    p.add_argument("--kubeconfig", help="kubeconfig (default: in-cluster, then $KUBECONFIG)")
    p.add_argument("--namespace", default="muster-system", help="Muster's release namespace")
    p.add_argument("--release", default="muster", help="the Helm release name")
    p.add_argument("--output", choices=["text", "json"], default="text")
    p.add_argument("--stuck-after", type=float, default=120.0, metavar="SECONDS",
                   help="a coscheduling pod unbound this long with no PodScheduled condition "
                        "means its scheduler is not running (default 120)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from webhook.analyze.collect import collect  # noqa: PLC0415 (keep the CLI light)
    from webhook.analyze.findings import Finding, analyze  # noqa: PLC0415
    from webhook.kube import KubeApi, make_api_client  # noqa: PLC0415

    async def read() -> list[Finding]:
        client = await make_api_client(args.kubeconfig)
        try:
            snapshot = await collect(KubeApi(client), args.namespace, args.release,
                                     args.stuck_after)
        finally:
            await client.close()
        return list(analyze(snapshot, dt.datetime.now(dt.UTC)))

    findings = asyncio.run(read())
    if args.output == "json":
        print(json.dumps([dataclasses.asdict(f) for f in findings], indent=2))
    else:
        for f in findings:
            print(f"{f.severity.upper():7} {f.code:28} {f.object}\n"
                  f"        {f.message}\n        fix: {f.fix}")
        print(f"{len(findings)} finding(s)", file=sys.stderr)
    return 1 if any(f.severity == "error" for f in findings) else 0
