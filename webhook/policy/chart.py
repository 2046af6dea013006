"""A policy set in the chart's shapes (charts/muster): Helm values files whose `policies:` maps
file names to policy texts (what `muster policy pack` writes and `helm upgrade -f` takes), merged
as `helm -f a.yaml -f b.yaml` merges them, and the policies ConfigMap the chart renders (`helm
template`). `muster policy check` reads both, so a broken policy fails before install, offline.

Each policy file found keeps its name, so a problem's line is the line in the admin's own file
(`policies/mpi-volcano.yaml` packed is `values.yaml[mpi-volcano.yaml]`, line for line).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from webhook.policy.errors import PolicyIssue
from webhook.policy.helmvalues import ValuesFile, is_values, merged, setter
from webhook.policy.jsonshape import as_list, as_map, type_name
from webhook.yamlpos import Document, YamlProblem, decode, documents

#: the label the chart puts on the policies ConfigMap the webhook mounts and validates (the
#: policy-check hook's copy of the same files has none)
POLICIES_LABEL = "muster.io/policies"
#: the chart's binder.networkLevels (charts/muster/values.yaml): none, so the binder gets no
#: --network-levels and places a gang that names a level by the node label of that name
DEFAULT_NETWORK_LEVELS: tuple[str, ...] = ()
LEVELS_FLAG = "--network-levels"
#: the largest values file or rendered output read. What the chart ships is bounded by its
#: policies ConfigMap: Kubernetes refuses one whose data values total more than 1 MiB
#: (loader.MAX_SET_BYTES, checked on the policies found), and each file more than yamlpos's
#: MAX_BYTES is refused by the webhook that reads it. The files that carry them are larger:
#: a values file indents every line, and `helm template` writes the set twice (the ConfigMap
#: and the policy-check hook's copy, each indented) beside the chart's other objects.
MAX_CHART_BYTES = 4 * 1024 * 1024
#: the file names the chart takes (values.schema.json, `policies` propertyNames)
CHART_FILE_NAME = re.compile(r"^[-._a-zA-Z0-9]+\.ya?ml$")
_HEADER = """\
# Muster's policies for the chart's `policies` value, written by `muster policy pack {paths}`.
# Ship them with: helm upgrade --install muster charts/muster -n muster-system -f THIS_FILE
# Edit the policy files, not this one, and pack again.
"""


def unpack(name: str, raw: bytes, issues: list[PolicyIssue]
           ) -> ValuesFile | list[tuple[str, bytes]] | None:
    """A values file (its policies come from `values_policies`, once all are read), or the
    policy files of a rendered manifest stream, each named `NAME[ConfigMap CM/FILE]`; None when
    `raw` is neither (policy YAML itself, or YAML that does not read: the loader reports it).
    A file the chart would refuse is added to `issues`."""
    docs = _documents(raw)
    if docs is None:
        return None
    if len(docs) == 1 and is_values(docs[0].data):
        return ValuesFile(name, docs[0])
    if len(docs) == 1 and not isinstance(docs[0].data, dict | None):
        issues.append(PolicyIssue(name, docs[0].index, *docs[0].position(()), "",
                                  "a Helm values file or a policy document must be a mapping, "
                                  f"got {type_name(docs[0].data)}"))
        return []
    maps = [d for d in docs if _is_policies_configmap(d.data)]
    return [file for d in maps for file in _files(
        name, f"ConfigMap {d.data['metadata'].get('name')}/", d, "data", issues)] \
        if maps else None


def values_policies(files: Sequence[ValuesFile], issues: list[PolicyIssue]
                    ) -> list[tuple[str, bytes]]:
    """The policy files of the values files' `policies` merged, each named `NAME[FILE]` by the
    file that set it; a `policies` that is no map is an issue where it was set."""
    policies = merged(files).get("policies") if files else None
    if isinstance(policies, dict):
        return [*_values_entries(files, policies, issues)]
    if policies is not None:
        file = setter(files, ("policies",))
        issues.append(PolicyIssue(
            file.name, file.doc.index, *file.doc.position(("policies",)), "policies",
            f"must be a map of file names to policy texts, got {type_name(policies)}"))
    return []


def _values_entries(files: Sequence[ValuesFile], policies: dict[Any, Any],
                    issues: list[PolicyIssue]) -> Iterator[tuple[str, bytes]]:
    for key, text in policies.items():
        file = setter(files, ("policies", key))
        entry = _entry(file.name, "", file.doc, ("policies", key), text, issues=issues)
        if entry is not None:
            yield entry


def values_size(file: ValuesFile) -> int:
    """The characters of the file's policy texts: at most what it adds to the set."""
    policies = file.doc.data.get("policies")
    texts = policies.values() if isinstance(policies, dict) else ()
    return sum(len(text) for text in texts if isinstance(text, str))


