"""`muster policy check | test | explain`: argparse only, handlers in webhook.policy.commands."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    policy = subparsers.add_parser("policy", help="validate, test and explain scheduling policies")
    sub = policy.add_subparsers(dest="policy_command", metavar="ACTION", required=True)

    check = sub.add_parser(
        "check", help="validate policy files or directories (exit 1 on errors)",
        description="Reports every problem of every document of every file in one run, one "
        "line each: FILE:LINE:COLUMN: FIELD: MESSAGE. A FILE may also be what the chart takes "
        "or renders: a Helm values file with `policies:` (muster policy pack's output), or "
        "`helm template`'s output (its policies ConfigMap); their policy files are named "
        "FILE[NAME], with NAME's own lines; such a file may hold 4 MiB. Several values files "
        "are merged as `helm -f` merges them, in the order given: later files win, maps merge "
        "deeply, lists are replaced. Exit 1 when there is any problem, 2 when a PATH does not "
        "exist.")
    check.add_argument("paths", nargs="+", metavar="PATH",
                       help="policy file or directory, or - for stdin (named <stdin>)")
    check.add_argument("--network-levels", metavar="LEVELS",
                       help="the binder's --network-levels (the chart's binder.networkLevels): "
                       "warn of a level a policy names that is none of them (default: the levels "
                       "the values files (merged) or helm template output among the PATHs give "
                       "the binder, else the chart's, none)")
    check.add_argument("--as-served", action="store_true",
                       help="read the PATHs as `muster serve --policies` does: policy files "
                       "only, a values file or helm template output is a policy document like "
                       "any other (the chart's pre-install hook checks its ConfigMap this way)")
    check.set_defaults(func=_check)

    pack = sub.add_parser(
        "pack", help="write policy files as a Helm values file for the chart (stdout)",
        description="Checks the policies as `check` does, then writes a values file whose "
        "`policies:` holds each file by name: `muster policy pack policies/ > "
        "values-policies.yaml`, then `helm upgrade --install muster charts/muster -f "
        "values-policies.yaml`. Exit 1 (nothing written) when the policies have problems.")
    pack.add_argument("paths", nargs="+", metavar="PATH", help="policy file or directory")
    pack.set_defaults(func=_pack)

    def context(p: argparse.ArgumentParser) -> None:
        p.add_argument("-p", "--policies", action="append", required=True, metavar="PATH",
                       help="policy file or directory, or - for stdin (repeatable)")
        p.add_argument("--namespace-labels", default="", metavar="K=V,...",
                       help="labels of the pod's namespace")
        p.add_argument("--owner", action="append", default=[], metavar="OWNER.yaml",
                       help="owner object, from the pod's controller up to the root (repeatable)")

    test = sub.add_parser(
        "test", help="apply policies to a pod, or run PolicyTest files",
        description="TARGET is a Pod manifest (or a captured AdmissionReview): prints the "
        "decision, the JSON Patch and the mutated pod. A job manifest (MPIJob, PyTorchJob, "
        "TFJob, JobSet, TrainJob, LeaderWorkerSet, Job): the same for each pod its operator "
        "creates. Every document of a file is read: a Namespace gives its labels to the pods "
        "in it, another kind is named and skipped (a file of nothing else: exit 2). Or a "
        "PolicyTest file or directory: runs every case. Exit 1 on any failure, including a "
        "patch that is not idempotent.")
    context(test)
    test.add_argument("targets", nargs="+", metavar="TARGET")
    test.set_defaults(func=_test)

    explain = sub.add_parser(
        "explain", help="show, per policy, why it matches a pod or not",
        description="POD.yaml is a Pod manifest, or a job manifest (MPIJob, PyTorchJob, TFJob, "
        "JobSet, TrainJob, LeaderWorkerSet, Job): then each pod its operator creates. Every "
        "document of a file is read: a Namespace gives its labels to the pods in it, another "
        "kind is named and skipped (a file of nothing else: exit 2).")
    context(explain)
    explain.add_argument("pods", nargs="+", metavar="POD.yaml")
    explain.set_defaults(func=_explain)


def _check(args: argparse.Namespace) -> int:
    from webhook.policy import commands  # noqa: PLC0415 (keep the CLI light)

    return commands.check(args)


def _pack(args: argparse.Namespace) -> int:
    from webhook.policy import commands  # noqa: PLC0415

    return commands.pack(args)


def _test(args: argparse.Namespace) -> int:
    from webhook.policy import commands  # noqa: PLC0415

    return commands.test(args)


def _explain(args: argparse.Namespace) -> int:
    from webhook.policy import commands  # noqa: PLC0415

    return commands.explain_pods(args)
