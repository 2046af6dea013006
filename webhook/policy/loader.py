"""Load SchedulingPolicy documents from files, directories (a mounted ConfigMap) or ConfigMap data.

All problems of all documents of all files are collected and raised together as one PolicyError,
in file and line order: a problem never hides another (a broken document does not stop the
next, a type error does not stop the checks across fields, see schema.Parts). Nothing is ever
partially loaded, so a bad edit never replaces the last good PolicySet.
"""

from __future__ import annotations

import itertools
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path as FsPath
from typing import Any

from pydantic import BaseModel, ValidationError

from webhook.policy.chart import MAX_CHART_BYTES, unpack, values_policies, values_size
from webhook.policy.errors import MAX_LISTED, PolicyError, PolicyIssue
from webhook.policy.helmvalues import ValuesFile
from webhook.policy.jsonshape import as_list, as_map, type_name
from webhook.policy.policyset import PolicySet, find_conflicts
from webhook.policy.schema import (
    API_VERSION,
    KIND,
    Parts,
    SchedulingPolicy,
    contradictions,
    is_owner_kind,
    parts_of,
)
from webhook.policy.workload import unmatched_owner_kind
from webhook.yamlpos import (
    MAX_BYTES,
    Document,
    NodeBudget,
    YamlProblem,
    decode,
    documents,
    read,
)

POLICY_SUFFIXES = (".yaml", ".yml", ".json")


#: the most policy documents in one set (real sets hold dozens): the conflict check compares
#: every pair
MAX_POLICIES = 1000
#: the most bytes the files of one set hold together (a ConfigMap holds at most 1 MiB)
MAX_SET_BYTES = 1024 * 1024

#: a path that stands for the command's standard input (`muster policy check -`)
STDIN = "-"
STDIN_NAME = "<stdin>"


def load_policies(paths: Sequence[str | FsPath], *, stdin: bytes | None = None,
                  chart: bool = False) -> PolicySet:
    """Policies from files and directories. Directories are read one level deep, skipping hidden
    entries (a ConfigMap volume's `..data` and timestamped dot-directories) and files that do
    not end in .yaml, .yml or .json. `stdin`: what a path `-` stands for, named `<stdin>` (the
    server never gives it: there `-` is a file). `chart`: a file may also be a Helm values file
    or `helm template`'s output, whose policy files are read (`webhook.policy.chart`)."""
    sources = _Sources(chart)
    issues: list[PolicyIssue] = []
    for raw in paths:
        path = FsPath(raw)
        if stdin is not None and str(raw) == STDIN:
            sources.add(STDIN_NAME, stdin, issues)
            continue
        try:
            files = policy_files(path)
            if not files:
                issues.append(PolicyIssue(str(path), 0, 0, 0, "", "no policy files (.yaml, "
                                          ".yml, .json) in this directory", warning=True))
            for file in files:
                if sources.size() > MAX_SET_BYTES:
                    break  # (refused below) reading on would only cost memory
                sources.add(str(file), read(file, MAX_CHART_BYTES if chart else MAX_BYTES),
                            issues)
        except OSError as exc:
            issues.append(PolicyIssue(str(path), 0, 0, 0, "", exc.strerror or str(exc)))
    return _build(sources.files(issues), issues)


@dataclass
class _Sources:
    """The policy files read, in order. With `chart`, the Helm values files among them are kept
    apart until all are read, then merged as `helm -f` merges them; their policies stand where
    the first values file did."""

    chart: bool
    read: list[tuple[str, bytes]] = field(default_factory=list)
    values: list[ValuesFile] = field(default_factory=list)
    values_at: int = 0

    def add(self, name: str, raw: bytes, issues: list[PolicyIssue]) -> None:
        """The file as it is, or (`chart`) the values file or the rendered ConfigMap's policy
        files it is."""
        found = unpack(name, raw, issues) if self.chart else None
        if isinstance(found, ValuesFile):
            self.values_at = self.values_at if self.values else len(self.read)
            self.values.append(found)
        elif found is None and self.chart and len(raw) > MAX_BYTES:  # read for a chart file
            issues.append(PolicyIssue(name, 0, 0, 0, "", f"larger than {MAX_BYTES // 1024} "
                                      "KiB, the most a policy file may hold (a values file or "
                                      f"helm template's output: {MAX_CHART_BYTES // 1024} KiB)"))
        else:
            self.read.extend([(name, raw)] if found is None else found)

    def size(self) -> int:
        """The bytes read so far, the values files' policies counted each."""
        return sum(len(b) for _, b in self.read) + sum(map(values_size, self.values))

    def files(self, issues: list[PolicyIssue]) -> list[tuple[str, bytes]]:
        """Every policy file, the values files' merged policies among them."""
        at = self.values_at
        return [*self.read[:at], *values_policies(self.values, issues), *self.read[at:]]


