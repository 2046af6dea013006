"""PolicyTest files: regression tests for policies, in the spirit of `kyverno test`.

A PolicyTest names a pod (inline or a file, which may also be a captured AdmissionReview), the
namespace labels and owner objects the webhook would see, and what must come out: the policies
applied, the patched pod (exactly, or a subset of it), the PodGroup, warnings. Every case also
checks that the patch is idempotent. Format reference: docs/policies.md.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from webhook.jsonpatch import JsonPatchError, apply_patch
from webhook.policy import operators
from webhook.policy.decision import Decision
from webhook.policy.engine import evaluate
from webhook.policy.loader import field_message
from webhook.policy.manifests import job_targets, name_of, object_of, unsupported
from webhook.policy.patch import render_patch
from webhook.policy.podgroup import podgroup_manifest
from webhook.policy.policyset import PolicySet
from webhook.yamlpos import Document, YamlProblem, decode, documents, load_all, read

TEST_KIND = "PolicyTest"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Expect(_Model):
    policies: list[str] | None = None
    podContains: dict[str, Any] | None = None
    patchedPod: dict[str, Any] | None = None
    patchedPodFile: str | None = None
    podGroup: dict[str, Any] | None = None
    warnings: list[str] | None = None


class TestSpec(_Model):
    pod: dict[str, Any] | None = None
    podFile: str | None = None
    #: a job manifest: the pods its operator creates, each with the owners made for it
    jobFile: str | None = None
    #: the one pod of jobFile to test, by name as `explain` prints it (`<job>-worker-0`,
    #: `<job>-launcher-*`); every pod the job creates when absent
    jobPod: str | None = None
    namespaceLabels: dict[str, str] = Field(default_factory=dict)
    owners: list[dict[str, Any]] = Field(default_factory=list)
    ownerFiles: list[str] = Field(default_factory=list)
    expect: Expect = Field(default_factory=Expect)

    @model_validator(mode="after")
    def _one_pod(self) -> TestSpec:
        if [self.pod, self.podFile, self.jobFile].count(None) != 2:
            raise ValueError("give exactly one of pod, podFile and jobFile")
        if self.jobPod is not None and self.jobFile is None:
            raise ValueError("jobPod names a pod of jobFile: give jobFile too")
        return self


class TestMeta(_Model):
    name: str


class PolicyTest(_Model):
    apiVersion: Literal["muster.io/v1alpha1"]
    kind: Literal["PolicyTest"]
    metadata: TestMeta
    spec: TestSpec


@dataclass
class CaseResult:
    name: str
    file: str
    failures: list[str] = field(default_factory=list)
    decision: Decision | None = None

    @property
    def passed(self) -> bool:
        return not self.failures


def read_objects(path: Path) -> list[Any]:
    """Every document of a YAML/JSON file; ValueError, naming the file, when it is not YAML."""
    try:
        return load_all(read(path))
    except YamlProblem as exc:
        raise ValueError(f"{path} is not valid YAML: {exc.at(str(path))}") from exc


def read_object(path: Path) -> dict[str, Any]:
    """A Kubernetes object from YAML/JSON; an AdmissionReview gives its request.object (with the
    request's namespace filled in, as the API server would)."""
    docs = read_objects(path)
    if len(docs) > 1:
        raise ValueError(f"{path}: expected one Kubernetes object, got {len(docs)} documents")
    try:
        data = object_of(docs[0] if docs else None)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a Kubernetes object, got {type(data).__name__}")
    return data


def mutate(pod: Mapping[str, Any], decision: Decision) -> tuple[list[dict[str, Any]], Any]:
    ops = render_patch(pod, decision)
    return ops, apply_patch(pod, ops)


def idempotency_failure(mutated: Any, decision: Decision, *, namespace_labels: Mapping[str, str],
                        owners: Sequence[Mapping[str, Any]], policies: PolicySet) -> str | None:
    again = evaluate(mutated, namespace_labels=namespace_labels, owners=owners, policies=policies)
    ops = render_patch(mutated, again)
    if ops:
        return f"not idempotent: evaluating the patched pod again gives {json.dumps(ops)}"
    if again.pod_group != decision.pod_group:
        return f"not idempotent: PodGroup {decision.pod_group} became {again.pod_group}"
    return None


def subset_diff(expected: Any, actual: Any, path: str = "") -> list[str]:
    """Paths where `expected` (a partial object) differs from `actual`."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        out: list[str] = []
        for key, value in expected.items():
            here = f"{path}.{key}" if path else str(key)
            if key not in actual:
                if value is not None:  # `key: null` in the expectation means "must be absent"
                    out.append(f"{here}: expected {json.dumps(value)}, absent")
            elif value is None:
                out.append(f"{here}: expected absent, found {json.dumps(actual[key])}")
            else:
                out.extend(subset_diff(value, actual[key], here))
        return out
    if expected != actual:
        return [f"{path}: expected {json.dumps(expected)}, found {json.dumps(actual)}"]
    return []


def full_diff(expected: Any, actual: Any) -> list[str]:
    a = yaml.safe_dump(expected, sort_keys=True).splitlines()
    b = yaml.safe_dump(actual, sort_keys=True).splitlines()
    return list(difflib.unified_diff(a, b, "expected", "actual", lineterm="", n=2))


def run_case(test: PolicyTest, base: Path, policies: PolicySet) -> CaseResult:
    """Every pod of the case checked against its expectations (with jobFile and no jobPod,
    each pod the job creates, its failures named by the pod)."""
    result = CaseResult(test.metadata.name, str(base))
    spec = test.spec
    try:
        cases = _cases(spec, base)
        expected_pod = spec.expect.patchedPod
        if spec.expect.patchedPodFile:
            expected_pod = read_object(base.parent / spec.expect.patchedPodFile)
    except (OSError, ValueError) as exc:
        result.failures.append(f"cannot read test input: {exc}")
        return result
    for name, pod, owners in cases:
        decision, failures = _check_pod(spec, pod, owners, expected_pod, policies)
        result.decision = result.decision or decision
        result.failures.extend(f"pod {name}: {f}" if len(cases) > 1 else f for f in failures)
    return result


def _cases(spec: TestSpec, base: Path) -> list[tuple[str, Any, list[Mapping[str, Any]]]]:
    """(pod name, pod, owners) of each pod the case tests."""
    owners: list[Mapping[str, Any]] = [*spec.owners,
                                       *(read_object(base.parent / f) for f in spec.ownerFiles)]
    if spec.jobFile is None:
        pod = spec.pod if spec.pod is not None else read_object(base.parent / str(spec.podFile))
        return [("", pod, owners)]
    job = read_object(base.parent / spec.jobFile)
    if not operators.is_job(job):
        raise ValueError(f"jobFile {spec.jobFile}: {unsupported(job)}")
    made = [(name_of(t.pod), t.pod, [*t.made, *owners]) for t in job_targets(job)]
    chosen = [case for case in made if spec.jobPod in (None, case[0])]
    if not chosen:
        raise ValueError(f"jobPod {spec.jobPod}: the job creates no such pod (its pods: "
                         f"{', '.join(name for name, _, _ in made)})")
    return chosen


def _check_pod(spec: TestSpec, pod: Any, owners: list[Mapping[str, Any]], expected_pod: Any,
               policies: PolicySet) -> tuple[Decision, list[str]]:
    decision = evaluate(pod, namespace_labels=spec.namespaceLabels, owners=owners,
                        policies=policies)
    try:
        _, mutated = mutate(pod, decision)
    except JsonPatchError as exc:
        return decision, [f"the patch does not apply to the pod: {exc}"]
    problem = idempotency_failure(mutated, decision, namespace_labels=spec.namespaceLabels,
                                  owners=owners, policies=policies)
    failures = [problem] if problem else []
    return decision, failures + _unmet(spec.expect, decision, mutated, expected_pod)


def _unmet(expect: Expect, decision: Decision, mutated: Any, expected_pod: Any) -> list[str]:
    """What the decision and the patched pod do not meet of the expectations."""
    failures: list[str] = []
    if expect.policies is not None and list(decision.policies) != expect.policies:
        failures.append(f"policies: expected {expect.policies}, "
                        f"applied {list(decision.policies)}")
    if expect.podContains is not None:
        failures.extend(f"pod {d}" for d in subset_diff(expect.podContains, mutated))
    if expected_pod is not None and expected_pod != mutated:
        failures.append("patched pod differs:\n" + "\n".join(full_diff(expected_pod, mutated)))
    if "podGroup" in expect.model_fields_set:
        failures.extend(_podgroup_unmet(expect.podGroup, decision))
    if expect.warnings == [] and decision.warnings:
        failures.append(f"warnings: expected none, got {list(decision.warnings)}")
    for want in expect.warnings or ():
        if not any(want in w for w in decision.warnings):
            failures.append(f"warning containing {want!r} expected, got "
                            f"{list(decision.warnings)}")
    return failures


def _podgroup_unmet(expected: dict[str, Any] | None, decision: Decision) -> list[str]:
    actual = podgroup_manifest(decision.pod_group) if decision.pod_group else None
    if expected is None:
        return [f"podGroup: expected none, got {json.dumps(actual)}"] if actual else []
    if actual is None:
        return ["podGroup: expected one, none decided"]
    return [f"podGroup {d}" for d in subset_diff(expected, actual)]


def load_tests(path: Path) -> tuple[list[tuple[PolicyTest, Path]], list[str]]:
    """PolicyTest documents from a file or a directory (recursively); (tests, problems), each
    problem one line that names file, line and column, as `muster policy check` does."""
    files = sorted(p for p in path.rglob("*") if p.suffix in (".yaml", ".yml")
                   and p.is_file() and not any(part.startswith(".") for part in p.parts)) \
        if path.is_dir() else [path]
    tests: list[tuple[PolicyTest, Path]] = []
    problems: list[str] = []
    for file in files:
        try:
            for doc in documents(decode(read(file))):
                if isinstance(doc, YamlProblem):
                    problems.append(_problem(file, (doc.line, doc.column), doc.document,
                                             doc.message))
                elif isinstance(doc.data, dict) and doc.data.get("kind") == TEST_KIND:
                    # (pods and owners referenced by the tests live beside them)
                    tests.extend((test, file) for test in _test(file, doc, problems))
        except OSError as exc:
            problems.append(f"{file}: {exc.strerror or exc}")
        except YamlProblem as exc:  # not UTF-8
            problems.append(_problem(file, (exc.line, exc.column), 0, exc.message))
    return tests, problems


def _test(file: Path, doc: Document, problems: list[str]) -> list[PolicyTest]:
    try:
        return [PolicyTest.model_validate(doc.data)]
    except ValidationError as exc:
        for err in exc.errors(include_url=False):
            loc = tuple(p for p in err["loc"] if p != "[key]")
            line, col = doc.position(loc, of_key=err["type"] in ("extra_forbidden", "missing"))
            field = ".".join(str(p) for p in loc)
            message = field_message(err, loc, PolicyTest)
            problems.append(_problem(file, (line, col), doc.index, f"{field}: {message}"))
        return []


def _problem(file: Path, at: tuple[int, int], document: int, message: str) -> str:
    where = f"{file}:{at[0]}:{at[1]}" if at[0] else str(file)
    return f"{where}: {message}" + (f" (document {document})" if document else "")
