"""The chart's reader ClusterRole (`reader.clusterRole`), rendered by the real helm, and the
requests the read-only commands make held against its rules as the API server's RBAC would:
every one of `muster analyze`, `gangs` and `explain` must be allowed by it."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from typing import Any

import yaml

from e2e.cluster import helm
from e2e.node.assets import REPO
from webhook.kube import KubeApi

Rule = Mapping[str, Any]


def reader_rules(release: str = "muster") -> list[Rule]:
    rendered = subprocess.run(
        [helm(), "template", release, str(REPO / "charts" / "muster"), "--namespace",
         "muster-system", "--show-only", "templates/reader-rbac.yaml"],
        capture_output=True, text=True, check=True, timeout=60).stdout
    [role] = [d for d in yaml.safe_load_all(rendered) if d]
    assert role["kind"] == "ClusterRole" and role["metadata"]["name"] == f"{release}-reader"
    rules: list[Rule] = role["rules"]
    return rules


def attributes(method: str, path: str, query: list[tuple[str, str]]
               ) -> tuple[str, str, str, str] | None:
    """(verb, API group, resource, name) of a request, as RBAC sees it; None for discovery
    (`/apis/<group>`, `/api/v1`: a non-resource URL every authenticated user may read)."""
    parts = path.strip("/").split("/")
    group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    if not rest:
        return None
    if rest[0] == "namespaces" and len(rest) >= 3:
        rest = rest[2:]
    resource, name = rest[0], (rest[1] if len(rest) > 1 else "")
    verb = {"GET": "get" if name else ("watch" if ("watch", "true") in query else "list"),
            "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}[method]
    return verb, group, resource, name


def allows(rules: list[Rule], verb: str, group: str, resource: str, name: str) -> bool:
    return any(group in r.get("apiGroups", ()) and resource in r.get("resources", ())
               and verb in r.get("verbs", ())
               and (not r.get("resourceNames") or (verb == "get" and name in r["resourceNames"]))
               for r in rules)


class Requests:
    """Records every request a KubeApi makes: (method, path, query)."""

    def __init__(self, api: KubeApi) -> None:
        self.made: list[tuple[str, str, list[tuple[str, str]]]] = []
        original = api.request

        async def request(method: str, path: str, query: list[tuple[str, str]] | None = None,
                          **kw: Any) -> Any:
            self.made.append((method, path, list(query or ())))
            return await original(method, path, query, **kw)
        api.request = request  # type: ignore[method-assign]

    def refused_by(self, rules: list[Rule]) -> list[str]:
        """The requests the rules do not allow, each as `verb group/resource [name]`."""
        out = []
        for method, path, query in self.made:
            seen = attributes(method, path, query)
            if seen is not None and not allows(rules, *seen):
                verb, group, resource, name = seen
                out.append(f"{verb} {group}/{resource} {name}".rstrip())
        return out
