"""Handlers of `muster gangs` and `muster explain job|pod` (registered by webhook.analyze.cli):
read the cluster (clusterread), decide (gangstate, explaining), print."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime as dt
import json
import sys
from collections.abc import Awaitable, Callable
from typing import TypeVar

from webhook.analyze.clusterread import (
    Reader,
    below,
    owner_chains,
    read_gangs,
    read_namespace,
    read_pod,
)
from webhook.analyze.explaining import (
    Explanation,
    explain_pods,
    job_owner,
    job_pods,
    named_after,
    refused_creators,
    render,
)
from webhook.analyze.gangstate import GangState, age, assemble, decide
from webhook.failures import CommandFailed, UsageError

T = TypeVar("T")
_COLUMNS = ("NAMESPACE", "JOB", "BACKEND", "PRESENT/BOUND/MIN", "STATE", "AGE", "WAITING FOR")


def _read(args: argparse.Namespace, work: Callable[[Reader], Awaitable[T]]) -> T:
    """`work` with a reader of the cluster `--kubeconfig` names (KubeApi: its reads only)."""
    from webhook.kube import KubeApi, make_api_client  # noqa: PLC0415 (keep the CLI light)

    async def run() -> T:
        client = await make_api_client(args.kubeconfig)
        try:
            return await work(KubeApi(client))
        finally:
            await client.close()
    return asyncio.run(run())


def gangs(args: argparse.Namespace) -> int:
    namespace = None if args.all_namespaces else args.namespace
    scope = _read(args, lambda api: read_gangs(api, namespace))
    states = [s for s in map(decide, assemble(scope.pods, scope.groups))
              if args.state is None or s.state == args.state]
    now = dt.datetime.now(dt.UTC)
    if args.output == "json":
        print(json.dumps([{**dataclasses.asdict(s), "age": age(s.created, now)} for s in states],
                         indent=2))
    elif states:
        print("\n".join(gang_table(states, now)))
    else:  # as kubectl says it: on stderr, so that a pipe reads no table
        where = "any namespace" if namespace is None else f"namespace {namespace}"
        print(f"no gang{' ' + args.state if args.state else ''} in {where}", file=sys.stderr)
    return 0


def gang_table(states: list[GangState], now: dt.datetime) -> list[str]:
    """`muster gangs`' table, columns as wide as their widest cell (the last one free)."""
    rows = [_COLUMNS, *((s.namespace, s.job or f"(gang {s.name})", s.backend,
                         f"{s.present}/{s.bound}/{'?' if s.minimum is None else s.minimum}",
                         s.state, age(s.created, now), s.waiting or "-") for s in states)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(_COLUMNS) - 1)]
    return ["   ".join([*(c.ljust(w) for c, w in zip(r, widths, strict=False)), r[-1]]).rstrip()
            for r in rows]


def _split(target: str) -> tuple[str, str]:
    ns, sep, name = target.partition("/")
    if not sep or not ns or not name or "/" in name:
        raise UsageError(f"{target!r}: give NAMESPACE/NAME")
    return ns, name


def explain(args: argparse.Namespace) -> int:
    ns, name = _split(args.target)
    now = dt.datetime.now(dt.UTC)
    work = explain_job if args.what == "job" else explain_pod
    found = _read(args, lambda api: work(api, ns, name, release_namespace=args.release_namespace,
                                         release=args.release, now=now))
    if args.output == "json":
        print(json.dumps(dataclasses.asdict(found), indent=2))
    else:
        print("\n".join(render(found)))
    return 0


async def explain_job(api: Reader, ns: str, name: str, *, release_namespace: str, release: str,
                      now: dt.datetime) -> Explanation:
    """The pods with an owner `name`, and their gangs (or the gang objects of the job when it
    has no pods yet, and the Events that say why it has none: on the job, or on the objects
    under it that create its pods)."""
    scope = await read_namespace(api, ns, release_namespace, release)
    candidates = [p for p in scope.pods if named_after(p, name)]
    chains = await owner_chains(api, candidates)
    pods = job_pods(candidates, chains, name)
    children = await below(api, refused_creators(scope.events, name), ns, name)
    found = explain_pods(scope, pods, chains, target=f"job {ns}/{name}",
                         job=job_owner(chains, pods, name), job_name=name,
                         release_namespace=release_namespace, now=now, children=children)
    if not pods and not found.gangs and not found.events:
        raise CommandFailed(f"no pod and no gang of a job named {name} in namespace {ns}")
    return found


async def explain_pod(api: Reader, ns: str, name: str, *, release_namespace: str, release: str,
                      now: dt.datetime) -> Explanation:
    pod = await read_pod(api, ns, name)
    if pod is None:
        raise CommandFailed(f"no pod {name} in namespace {ns}")
    scope = await read_namespace(api, ns, release_namespace, release)
    chains = await owner_chains(api, [pod])
    return explain_pods(scope, [pod], chains, target=f"pod {ns}/{name}",
                        job=job_owner(chains, [pod], None), job_name="",
                        release_namespace=release_namespace, now=now)
