"""Load SchedulingPolicy documents from files, directories (a mounted ConfigMap) or ConfigMap data.

All problems of all files are collected and raised together as one PolicyError; nothing is ever
partially loaded, so a bad edit never replaces the last good PolicySet.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path as FsPath
from typing import Any

from pydantic import BaseModel, ValidationError

from webhook.policy.errors import PolicyError, PolicyIssue
from webhook.policy.policyset import PolicySet, find_conflicts, written_fields
from webhook.policy.schema import API_VERSION, KIND, SchedulingPolicy, contradictions
from webhook.policy.yamlpos import Document, YamlProblem, decode, documents

POLICY_SUFFIXES = (".yaml", ".yml", ".json")


def load_policies(paths: Sequence[str | FsPath]) -> PolicySet:
    """Policies from files and directories. Directories are read one level deep, skipping hidden
    entries (a ConfigMap volume's `..data` and timestamped dot-directories) and files that do
    not end in .yaml, .yml or .json."""
    sources: list[tuple[str, bytes]] = []
    issues: list[PolicyIssue] = []
    for raw in paths:
        path = FsPath(raw)
        try:
            if path.is_dir():
                for entry in sorted(path.iterdir()):
                    if not entry.name.startswith(".") and entry.suffix in POLICY_SUFFIXES \
                            and entry.is_file():
                        sources.append((str(entry), entry.read_bytes()))
            else:
                sources.append((str(path), path.read_bytes()))
        except OSError as exc:
            issues.append(PolicyIssue(str(path), 0, 0, 0, "", exc.strerror or str(exc)))
    return _build(sources, issues)


def load_policy_texts(texts: Mapping[str, str]) -> PolicySet:
    """Policies from ConfigMap `data` (key = file name, value = YAML text)."""
    # surrogatepass: a lone surrogate (possible in JSON) becomes bytes that the decoder then
    # reports with its position, instead of an exception here
    sources = [(str(name), str(text).encode("utf-8", "surrogatepass"))
               for name, text in sorted(texts.items())]
    return _build(sources, [])


def _build(sources: list[tuple[str, bytes]], issues: list[PolicyIssue]) -> PolicySet:
    loaded: list[tuple[SchedulingPolicy, str, Document]] = []
    for name, raw in sources:
        loaded.extend(_parse_source(name, raw, issues))
    policies = [p for p, _, _ in loaded]

    first_by_name: dict[str, str] = {}
    for policy, file, doc in loaded:
        if policy.name in first_by_name:
            line, col = doc.position(("metadata", "name"))
            issues.append(PolicyIssue(file, doc.index, line, col, "metadata.name",
                                      f"duplicate policy name, first defined at "
                                      f"{first_by_name[policy.name]}", policy.name))
        else:
            first_by_name[policy.name] = _origin(file, doc)

    written_labels = {k.split(".", 1)[1]: p.name for p in policies
                      for k in written_fields(p) if k.startswith("labels.")}
    for policy, file, doc in loaded:
        sel = policy.spec.match.podSelector
        for key in sorted(sel.keys() & written_labels.keys() if sel else ()):
            path = ("spec", "match", "podSelector")
            line, col = doc.position(path)
            issues.append(PolicyIssue(
                file, doc.index, line, col, _dotted(path),
                f"selects on label {key!r}, which policy {written_labels[key]} writes: the result "
                "would change when the pod is evaluated again", policy.name))

    for c in find_conflicts(policies):
        (a, a_file, a_doc), (b, b_file, b_doc) = loaded[c.first], loaded[c.second]
        line, col = b_doc.position(c.path)
        a_line, _ = a_doc.position(c.path)
        issues.append(PolicyIssue(
            b_file, b_doc.index, line, col, _dotted(c.path),
            f"conflicts with policy {a.name} ({a_file}:{a_line}): both set {c.field} to "
            f"different values at priority {b.spec.priority} for pods both can match; give one "
            "a higher spec.priority or make their match disjoint", b.name))

    if issues:
        raise PolicyError(issues)
    return PolicySet.of([(p, _origin(file, doc)) for p, file, doc in loaded])


def _origin(file: str, doc: Document) -> str:
    return f"{file}:{doc.value_pos.get((), (1, 1))[0]}"


def _parse_source(name: str, raw: bytes,
                  issues: list[PolicyIssue]) -> list[tuple[SchedulingPolicy, str, Document]]:
    out: list[tuple[SchedulingPolicy, str, Document]] = []
    try:
        for doc in documents(decode(raw)):
            policy = _validate(name, doc, issues)
            if policy is not None:
                out.append((policy, name, doc))
    except YamlProblem as exc:
        issues.append(PolicyIssue(name, exc.document, exc.line, exc.column, "", exc.message))
    return out


def _validate(file: str, doc: Document, issues: list[PolicyIssue]) -> SchedulingPolicy | None:
    data = doc.data
    if not isinstance(data, dict):
        line, col = doc.position(())
        issues.append(PolicyIssue(file, doc.index, line, col, "",
                                  f"a policy document must be a mapping, got {_type(data)}"))
        return None
    meta = data.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    policy_name = name if isinstance(name, str) else ""
    before = len(issues)
    for path, line, col, message in doc.problems:
        issues.append(PolicyIssue(file, doc.index, line, col, _dotted(path), message, policy_name))
    for key, want in (("apiVersion", API_VERSION), ("kind", KIND)):
        got = data.get(key)
        if got != want:
            line, col = doc.position((key,))
            found = "it is missing" if got is None else f"got {got!r}"
            issues.append(PolicyIssue(file, doc.index, line, col, key,
                                      f"must be {want!r}, {found}", policy_name))
    if len(issues) > before:
        return None
    try:
        policy = SchedulingPolicy.model_validate(data)
    except ValidationError as exc:
        for err in exc.errors(include_url=False):
            loc = tuple(p for p in err["loc"] if p != "[key]")
            kind = err["type"]
            on_key = kind in ("extra_forbidden", "missing") or "[key]" in err["loc"]
            line, col = doc.position(loc, of_key=on_key)
            issues.append(PolicyIssue(file, doc.index, line, col, _dotted(loc),
                                      _message(err, loc), policy_name))
        return None
    for path, message in contradictions(policy):
        line, col = doc.position(path)
        issues.append(PolicyIssue(file, doc.index, line, col, _dotted(path), message, policy_name))
    return None if len(issues) > before else policy


def _message(err: Any, loc: tuple[Any, ...]) -> str:
    kind = err["type"]
    if kind == "extra_forbidden":
        allowed = _fields_at(loc[:-1])
        return "unknown field" + (f" (allowed: {', '.join(allowed)})" if allowed else "")
    if kind == "missing":
        return "required field is missing"
    message = str(err["msg"])
    return message.removeprefix("Value error, ")


def _fields_at(loc: tuple[Any, ...]) -> list[str]:
    """Field names of the model at `loc` in a SchedulingPolicy, for 'unknown field' hints."""
    model: Any = SchedulingPolicy
    for part in loc:
        if isinstance(part, int):
            continue
        if not (isinstance(model, type) and issubclass(model, BaseModel)) or \
                part not in model.model_fields:
            return []
        model = _model_in(model.model_fields[part].annotation)
    if isinstance(model, type) and issubclass(model, BaseModel):
        return list(model.model_fields)
    return []


def _model_in(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is not None:
        for arg in typing.get_args(annotation):
            found = _model_in(arg)
            if found is not None:
                return found
    return None


def _dotted(path: Sequence[str | int]) -> str:
    return ".".join(str(p) for p in path)


def _type(value: object) -> str:
    names = {"dict": "a mapping", "list": "a list", "str": "a string"}
    return names.get(type(value).__name__, type(value).__name__)
