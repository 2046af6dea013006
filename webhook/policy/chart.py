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
from typing import Any

import yaml

from webhook.policy.errors import PolicyIssue
from webhook.yamlpos import Document, YamlProblem, decode, documents

#: the label the chart puts on the policies ConfigMap the webhook mounts and validates (the
#: policy-check hook's copy of the same files has none)
POLICIES_LABEL = "muster.io/policies"
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
    try:
        docs = [d for d in documents(decode(raw)) if isinstance(d, Document)]
    except YamlProblem:
        return None
    if len(docs) == 1 and _is_values(docs[0].data):
        return _files(name, "", docs[0], "policies", issues)
    maps = [d for d in docs if _is_policies_configmap(d.data)]
    return [file for d in maps for file in _files(
        name, f"ConfigMap {d.data['metadata'].get('name')}/", d, "data", issues)] \
        if maps else None


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

