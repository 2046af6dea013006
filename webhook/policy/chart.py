"""A policy set in the chart's shapes (charts/muster): a Helm values file whose `policies:` maps
file names to policy texts (what `muster policy pack` writes and `helm upgrade -f` takes), and
the policies ConfigMap the chart renders (`helm template`). `muster policy check` reads both, so
a broken policy fails before install, offline.

Each policy file found keeps its name, so a problem's line is the line in the admin's own file
(`policies/mpi-volcano.yaml` packed is `values.yaml[mpi-volcano.yaml]`, line for line).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from webhook.policy.errors import PolicyIssue
from webhook.policy.jsonshape import as_list, as_map
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


def unpack(name: str, raw: bytes, issues: list[PolicyIssue]) -> list[tuple[str, bytes]] | None:
    """The policy files that a values file or a rendered manifest stream holds, each named
    `NAME[FILE]`, or `NAME[ConfigMap CM/FILE]`; None when `raw` is neither (policy YAML itself,
    or YAML that does not read: the loader reports it). A file the chart would refuse is added
    to `issues`."""
    docs = _documents(raw)
    if docs is None:
        return None
    if len(docs) == 1 and _is_values(docs[0].data):
        return _files(name, "", docs[0], "policies", issues)
    maps = [d for d in docs if _is_policies_configmap(d.data)]
    return [file for d in maps for file in _files(
        name, f"ConfigMap {d.data['metadata'].get('name')}/", d, "data", issues)] \
        if maps else None


@dataclass(frozen=True, slots=True)
class BinderLevels:
    """The binder's `--network-levels` as a chart file gives it."""

    #: the flag's value; None: the binder runs without (or there is no binder)
    value: str | None
    #: where it comes from, e.g. `values.yaml binder.networkLevels`
    source: str
    #: set by the file; False: a values file that leaves them to the chart's default
    explicit: bool = True


def binder_levels(name: str, raw: bytes) -> BinderLevels | None:
    """The `--network-levels` the binder gets from a values file with `policies:` (its
    binder.networkLevels and binder.extraArgs, rendered as the chart does), or from `helm
    template`'s output (its binder Deployment's args); None when `raw` is neither."""
    if b"policies" not in raw:  # neither can be without it: a policy file is not parsed again
        return None
    docs = _documents(raw)
    if docs is None:
        return None
    if len(docs) == 1 and _is_values(docs[0].data):
        return _values_levels(name, docs[0].data)
    if any(_is_policies_configmap(d.data) for d in docs):
        return _rendered_levels(name, [d.data for d in docs])
    return None


def _values_levels(name: str, values: dict[str, Any]) -> BinderLevels:
    binder = as_map(values.get("binder"))
    if binder.get("enabled") is False:
        return BinderLevels(None, f"{name} binder.enabled false")
    levels = binder.get("networkLevels", DEFAULT_NETWORK_LEVELS)
    from_extra = _flag_value([str(a) for a in as_list(binder.get("extraArgs"))])
    if from_extra is not None:  # rendered after networkLevels': the binder's parser takes it
        return BinderLevels(from_extra or None, f"{name} binder.extraArgs")
    return BinderLevels(_levels_flag(levels), f"{name} binder.networkLevels"
                        + ("" if "networkLevels" in binder else " (the chart's default)"),
                        explicit="networkLevels" in binder)


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


def _is_values(data: Any) -> bool:
    return isinstance(data, dict) and "kind" not in data and isinstance(data.get("policies"),
                                                                         dict)


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
    out: list[tuple[str, bytes]] = []
    for key, text in entries.items() if isinstance(entries, dict) else ():
        problem = _entry_problem(key, text)
        if problem is not None:
            line, col = doc.position((field, key))
            issues.append(PolicyIssue(name, doc.index, line, col, f"{field}.{key}", problem))
            continue
        out.append((f"{name}[{prefix}{key}]", text.encode("utf-8", "surrogatepass")))
    return out


def _entry_problem(key: Any, text: Any) -> str | None:
    if not isinstance(text, str):
        return f"must be a policy file's text, got {type(text).__name__}"
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