def policy_files(path: FsPath) -> list[FsPath]:
    """The policy files a path names: itself, or a directory's (one level deep)."""
    if not path.is_dir():
        return [path]
    return [entry for entry in sorted(path.iterdir()) if not entry.name.startswith(".")
            and entry.suffix in POLICY_SUFFIXES and entry.is_file()]


def load_policy_texts(texts: Mapping[str, str]) -> PolicySet:
    """Policies from ConfigMap `data` (key = file name, value = YAML text)."""
    # surrogatepass: a lone surrogate (possible in JSON) becomes bytes that the decoder then
    # reports with its position, instead of an exception here
    sources = [(str(name), str(text).encode("utf-8", "surrogatepass"))
               for name, text in sorted(texts.items())]
    return _build(sources, [])


@dataclass(frozen=True, slots=True)
class _Read:
    """One document as read: what the checks across documents need of it."""

    file: str
    doc: Document
    #: metadata.name when it is a string ("" otherwise)
    name: str
    parts: Parts
    #: the policy, None when the document has problems of its own
    policy: SchedulingPolicy | None


def _build(sources: list[tuple[str, bytes]], issues: list[PolicyIssue]) -> PolicySet:
    size = sum(len(raw) for _, raw in sources)
    if size > MAX_SET_BYTES:
        raise PolicyError([PolicyIssue(
            sources[-1][0], 0, 0, 0, "", f"the files of the set hold more than "
            f"{MAX_SET_BYTES // 1024} KiB, the most a policy set may hold; nothing was checked")])
    found: list[_Read] = []
    budget = NodeBudget()
    for name, raw in sources:
        found.extend(_parse_source(name, raw, budget, issues))
    if len(found) > MAX_POLICIES:
        raise PolicyError([PolicyIssue(
            found[MAX_POLICIES].file, found[MAX_POLICIES].doc.index, *found[MAX_POLICIES].doc
            .position(()), "", f"{len(found)} policy documents, more than {MAX_POLICIES}, the "
            "most a policy set may hold; the set was not checked further")])
    issues.extend(_duplicate_names(found))
    issues.extend(_unstable_selectors(found))
    loaded = [(r, r.policy) for r in found if r.policy is not None]
    unlisted = _conflicts(loaded, issues)
    rank = {name: i for i, (name, _) in enumerate(sources)}
    issues.sort(key=lambda i: (rank.get(i.file, -1), i.document, i.line, i.column))
    if unlisted or any(not i.warning for i in issues):
        raise PolicyError(issues, unlisted)
    return PolicySet.of([(p, _origin(r.file, r.doc)) for r, p in loaded], tuple(issues))


def _conflicts(loaded: list[tuple[_Read, SchedulingPolicy]], issues: list[PolicyIssue]) -> int:
    """The first MAX_LISTED conflicts, added to `issues`; how many more there are (counted,
    never built: there may be as many as pairs of policies)."""
    found = find_conflicts([p for _, p in loaded])
    for c in itertools.islice(found, MAX_LISTED):
        (a, _), (b, b_policy) = loaded[c.first], loaded[c.second]
        line, col = b.doc.position(c.path)
        a_line, _ = a.doc.position(c.path)
        issues.append(PolicyIssue(
            b.file, b.doc.index, line, col, _dotted(c.path),
            f"conflicts with policy {a.name} ({a.file}:{a_line}): both set {c.field} to "
            f"different values at priority {b_policy.spec.priority} for pods both can match; "
            "give one a higher spec.priority or make their match disjoint", b.name))
    return sum(1 for _ in found)


def _duplicate_names(read: list[_Read]) -> list[PolicyIssue]:
    """Each later definition of a name, naming the first (any document with a name counts,
    valid or not: the name must change either way)."""
    out: list[PolicyIssue] = []
    first: dict[str, _Read] = {}
    for r in read:
        if not r.name:
            continue
        if r.name not in first:
            first[r.name] = r
            continue
        f = first[r.name]
        line, col = r.doc.position(("metadata", "name"))
        f_line, f_col = f.doc.position(("metadata", "name"))
        out.append(PolicyIssue(r.file, r.doc.index, line, col, "metadata.name",
                               f"duplicate policy name {r.name!r}, first defined at "
                               f"{f.file}:{f_line}:{f_col}", r.name))
    return out


