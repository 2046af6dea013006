"""`muster bind`: the gang binder (argparse only; the controller is imported when run)."""

from __future__ import annotations

import argparse
import asyncio
import os
import socket

from webhook import keys
from webhook.failures import UsageError, check_port
from webhook.topology.network import Levels, LevelsError, read_levels


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "bind", help="run the gang binder (places whole gangs on nodes and GPU sets)",
        description="Watch pods with the binder's schedulerName, place each gang at once with "
                    "the topology engine (nodes and GPU sets), then create every member's "
                    "Binding, each carrying the pod's muster.io/gpu-assignment and the gang's "
                    "muster.io/gang-placement as annotations (docs/binder.md).")
    p.add_argument("--kubeconfig", default=None,
                   help="kubeconfig path (default: in-cluster, then $KUBECONFIG)")
    p.add_argument("--scheduler-name", default=keys.DEFAULT_BINDER_SCHEDULER_NAME,
                   help="spec.schedulerName of the pods to bind (default: %(default)s)")
    p.add_argument("--leader-elect", action="store_true",
                   help="run several replicas; only the Lease holder binds")
    p.add_argument("--lease-name", default="muster-binder",
                   help="the coordination.k8s.io Lease the replicas share (default: %(default)s)")
    p.add_argument("--lease-namespace", default=os.environ.get("POD_NAMESPACE", "default"),
                   help="the Lease's namespace (default: $POD_NAMESPACE, else \"default\"; "
                        "here %(default)s)")
    p.add_argument("--identity", default=None,
                   help="this replica's holderIdentity (default: hostname_pid)")
    p.add_argument("--lease-duration", type=float, default=15.0, metavar="SECONDS",
                   help="a Lease not renewed for this long may be taken by another replica "
                        "(default: %(default)s)")
    p.add_argument("--renew-deadline", type=float, default=10.0, metavar="SECONDS",
                   help="the leader stops binding when it could not renew for this long; less "
                        "than --lease-duration (default: %(default)s)")
    p.add_argument("--retry-period", type=float, default=2.0, metavar="SECONDS",
                   help="how often the leader renews and a standby tries to take the Lease; "
                        "less than --renew-deadline (default: %(default)s)")
    p.add_argument("--metrics-port", type=int, default=None,
                   help="serve /metrics and /healthz on this port")
    p.add_argument("--starvation-seconds", type=float, default=60.0,
                   help="an unplaceable gang waiting longer reserves resources against gangs "
                        "after it in the queue (default: %(default)s)")
    p.add_argument("--backoff-max", type=float, default=60.0, metavar="SECONDS",
                   help="a gang that could not be placed is tried again after a second, "
                        "doubling up to this, or sooner when the cluster changes (default: "
                        "%(default)s)")
    p.add_argument("--allocation-wait-seconds", type=float, default=30.0, metavar="SECONDS",
                   help="on nodes whose agent acknowledges served pods, bind the next GPU pod "
                        "once the previous one is served, or after this long "
                        "(default: %(default)s)")
    p.add_argument("--event-interval", type=float, default=30.0, metavar="SECONDS",
                   help="a waiting gang's FailedScheduling Event is written again for the same "
                        "reason at most this often (default: %(default)s)")
    p.add_argument("--members-event-after", type=float, default=10.0, metavar="SECONDS",
                   help="a gang still short of minMember pods this long after its oldest "
                        "member was created says so in an Event; a job's pods come over a few "
                        "seconds (default: %(default)s)")
    p.add_argument("--network-levels", default=None, metavar="LEVELS",
                   help="the cluster's network levels for gangs that name one: node labels "
                        "widest first, comma separated, each LABEL or ALIAS=LABEL (a name "
                        "manifests may use for it, as KAI's aliases); \"topograph\" (the labels "
                        "NVIDIA Topograph wrote, v1 or v0, as the nodes carry them); "
                        "\"volcano\" (Volcano's HyperNodes, each tier a level, read as they "
                        "change); kueue:NAME or kai:NAME (that Kueue or KAI Topology object in "
                        "the cluster, read as it changes); or @FILE, a Kueue or KAI Topology "
                        "(kueue.x-k8s.io/v1beta2, kai.scheduler/v1) or a YAML list "
                        "(docs/topology.md, \"Network levels\") (default: none: a gang that "
                        "names a level is placed by that label alone)")
    p.add_argument("--preemption", choices=keys.PREEMPTION_VALUES, default="Never",
                   help="whether a gang whose policy does not set gang.preemption may have "
                        "whole gangs of lower priority evicted to be placed (LowerPriority) or "
                        "not (Never); a PriorityClass with preemptionPolicy Never always wins "
                        "(default: %(default)s)")
    p.set_defaults(func=_run)


def network_levels(value: str | None) -> Levels:
    """--network-levels as levels; UsageError when they cannot be used."""
    if not value:
        return Levels()
    try:
        return read_levels(value)
    except LevelsError as exc:
        raise UsageError(f"--network-levels {exc}") from exc


def _run(args: argparse.Namespace) -> int:
    # the controller and the Kubernetes client load only when the command runs
    from webhook.binder.controller import BinderConfig  # noqa: PLC0415
    from webhook.binder.service import ServiceConfig, serve  # noqa: PLC0415
    from webhook.kube.leader import LeaseConfig  # noqa: PLC0415

    check_port("--metrics-port", args.metrics_port)
    levels = network_levels(args.network_levels)
    lease = None
    if args.leader_elect:
        identity = args.identity or f"{socket.gethostname()}_{os.getpid()}"
        try:
            lease = LeaseConfig(args.lease_name, args.lease_namespace, identity,
                                args.lease_duration, args.renew_deadline, args.retry_period)
        except ValueError as exc:
            raise UsageError(f"--retry-period {args.retry_period:g}, --renew-deadline "
                             f"{args.renew_deadline:g}, --lease-duration "
                             f"{args.lease_duration:g}: need 0 < --retry-period < "
                             "--renew-deadline < --lease-duration") from exc
    config = ServiceConfig(
        binder=BinderConfig(scheduler_name=args.scheduler_name,
                            starvation_seconds=args.starvation_seconds,
                            backoff_max=args.backoff_max,
                            allocation_wait_seconds=args.allocation_wait_seconds,
                            event_interval=args.event_interval,
                            members_event_after=args.members_event_after,
                            network_levels=levels, preemption=args.preemption),
        lease=lease, metrics_port=args.metrics_port)
    asyncio.run(serve(args.kubeconfig, config))
    return 0