@dataclass(frozen=True, slots=True)
class BinderLevels:
    """The binder's `--network-levels` as a chart file gives it."""

    #: the flag's value; None: the binder runs without (or there is no binder)
    value: str | None
    #: where it comes from, e.g. `values.yaml binder.networkLevels`
    source: str
    #: set by the file; False: a values file that leaves them to the chart's default
    explicit: bool = True


def binder_levels(files: Iterable[tuple[str, bytes]]) -> BinderLevels | None:
    """The `--network-levels` the binder gets from the chart files among `files`: from the
    values files merged (binder.networkLevels and binder.extraArgs, rendered as the chart
    does), or from a `helm template` output (its binder Deployment's args). The last file that
    sets them wins, as `helm -f` takes the last, else the chart's default; None when no file is
    a chart file."""
    found: list[BinderLevels] = []
    values: list[ValuesFile] = []
    at = 0  # the merged values stand where the last values file does
    for name, raw in files:
        # a policy file (apiVersion, no policies) is not parsed again
        docs = None if b"apiVersion" in raw and b"policies" not in raw else _documents(raw)
        if docs and len(docs) == 1 and is_values(docs[0].data):
            values.append(ValuesFile(name, docs[0]))
            at = len(found)
        elif docs and any(_is_policies_configmap(d.data) for d in docs):
            found.append(_rendered_levels(name, [d.data for d in docs]))
    if values:
        found.insert(at, _values_levels(values))
    return next((g for g in reversed(found) if g.explicit), found[-1] if found else None)


def _values_levels(files: Sequence[ValuesFile]) -> BinderLevels:
    binder = as_map(merged(files).get("binder"))

    def source(key: str) -> str:
        return f"{setter(files, ('binder', key)).name} binder.{key}"

    if binder.get("enabled") is False:
        return BinderLevels(None, f"{source('enabled')} false")
    from_extra = _flag_value([str(a) for a in as_list(binder.get("extraArgs"))])
    if from_extra is not None:  # rendered after networkLevels': the binder's parser takes it
        return BinderLevels(from_extra or None, source("extraArgs"))
    if "networkLevels" in binder:
        return BinderLevels(_levels_flag(binder["networkLevels"]), source("networkLevels"))
    return BinderLevels(_levels_flag(DEFAULT_NETWORK_LEVELS), f"{files[-1].name} "
                        "binder.networkLevels (the chart's default)", explicit=False)


def _levels_flag(levels: Any) -> str | None:
    """binder.networkLevels as the chart's template writes it into --network-levels."""
    if not levels:
        return None
    if not isinstance(levels, (list, tuple)):
        return str(levels)
    return ",".join(
        (f"{item['alias']}=" if item.get("alias") else "") + str(item.get("nodeLabel"))
        if isinstance(item, dict) else str(item) for item in levels)


