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
from webhook.policy.decision import Decision
from webhook.policy.engine import evaluate
from webhook.policy.loader import field_message
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
    namespaceLabels: dict[str, str] = Field(default_factory=dict)
    owners: list[dict[str, Any]] = Field(default_factory=list)
    ownerFiles: list[str] = Field(default_factory=list)
    expect: Expect = Field(default_factory=Expect)

    @model_validator(mode="after")
    def _one_pod(self) -> TestSpec:
        if (self.pod is None) == (self.podFile is None):
            raise ValueError("give exactly one of pod and podFile")
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


def read_object(path: Path) -> dict[str, Any]:
    """A Kubernetes object from YAML/JSON; an AdmissionReview gives its request.object (with the
    request's namespace filled in, as the API server would)."""
    try:
        docs = load_all(read(path))
    except YamlProblem as exc:
        raise ValueError(f"{path} is not valid YAML: {exc.at(str(path))}") from exc
    if len(docs) > 1:
        raise ValueError(f"{path}: expected one Kubernetes object, got {len(docs)} documents")
    data = docs[0] if docs else None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a Kubernetes object, got {type(data).__name__}")
    if data.get("kind") == "AdmissionReview":
        request = data.get("request") or {}
        obj = request.get("object")
        if not isinstance(obj, dict):
            raise ValueError(f"{path}: AdmissionReview without request.object")
        meta = obj.setdefault("metadata", {})
        if request.get("namespace") and not meta.get("namespace"):
            meta["namespace"] = request["namespace"]
        return obj
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
    result = CaseResult(test.metadata.name, str(base))
    spec = test.spec
    try:
        pod = spec.pod if spec.pod is not None else read_object(base.parent / str(spec.podFile))
        owners: list[Mapping[str, Any]] = [*spec.owners,
                                           *(read_object(base.parent / f) for f in spec.ownerFiles)]
        expected_pod = spec.expect.patchedPod
        if spec.expect.patchedPodFile:
            expected_pod = read_object(base.parent / spec.expect.patchedPodFile)
    except (OSError, ValueError) as exc:
        result.failures.append(f"cannot read test input: {exc}")
        return result

    decision = evaluate(pod, namespace_labels=spec.namespaceLabels, owners=owners,
                        policies=policies)
    result.decision = decision
    try:
        _, mutated = mutate(pod, decision)
    except JsonPatchError as exc:
        result.failures.append(f"the patch does not apply to the pod: {exc}")
        return result
    problem = idempotency_failure(mutated, decision, namespace_labels=spec.namespaceLabels,
                                  owners=owners, policies=policies)
    if problem:
        result.failures.append(problem)

    expect = spec.expect
    if expect.policies is not None and list(decision.policies) != expect.policies:
        result.failures.append(f"policies: expected {expect.policies}, "
                               f"applied {list(decision.policies)}")
    if expect.podContains is not None:
        result.failures.extend(f"pod {d}" for d in subset_diff(expect.podContains, mutated))
    if expected_pod is not None and expected_pod != mutated:
        result.failures.append("patched pod differs:\n" + "\n".join(full_diff(expected_pod,
                                                                                mutated)))
    if "podGroup" in expect.model_fields_set:
        actual_pg = podgroup_manifest(decision.pod_group) if decision.pod_group else None
        if expect.podGroup is None and actual_pg is not None:
            result.failures.append(f"podGroup: expected none, got {json.dumps(actual_pg)}")
        elif expect.podGroup is not None:
            if actual_pg is None:
                result.failures.append("podGroup: expected one, none decided")
            else:
                result.failures.extend(f"podGroup {d}"
                                       for d in subset_diff(expect.podGroup, actual_pg))
    if expect.warnings == [] and decision.warnings:
        result.failures.append(f"warnings: expected none, got {list(decision.warnings)}")
    for want in expect.warnings or ():
        if not any(want in w for w in decision.warnings):
            result.failures.append(f"warning containing {want!r} expected, got "
                                   f"{list(decision.warnings)}")
    return result


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
