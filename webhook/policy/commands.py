"""Handlers of `muster policy ...` (registered by webhook.policy.cli)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

from webhook.failures import UsageError
from webhook.policy import chart, native
from webhook.policy.decision import Decision, PolicyAudit
from webhook.policy.engine import evaluate, explain
from webhook.policy.errors import PolicyError, PolicyIssue
from webhook.policy.levelcheck import binder_levels, level_warnings
from webhook.policy.loader import STDIN, STDIN_NAME, load_policies, policy_files
from webhook.policy.manifests import Manifest, name_of, object_of, read_manifest, unsupported
from webhook.policy.podgroup import gang_objects
from webhook.policy.policyset import PolicySet
from webhook.policy.queues import describe
from webhook.policy.testfile import (
    TEST_KIND,
    PolicyTest,
    idempotency_failure,
    load_tests,
    mutate,
    read_object,
    read_objects,
    run_case,
)
from webhook.yamlpos import YamlProblem, load_all, read

T = TypeVar("T")
#: what an empty policy set does, said wherever one is loaded for use
NO_POLICIES = ("no policies: the webhook would admit every pod unchanged (no gang, no Istio "
               "opt-out, nothing for the binder)")


def _labels(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--namespace-labels: {item!r} is not key=value")
        out[key] = value
    return out


def check(args: argparse.Namespace) -> int:
    """Every problem of every file, one line each (exit 1); a PATH that does not exist is a
    usage error (exit 2)."""
    _must_exist(args.paths, "")
    stdin = _stdin(args.paths)
    # --network-levels, a usage error before anything is read, beats the chart's
    flag = binder_levels(args.network_levels) if args.network_levels else None
    chart_files = not args.as_served
    given = None if flag or not chart_files else _chart_levels(args.paths, stdin)
    try:
        policies = load_policies(args.paths, stdin=stdin, chart=chart_files)
    except PolicyError as exc:
        print(exc)
        files = len({issue.file for issue in exc.problems})
        print(f"{_count(exc.problem_count, 'problem')} in {files} file{'s' if files > 1 else ''}"
              f"{_and_warnings(exc.issues, exc.more_warnings)}; nothing loaded")
        return 1
    more = [*level_warnings(policies, flag, given),
            *((f"warning: {NO_POLICIES}",) if not policies else ())]
    for warning in [*map(str, policies.warnings), *more]:
        print(warning)
    for policy, origin in zip(policies.policies, policies.origins, strict=True):
        print(f"ok  {policy.name:<32} priority {policy.spec.priority:<4} {origin}"
              + _mode(policy.spec.enforcement))
    print(f"{len(policies)} policies valid{_and_warnings(policies.warnings, len(more))}"
          f", digest {policies.digest[:12]}")
    return 0


def _chart_levels(paths: list[str], stdin: bytes | None) -> chart.BinderLevels | None:
    """The binder's levels as the values files (merged as `helm -f` merges them) and `helm
    template` outputs among `paths` give them; None when no path is either."""
    return chart.binder_levels(_read_all(paths, stdin))


def _read_all(paths: list[str], stdin: bytes | None) -> Iterator[tuple[str, bytes]]:
    """(name, bytes) of each file of `paths`, one at a time; those that do not read are left
    out (the loader says why)."""
    for path in paths:
        if path == STDIN:
            yield STDIN_NAME, stdin or b""
            continue
        try:
            for file in policy_files(Path(path)):
                yield str(file), read(file, chart.MAX_CHART_BYTES)
        except OSError:
            continue


def pack(args: argparse.Namespace) -> int:
    """The policy files as a Helm values file on stdout, once they load; their problems go to
    stderr (exit 1) and nothing to stdout."""
    if STDIN in args.paths:
        raise UsageError("pack reads files, not stdin: the chart keys each policy by its file "
                         "name")
    _must_exist(args.paths, "")
    try:
        policies = load_policies(args.paths)
    except PolicyError as exc:
        print(exc, file=sys.stderr)
        print(f"{_count(exc.problem_count, 'problem')}; nothing packed", file=sys.stderr)
        return 1
    for warning in policies.warnings:
        print(warning, file=sys.stderr)
    print(chart.pack(_chart_files(args.paths), args.paths), end="")
    return 0


def _chart_files(paths: list[str]) -> list[tuple[str, str]]:
    """(file name, text) of each policy file, under the names the chart takes."""
    files: dict[str, Path] = {}
    for file in (f for p in paths for f in policy_files(Path(p))):
        if not chart.CHART_FILE_NAME.match(file.name):
            raise UsageError(f"{file}: the chart takes file names of letters, digits, '-', '_' "
                             "and '.', ending in .yaml or .yml: rename it")
        if file.name in files:
            raise UsageError(f"{files[file.name]} and {file}: the chart keys policies by file "
                             "name, and both have this one: rename one")
        files[file.name] = file
    return [(name, file.read_text(encoding="utf-8-sig")) for name, file in files.items()]


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'s' if n != 1 else ''}"


def _and_warnings(issues: Sequence[PolicyIssue], unlisted: int = 0) -> str:
    warnings = sum(i.warning for i in issues) + unlisted
    return f" ({_count(warnings, 'warning')})" if warnings else ""


def _must_exist(paths: list[str], flag: str) -> None:
    """A path the user named that is not there is a usage error (exit 2), named with its flag."""
    missing = [p for p in paths if p != STDIN and not Path(p).exists()]
    if missing:
        raise UsageError(f"{flag} {', '.join(missing)}: no such file or directory" if flag
                         else f"no such file or directory: {', '.join(missing)}")


def _stdin(paths: list[str]) -> bytes | None:
    """Standard input when a path is `-` (read within the size limit of a values file or `helm
    template`'s output, which it may be)."""
    return sys.stdin.buffer.read(chart.MAX_CHART_BYTES + 1) if STDIN in paths else None


def _load(args: argparse.Namespace) -> PolicySet:
    """The policies of -p; problems in them are a wrong input: the first in one line (`check`
    lists them all)."""
    _must_exist(args.policies, "--policies")
    try:
        return load_policies(args.policies, stdin=_stdin(args.policies), chart=True)
    except PolicyError as exc:
        more = exc.problem_count - 1
        raise UsageError(
            f"--policies: {exc.problems[0]}" + (f" (and {_count(more, 'more problem')}: muster "
                                                "policy check lists them)" if more else "")
        ) from exc


def test(args: argparse.Namespace) -> int:
    labels = _labels(args.namespace_labels)
    owners = _owners(args)
    policies = _load(args)
    _must_exist(args.targets, "")
    failed = 0
    for target in map(Path, args.targets):
        if target.is_file() and _kind(target) != TEST_KIND:
            failed += _pod_mode(target, labels, owners, policies)
            continue
        tests, problems = load_tests(target)
        for problem in problems:
            print(f"ERROR {problem}")
        failed += len(problems)
        if not tests and not problems:
            print(f"ERROR {target}: no PolicyTest documents found")
            failed += 1
        failed += _run_tests(tests, policies)
    return 1 if failed else 0


def _kind(path: Path) -> str | None:
    try:
        for doc in load_all(read(path)):
            if isinstance(doc, dict):
                return str(doc.get("kind"))
    except (OSError, YamlProblem):
        return None
    return None


def _run_tests(tests: list[tuple[PolicyTest, Path]], policies: PolicySet) -> int:
    failed = 0
    for test, file in tests:
        result = run_case(test, file, policies)
        applied = ",".join(result.decision.policies) if result.decision else ""
        if result.passed:
            print(f"PASS  {result.name:<40} {file}  [{applied or 'no policy'}]")
            continue
        failed += 1
        print(f"FAIL  {result.name:<40} {file}  [{applied or 'no policy'}]")
        for failure in result.failures:
            print("      " + failure.replace("\n", "\n      "))
    if tests:
        print(f"\n{len(tests) - failed} passed, {failed} failed")
    return failed


def _pod_mode(target: Path, labels: dict[str, str], owners: list[dict[str, Any]],
              policies: PolicySet) -> int:
    failed = 0
    pods, skipped = _pods(target, owners, labels)
    for line in skipped:
        print(f"# {target}: skipped {line}")
    for pod, chain, made, ns_labels in pods:
        heading = f"# {target}: pod {_pod_name(pod)}{_made_by(made)}" if made else f"# {target}"
        failed += _test_pod(pod, chain, heading, ns_labels, policies)
    return failed


def _test_pod(pod: dict[str, Any], owners: list[dict[str, Any]], heading: str,
              labels: dict[str, str], policies: PolicySet) -> int:
    decision = evaluate(pod, namespace_labels=labels, owners=owners, policies=policies)
    ops, mutated = mutate(pod, decision)
    print(heading)
    print("## decision")
    modes = {p.name: p.spec.enforcement for p in policies}
    for m in explain(pod, namespace_labels=labels, owners=owners, policies=policies):
        print(f"  {'match' if m.matched else 'skip ':<5} {m.policy}{_mode(modes[m.policy])}: "
              f"{'; '.join(m.reasons)}")
    for w in decision.warnings:
        print(f"  warning: {w}")
    for a in decision.audits:
        print(f"  not applied: {a.summary}")
    for line in _decision_lines(decision):
        print(f"  {line}")
    objects = gang_objects(decision.pod_group) if decision.pod_group else []
    if decision.pod_group and not objects:
        g = decision.pod_group
        print(f"  gang {g.name}: backend muster, minMember {g.min_member} (pod annotations)")
    for obj in objects:
        print(f"## {obj['kind']}")
        print(yaml.safe_dump(obj, sort_keys=False).rstrip())
    print("## JSON Patch")
    print(json.dumps(ops, indent=2))
    print("## mutated pod")
    print(yaml.safe_dump(mutated, sort_keys=False).rstrip())
    problem = idempotency_failure(mutated, decision, namespace_labels=labels, owners=owners,
                                  policies=policies)
    if problem:
        print(f"FAIL {problem}")
        return 1
    print("idempotent: evaluating the mutated pod again gives an empty patch")
    return 0


def explain_pods(args: argparse.Namespace) -> int:
    labels = _labels(args.namespace_labels)
    owners = _owners(args)
    policies = _load(args)
    for path in map(Path, args.pods):
        pods, skipped = _pods(path, owners, labels)
        for line in skipped:
            print(f"{path}: skipped {line}")
        for pod, chain, made, ns_labels in pods:
            print(f"{path}: pod {_pod_name(pod)}{_made_by(made)}")
            _explain_pod(pod, chain, ns_labels, policies)
    return 0


def _explain_pod(pod: dict[str, Any], owners: list[dict[str, Any]], labels: dict[str, str],
                 policies: PolicySet) -> None:
    modes = {p.name: p.spec.enforcement for p in policies}
    decision = evaluate(pod, namespace_labels=labels, owners=owners, policies=policies)
    # what admission's decision records of the policies in audit or warn mode
    audits = {a.policy: a for a in decision.audits}
    for m in explain(pod, namespace_labels=labels, owners=owners, policies=policies):
        print(f"  {'MATCH' if m.matched else 'no   '}  {m.policy}{_mode(modes[m.policy])}")
        for reason in m.reasons:
            print(f"         {reason}")
        for line in _audit_lines(audits[m.policy]) if m.policy in audits else ():
            print(f"         {line}")
    for line in _decision_lines(decision):
        print(f"  {line}")


def _mode(enforcement: str) -> str:
    """How a policy that is not enforced is marked in listings."""
    return "" if enforcement == "enforce" else f"  [{enforcement}]"


def _audit_lines(audit: PolicyAudit) -> list[str]:
    how = "warns the user" if audit.mode == "warn" else "records it"
    if not audit.changes:
        return [f"→ not applied ({audit.mode}, {how}): would change nothing (the enforced "
                "policies already do it, or override it)"]
    return [f"→ not applied ({audit.mode}, {how}): would set", *(f"    {c}" for c in
                                                                  audit.changes)]


#: a pod to evaluate: the pod, its owners, the owners made for it (by a job's operator), the
#: labels of its namespace
_Pod = tuple[dict[str, Any], list[dict[str, Any]], tuple[dict[str, Any], ...], dict[str, str]]


def _pods(path: Path, owners: list[dict[str, Any]], labels: dict[str, str]
          ) -> tuple[list[_Pod], list[str]]:
    """Each pod of the manifest's documents: a Pod as it is, each pod a job's operator creates
    (the --owner objects come after those made, above the job), in the namespace labels given,
    else those of its Namespace in the manifest; and a line for each document skipped."""
    found = _manifest(path)
    pods = [(t.pod, [*t.made, *owners], t.made, labels or found.namespace_labels(t.pod))
            for t in found.targets]
    return pods, found.skipped


def _manifest(path: Path) -> Manifest:
    """Every document of a manifest file read; a UsageError when none can be explained."""
    docs = _read(path, "pod", read_objects)
    try:
        found = read_manifest(docs)
    except ValueError as exc:
        raise UsageError(f"{path}: {exc}") from exc
    if found.targets:
        return found
    if not docs:
        raise UsageError(f"pod {path}: expected a Kubernetes object, got nothing")
    if len(docs) == 1:
        raise UsageError(f"{path}: {unsupported(object_of(docs[0]))}")
    raise UsageError(f"{path}: nothing to explain: {'; '.join(found.skipped)}")


def _pod_name(pod: dict[str, Any]) -> str:
    return f"{(pod.get('metadata') or {}).get('namespace', '')}/{name_of(pod)}"


def _made_by(owners: tuple[dict[str, Any], ...]) -> str:
    if not owners:
        return ""
    return " (owned by " + ", ".join(f"{o.get('kind')} {name_of(o)}" for o in owners) + ")"


def _owners(args: argparse.Namespace) -> list[dict[str, Any]]:
    return [_read(Path(p), "--owner", read_object) for p in args.owner]


def _read(path: Path, what: str, reader: Callable[[Path], T]) -> T:
    """A file's object(s), or a UsageError that names it (missing, a directory, not YAML)."""
    try:
        return reader(path)
    except OSError as exc:
        raise UsageError(f"{what} {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise UsageError(f"{what} {path}: not UTF-8 text") from exc
    except ValueError as exc:
        raise UsageError(f"{what} {exc}") from exc


def _decision_lines(decision: Decision) -> list[str]:
    """Beyond the policies' match: the fields a matched policy lost to another, and what
    admission does with the gang in the cluster."""
    out = [override.describe() for override in decision.overrides]
    if decision.network:
        out.append(decision.network)
    g = decision.pod_group
    if g is not None and g.backend == "volcano":
        out.append(f"gang {g.name}: {describe(g)}")
    if g is not None and g.backend == "kubernetes":
        out.append(f"gang {g.name}: native Workload API, shown as {native.api_of(g)}; admission "
                   "writes the shape the cluster serves (discovery), and where it serves none "
                   f"{'refuses the pod' if g.unavailable_api == 'Refuse' else 'drops the gang'}"
                   " (gang.unavailableApi)")
    if decision.gang_blocked:
        out.append(f"gang: {decision.gang_blocked}; in the cluster the pod is refused while its "
                   "job cannot be read (serve --owner-retry-seconds), then admitted without it")
    return out