def _rendered_levels(name: str, objects: list[Any]) -> BinderLevels:
    for obj in objects:
        for args in _container_args(obj):
            if "bind" in args:
                value = _flag_value(args[args.index("bind") + 1:])
                return BinderLevels(value or None, f"{name}[Deployment "
                                    f"{obj['metadata'].get('name')}] {LEVELS_FLAG}")
    return BinderLevels(None, f"{name} without a binder Deployment")


def _container_args(obj: Any) -> list[list[str]]:
    """The args of each container of a Deployment."""
    if not (as_map(obj).get("kind") == "Deployment" and isinstance(obj.get("metadata"), dict)):
        return []
    spec = as_map(as_map(as_map(obj.get("spec")).get("template")).get("spec"))
    return [[str(a) for a in as_list(as_map(c).get("args"))]
            for c in as_list(spec.get("containers"))]


def _flag_value(args: list[str]) -> str | None:
    """The last --network-levels among `args` (the binder's parser keeps the last), as
    `--network-levels=V` or `--network-levels V`; None when there is none."""
    value = None
    for i, arg in enumerate(args):
        if arg.startswith(f"{LEVELS_FLAG}="):
            value = arg.partition("=")[2]
        elif arg == LEVELS_FLAG and i + 1 < len(args):
            value = args[i + 1]
    return value


def _documents(raw: bytes) -> list[Document] | None:
    """The YAML documents of a file that may be a values file or rendered output (read within
    MAX_CHART_BYTES and the node budget, aliases refused); None when it does not read."""
    try:
        return [d for d in documents(decode(raw, MAX_CHART_BYTES)) if isinstance(d, Document)]
    except YamlProblem:
        return None


def _is_policies_configmap(data: Any) -> bool:
    if not (isinstance(data, dict) and data.get("kind") == "ConfigMap"):
        return False
    meta = data.get("metadata")
    labels = meta.get("labels") if isinstance(meta, dict) else None
    return isinstance(labels, dict) and POLICIES_LABEL in labels


def _files(name: str, prefix: str, doc: Document, field: str, issues: list[PolicyIssue]
           ) -> list[tuple[str, bytes]]:
    """The (name, text) of each entry of the document's `field`; an entry the chart would
    refuse is an issue at its place."""
    entries = doc.data.get(field) or {}
    found = (_entry(name, prefix, doc, (field, key), text, issues=issues)
             for key, text in (entries.items() if isinstance(entries, dict) else ()))
    return [entry for entry in found if entry is not None]


def _entry(name: str, prefix: str, doc: Document, path: tuple[str, Any], text: Any, *,
           issues: list[PolicyIssue]) -> tuple[str, bytes] | None:
    """(name, text) of the policy file at `path` (field, key); None, and an issue at its place,
    when the chart would refuse it."""
    problem = _entry_problem(path[1], text)
    if problem is not None:
        line, col = doc.position(path)
        issues.append(PolicyIssue(name, doc.index, line, col, f"{path[0]}.{path[1]}", problem))
        return None
    return (f"{name}[{prefix}{path[1]}]", text.encode("utf-8", "surrogatepass"))


def _entry_problem(key: Any, text: Any) -> str | None:
    if not isinstance(text, str):
        return f"must be a policy file's text, got {type_name(text)}"
    if not (isinstance(key, str) and CHART_FILE_NAME.match(key)):
        return ("the chart takes file names of letters, digits, '-', '_' and '.', ending in "
                ".yaml or .yml")
    return None


def pack(files: Sequence[tuple[str, str]], paths: Sequence[str]) -> str:
    """A Helm values file whose `policies` holds these (file name, text) pairs, each text as a
    block that reads as the file does."""
    body = yaml.dump({"policies": dict(files)}, Dumper=_Dumper, sort_keys=True,
                     allow_unicode=True, width=1000)
    return _HEADER.format(paths=" ".join(paths)) + body


class _Dumper(yaml.SafeDumper):
    """Multi-line strings as literal blocks (`|`), so the packed policies read as written."""


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _text)

