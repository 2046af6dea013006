"""The resource types the emulator serves: built-ins plus those defined by CRDs, and the
discovery documents (/api, /apis, APIResourceList) that clients such as kubectl read."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
SUB_VERBS = ("get", "patch", "update")


@dataclass(frozen=True)
class ResourceType:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    singular: str = ""
    short_names: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()  # "status", "binding"
    categories: tuple[str, ...] = ()
    #: openAPIV3Schema of a CRD version (validation and pruning); None for built-ins
    schema: dict[str, Any] | None = field(default=None, compare=False, hash=False)
    printer_columns: tuple[dict[str, Any], ...] = field(default=(), compare=False, hash=False)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> tuple[str, str]:
        """Storage key: one store per group+plural, whatever the served version."""
        return (self.group, self.plural)

    @property
    def list_kind(self) -> str:
        return self.kind + "List"


def _core(plural: str, kind: str, namespaced: bool = True, *, short: tuple[str, ...] = (),
          sub: tuple[str, ...] = (), group: str = "", version: str = "v1",
          categories: tuple[str, ...] = ()) -> ResourceType:
    return ResourceType(group, version, plural, kind, namespaced, kind.lower(), short, sub,
                        categories)


BUILTINS: tuple[ResourceType, ...] = (
    _core("namespaces", "Namespace", False, short=("ns",), sub=("status",)),
    _core("pods", "Pod", True, short=("po",), sub=("status", "binding", "eviction"),
          categories=("all",)),
    _core("nodes", "Node", False, short=("no",), sub=("status",)),
    _core("configmaps", "ConfigMap", True, short=("cm",)),
    _core("secrets", "Secret"),
    _core("services", "Service", True, short=("svc",), sub=("status",), categories=("all",)),
    _core("endpoints", "Endpoints", True, short=("ep",)),
    _core("endpointslices", "EndpointSlice", True, group="discovery.k8s.io"),
    _core("serviceaccounts", "ServiceAccount", True, short=("sa",)),
    _core("events", "Event", True, short=("ev",)),
    _core("events", "Event", True, short=("ev",), group="events.k8s.io"),
    _core("leases", "Lease", group="coordination.k8s.io"),
    _core("jobs", "Job", True, sub=("status",), group="batch", categories=("all",)),
    _core("deployments", "Deployment", True, short=("deploy",), sub=("status",), group="apps",
          categories=("all",)),
    _core("daemonsets", "DaemonSet", True, short=("ds",), sub=("status",), group="apps",
          categories=("all",)),
    _core("replicasets", "ReplicaSet", True, short=("rs",), sub=("status",), group="apps",
          categories=("all",)),
    _core("statefulsets", "StatefulSet", True, short=("sts",), sub=("status",), group="apps",
          categories=("all",)),
    _core("poddisruptionbudgets", "PodDisruptionBudget", True, short=("pdb",),
          sub=("status",), group="policy"),
    _core("priorityclasses", "PriorityClass", False, short=("pc",),
          group="scheduling.k8s.io"),
    # DRA (resource.k8s.io/v1): stored and served, never allocated (the emulator has no
    # scheduler); a claim's allocation is written by whoever plays the scheduler, as on a cluster
    _core("resourceslices", "ResourceSlice", False, group="resource.k8s.io"),
    _core("resourceclaims", "ResourceClaim", True, sub=("status",), group="resource.k8s.io"),
    _core("resourceclaimtemplates", "ResourceClaimTemplate", True, group="resource.k8s.io"),
    _core("deviceclasses", "DeviceClass", False, group="resource.k8s.io"),
    _core("roles", "Role", True, group="rbac.authorization.k8s.io"),
    _core("rolebindings", "RoleBinding", True, group="rbac.authorization.k8s.io"),
    _core("clusterroles", "ClusterRole", False, group="rbac.authorization.k8s.io"),
    _core("clusterrolebindings", "ClusterRoleBinding", False,
          group="rbac.authorization.k8s.io"),
    # stored and served so that the chart installs, never evaluated: the emulator has no CEL
    # and enforces no NetworkPolicy (the chart's are checked in tests/chart and on the real tier)
    _core("validatingadmissionpolicies", "ValidatingAdmissionPolicy", False, sub=("status",),
          group="admissionregistration.k8s.io"),
    _core("validatingadmissionpolicybindings", "ValidatingAdmissionPolicyBinding", False,
          group="admissionregistration.k8s.io"),
    _core("networkpolicies", "NetworkPolicy", True, short=("netpol",),
          group="networking.k8s.io"),
    _core("mutatingwebhookconfigurations", "MutatingWebhookConfiguration", False,
          group="admissionregistration.k8s.io"),
    _core("validatingwebhookconfigurations", "ValidatingWebhookConfiguration", False,
          group="admissionregistration.k8s.io"),
    _core("customresourcedefinitions", "CustomResourceDefinition", False, short=("crd", "crds"),
          sub=("status",), group="apiextensions.k8s.io"),
)

NAMESPACES = BUILTINS[0]
PODS = BUILTINS[1]
CRDS = BUILTINS[-1]
MUTATING = BUILTINS[-3]
VALIDATING = BUILTINS[-2]
PRIORITY_CLASSES = next(rt for rt in BUILTINS if rt.plural == "priorityclasses")
#: kinds named by a DNS label, not a subdomain: a Service's since RelaxedServiceNameValidation
#: (on in 1.37; 1.34 wants a DNS-1035 label, which starts with a letter)
LABEL_NAMED = frozenset({NAMESPACES.key, ("", "services")})

#: the warning kube-apiserver adds to every answer about a deprecated API, by (group, version,
#: plural), in its words (KEP-4974: Endpoints since 1.33)
DEPRECATED = {("", "v1", "endpoints"):
              "v1 Endpoints is deprecated in v1.33+; use discovery.k8s.io/v1 EndpointSlice"}

#: in-tree kinds whose DELETE answers with the deleted object rather than a Status
RETURNS_DELETED_OBJECT = frozenset({("", "pods"), ("", "namespaces"), ("", "nodes"),
                                    ("", "services"), ("", "secrets"), ("", "configmaps")})


def types_from_crd(crd: dict[str, Any]) -> list[ResourceType]:
    """One ResourceType per served version of a CustomResourceDefinition."""
    spec = crd["spec"]
    names = spec["names"]
    out = []
    for ver in spec.get("versions", []):
        if not ver.get("served", True):
            continue
        subs = tuple(s for s in ("status",) if s in (ver.get("subresources") or {}))
        schema = (ver.get("schema") or {}).get("openAPIV3Schema")
        out.append(ResourceType(
            group=spec["group"], version=ver["name"], plural=names["plural"],
            kind=names["kind"], namespaced=spec.get("scope", "Namespaced") == "Namespaced",
            singular=names.get("singular", names["kind"].lower()),
            short_names=tuple(names.get("shortNames") or ()), subresources=subs,
            categories=tuple(names.get("categories") or ()), schema=schema,
            printer_columns=tuple(ver.get("additionalPrinterColumns") or ())))
    return out


def workload_api(version: str) -> tuple[ResourceType, ...]:
    """The native Workload API (KEP-4671) as one release serves it with feature gate
    GenericWorkload and the version in --runtime-config: 1.35's v1alpha1 has Workloads only,
    1.36's v1alpha2 and 1.37's v1alpha3/v1beta1 add PodGroups with a status."""
    workloads = _core("workloads", "Workload", group="scheduling.k8s.io", version=version)
    if version == "v1alpha1":
        return (workloads,)
    return (workloads, _core("podgroups", "PodGroup", sub=("status",), group="scheduling.k8s.io",
                             version=version))


class Registry:
    """Served resource types by (group, version, plural) and by group."""

    def __init__(self) -> None:
        self._types: dict[tuple[str, str, str], ResourceType] = {}
        self._crd_owned: dict[str, list[ResourceType]] = {}
        for rt in BUILTINS:
            self.add(rt)

    def add(self, rt: ResourceType) -> None:
        self._types[(rt.group, rt.version, rt.plural)] = rt

    def lookup(self, group: str, version: str, plural: str) -> ResourceType | None:
        return self._types.get((group, version, plural))

    def by_kind(self, api_version: str, kind: str) -> ResourceType | None:
        group, _, version = api_version.rpartition("/")
        for rt in self._types.values():
            if rt.group == group and rt.version == version and rt.kind == kind:
                return rt
        return None

    def set_crd(self, crd_name: str, types: list[ResourceType]) -> None:
        for old in self._crd_owned.pop(crd_name, []):
            self._types.pop((old.group, old.version, old.plural), None)
        for rt in types:
            self.add(rt)
        self._crd_owned[crd_name] = types

    def remove_crd(self, crd_name: str) -> list[ResourceType]:
        types = self._crd_owned.pop(crd_name, [])
        for rt in types:
            self._types.pop((rt.group, rt.version, rt.plural), None)
        return types

    def all(self) -> list[ResourceType]:
        return list(self._types.values())

    # --- discovery documents ------------------------------------------------------------------

    def group_versions(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for rt in self._types.values():
            if rt.group:
                versions = out.setdefault(rt.group, [])
                if rt.version not in versions:
                    versions.append(rt.version)
        return out

    def api_versions(self) -> dict[str, Any]:
        return {"kind": "APIVersions", "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0",
                                                "serverAddress": "127.0.0.1:6443"}]}

    def api_group(self, group: str) -> dict[str, Any] | None:
        versions = self.group_versions().get(group)
        if not versions:
            return None
        gvs = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
        return {"kind": "APIGroup", "apiVersion": "v1", "name": group, "versions": gvs,
                "preferredVersion": gvs[0]}

    def api_group_list(self) -> dict[str, Any]:
        groups = [self.api_group(g) for g in sorted(self.group_versions())]
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}

    def resource_list(self, group: str, version: str) -> dict[str, Any] | None:
        types = [rt for rt in self._types.values() if rt.group == group and rt.version == version]
        if not types:
            return None
        resources: list[dict[str, Any]] = []
        for rt in sorted(types, key=lambda t: t.plural):
            entry: dict[str, Any] = {"name": rt.plural, "singularName": rt.singular,
                                     "namespaced": rt.namespaced, "kind": rt.kind,
                                     "verbs": list(ALL_VERBS)}
            if rt.short_names:
                entry["shortNames"] = list(rt.short_names)
            if rt.categories:
                entry["categories"] = list(rt.categories)
            resources.append(entry)
            for sub in rt.subresources:
                verbs = ["create"] if sub == "binding" else list(SUB_VERBS)
                kind = "Binding" if sub == "binding" else rt.kind
                resources.append({"name": f"{rt.plural}/{sub}", "singularName": "",
                                  "namespaced": rt.namespaced, "kind": kind, "verbs": verbs})
        return {"kind": "APIResourceList", "apiVersion": "v1",
                "groupVersion": f"{group}/{version}" if group else version,
                "resources": resources}


    # --- OpenAPI v3: just enough for kubectl to use server-side field validation ------------

    def openapi_v3_root(self) -> dict[str, Any]:
        gvs = {("", "v1")} | {(rt.group, rt.version) for rt in self._types.values()}
        paths = {}
        for group, version in sorted(gvs):
            key = f"apis/{group}/{version}" if group else f"api/{version}"
            paths[key] = {"serverRelativeURL": f"/openapi/v3/{key}"}
        return {"paths": paths}

    def openapi_v3(self, group: str, version: str) -> dict[str, Any] | None:
        """Paths with their PATCH operation's GVK and query parameters (kubectl checks there
        that `fieldValidation` is supported); no schemas."""
        types = [rt for rt in self._types.values() if rt.group == group and rt.version == version]
        if not types:
            return None
        paths: dict[str, Any] = {}
        params = [{"name": n, "in": "query", "schema": {"type": "string"}}
                  for n in ("dryRun", "fieldManager", "fieldValidation", "force")]
        for rt in types:
            base = f"/apis/{group}/{version}" if group else f"/api/{version}"
            ns = "/namespaces/{namespace}" if rt.namespaced else ""
            gvk = {"group": group, "version": version, "kind": rt.kind}
            paths[f"{base}{ns}/{rt.plural}/{{name}}"] = {"patch": {
                "operationId": f"patch{rt.kind}", "parameters": params,
                "x-kubernetes-action": "patch", "x-kubernetes-group-version-kind": gvk}}
        return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.37.2"},
                "paths": paths, "components": {"schemas": {}}}