def _unstable_selectors(read: list[_Read]) -> list[PolicyIssue]:
    """Pod selectors on a label some policy writes, each side checked on its own."""
    writers = {key: r.name or _origin(r.file, r.doc) for r in read for key in r.parts.labels or ()}
    out: list[PolicyIssue] = []
    path = ("spec", "match", "podSelector")
    for r in read:
        sel = r.parts.pod_selector
        for key in sorted(sel.keys() & writers.keys() if sel else ()):
            line, col = r.doc.position(path)
            out.append(PolicyIssue(
                r.file, r.doc.index, line, col, _dotted(path),
                f"selects on label {key!r}, which policy {writers[key]} writes: the result "
                "would change when the pod is evaluated again", r.name))
    return out


def _origin(file: str, doc: Document) -> str:
    return f"{file}:{doc.value_pos.get((), (1, 1))[0]}"


def _parse_source(name: str, raw: bytes, budget: NodeBudget,
                  issues: list[PolicyIssue]) -> list[_Read]:
    try:
        text = decode(raw)
    except YamlProblem as exc:
        issues.append(PolicyIssue(name, exc.document, exc.line, exc.column, "", exc.message))
        return []
    out: list[_Read] = []
    read_any = False
    for doc in documents(text, budget):
        read_any = True
        if isinstance(doc, YamlProblem):
            issues.append(PolicyIssue(name, doc.document, doc.line, doc.column, "", doc.message))
        elif (checked := _check(name, doc, issues)) is not None:
            out.append(checked)
    if not read_any:
        issues.append(PolicyIssue(name, 0, 0, 0, "", "holds no policy (empty, or comments "
                                  "only)", warning=True))
    return out


def _check(file: str, doc: Document, issues: list[PolicyIssue]) -> _Read | None:
    """Every problem of one document, added to `issues`; None when it is no mapping at all."""
    data = doc.data
    if not isinstance(data, dict):
        line, col = doc.position(())
        issues.append(PolicyIssue(file, doc.index, line, col, "",
                                  f"a policy document must be a mapping, got {type_name(data)}"))
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
    kind = data.get("kind")
    if isinstance(kind, str) and kind and kind != KIND:
        # another kind of object: its fields (and name) mean something else
        return _Read(file, doc, "", Parts(), None)
    policy = None
    try:
        policy = SchedulingPolicy.model_validate(data)
    except ValidationError as exc:
        for err in exc.errors(include_url=False):
            loc = tuple(p for p in err["loc"] if p != "[key]")
            if loc in (("apiVersion",), ("kind",)):
                continue  # said above
            on_key = err["type"] in ("extra_forbidden", "missing") or "[key]" in err["loc"]
            line, col = doc.position(loc, of_key=on_key)
            issues.append(PolicyIssue(file, doc.index, line, col, _dotted(loc),
                                      field_message(err, loc, SchedulingPolicy), policy_name))
    parts = parts_of(data)
    for path, message in contradictions(parts):
        line, col = doc.position(path)
        issues.append(PolicyIssue(file, doc.index, line, col, _dotted(path), message, policy_name))
    valid = len(issues) == before
    issues.extend(_owner_kind_warnings(file, doc, policy_name))
    return _Read(file, doc, policy_name, parts, policy if valid else None)


def _owner_kind_warnings(file: str, doc: Document, policy_name: str) -> list[PolicyIssue]:
    """ownerKinds entries that match no pod (a job kind without its group)."""
    match = as_map(as_map(as_map(doc.data).get("spec")).get("match"))
    out = []
    for i, kind in enumerate(as_list(match.get("ownerKinds"))):
        # (one the schema refuses is an error already)
        why = unmatched_owner_kind(kind) if isinstance(kind, str) and is_owner_kind(kind) \
            else None
        if why is not None:
            path = ("spec", "match", "ownerKinds", i)
            line, col = doc.position(path)
            out.append(PolicyIssue(file, doc.index, line, col, _dotted(path), why, policy_name,
                                   warning=True))
    return out


def field_message(err: Any, loc: tuple[Any, ...], root: type[BaseModel]) -> str:
    """A pydantic error at `loc` in a document of model `root`, in Muster's words (a policy's
    and a PolicyTest's problems read alike)."""
    kind = err["type"]
    if kind == "extra_forbidden":
        allowed = _fields_at(loc[:-1], root)
        return "unknown field" + (f" (allowed: {', '.join(allowed)})" if allowed else "")
    if kind == "missing":
        return "required field is missing"
    message = str(err["msg"])
    return message.removeprefix("Value error, ")


def _fields_at(loc: tuple[Any, ...], root: type[BaseModel]) -> list[str]:
    """Field names of the model at `loc` in a `root` document, for 'unknown field' hints."""
    model: Any = root
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
