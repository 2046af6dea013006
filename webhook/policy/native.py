"""Gang backend `kubernetes`: the native Workload API (KEP-4671) objects and the pod's reference.

The API changed shape between releases (read from `k8s.io/api` of each release):

- 1.35, `scheduling.k8s.io/v1alpha1`: a Workload lists its pod groups (`spec.podGroups[]`,
  each `{name, policy: {gang: {minCount}}}`); a pod joins with `spec.workloadRef
  {name, podGroup}`.
- 1.36, `v1alpha2` (KEP-5832): the Workload holds `spec.podGroupTemplates[]` (`{name,
  schedulingPolicy}`); a PodGroup object of its own carries `spec.schedulingPolicy` and
  `spec.podGroupTemplateRef.workload {workloadName, podGroupTemplateName}`; a pod joins with
  `spec.schedulingGroup.podGroupName`.
- 1.37, `v1beta1` (and `v1alpha3`): as 1.36, the PodGroup's reference renamed
  `spec.workloadRef {workloadName, templateName}`.

kube-scheduler gangs a PodGroup's pods (plugin GangScheduling, feature gate GenericWorkload):
none is bound until `minCount` of them fit. The Workload and the PodGroup are named after the
job, owned by it like the other backends' PodGroups, with one template, `TEMPLATE`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from webhook.policy.decision import Decision, PodGroupSpec
from webhook.policy.podview import freeze

GROUP = "scheduling.k8s.io"
#: the versions whose shape we know, the one to prefer first
VERSIONS = ("v1beta1", "v1alpha3", "v1alpha2", "v1alpha1")
APIS = tuple(f"{GROUP}/{v}" for v in VERSIONS)
#: the shape `muster policy` shows and admission starts from (the newest)
DEFAULT_API = f"{GROUP}/{VERSIONS[0]}"
#: the Workload's one pod-group template (a DNS label)
TEMPLATE = "members"
MANAGED_BY = {"app.kubernetes.io/managed-by": "muster"}


def pick_api(served: Mapping[str, Iterable[str]]) -> str | None:
    """The apiVersion to use, from the `scheduling.k8s.io` versions a cluster serves (version ->
    its resources' plurals, from discovery), or None when it serves no Workload shape we know
    (v1alpha1 also holds the long-gone PriorityClass, so the resources are checked)."""
    for version in VERSIONS:
        needs = {"workloads", "podgroups"} if version != "v1alpha1" else {"workloads"}
        if needs <= set(served.get(version, ())):
            return f"{GROUP}/{version}"
    return None


def has_podgroup_object(api: str) -> bool:
    """Whether the shape has a PodGroup object (1.36+) besides the Workload."""
    return not api.endswith("/v1alpha1")


def pod_reference(spec: PodGroupSpec) -> tuple[str, dict[str, str]]:
    """(the pod's spec field, its value) that make the pod a member of the gang."""
    return reference(spec.name, api_of(spec))


def reference(name: str, api: str) -> tuple[str, dict[str, str]]:
    if has_podgroup_object(api):
        return "schedulingGroup", {"podGroupName": name}
    return "workloadRef", {"name": name, "podGroup": TEMPLATE}


def frozen_reference(name: str, api: str) -> tuple[str, Any]:
    """`reference` as `PodShape.native_ref` holds a pod's."""
    field, value = reference(name, api)
    return field, freeze(value)


def objects(spec: PodGroupSpec) -> list[dict[str, Any]]:
    """The objects to create, in order: the Workload, then (1.36+) its PodGroup."""
    api = api_of(spec)
    gang = {"gang": {"minCount": spec.min_member}}
    if has_podgroup_object(api):
        workload_spec: dict[str, Any] = {"podGroupTemplates": [
            {"name": TEMPLATE, "schedulingPolicy": gang}]}
    else:
        workload_spec = {"podGroups": [{"name": TEMPLATE, "policy": gang}]}
    if spec.owner is not None:
        group, _, _ = spec.owner.api_version.rpartition("/")
        ref = {"kind": spec.owner.kind, "name": spec.owner.name}
        workload_spec["controllerRef"] = {"apiGroup": group, **ref} if group else ref
    out = [_object(spec, api, "Workload", workload_spec)]
    if has_podgroup_object(api):
        if api.endswith("/v1alpha2"):
            link: dict[str, Any] = {"podGroupTemplateRef": {"workload": {
                "workloadName": spec.name, "podGroupTemplateName": TEMPLATE}}}
        else:
            link = {"workloadRef": {"workloadName": spec.name, "templateName": TEMPLATE}}
        out.append(_object(spec, api, "PodGroup", {**link, "schedulingPolicy": gang}))
    return out


def api_of(spec: PodGroupSpec) -> str:
    return spec.api_version or DEFAULT_API


def _object(spec: PodGroupSpec, api: str, kind: str, body: dict[str, Any]) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": spec.name, "namespace": spec.namespace,
                                "labels": dict(MANAGED_BY)}
    if spec.owner is not None:
        metadata["ownerReferences"] = [spec.owner.as_owner_reference()]
    return {"apiVersion": api, "kind": kind, "metadata": metadata, "spec": body}


@dataclass(frozen=True, slots=True)
class NativeVerdict:
    """What admission does with a native gang, given what the cluster serves."""

    #: the apiVersion the gang's objects and the pod's reference take; None: none is served
    api: str | None
    #: why the gang cannot be made (empty when `api` is set)
    reason: str = ""
    #: the pod is refused (gang.unavailableApi Refuse) rather than admitted without its gang
    refuse: bool = False


def check_served(spec: PodGroupSpec, served: Mapping[str, Iterable[str]]) -> NativeVerdict:
    """The verdict for a native gang; `served` as `pick_api` takes it."""
    api = pick_api(served)
    if api is not None:
        return NativeVerdict(api)
    problem = (f"this cluster serves no Workload API ({GROUP} {', '.join(VERSIONS)}: it needs "
               "feature gate GenericWorkload and the version in --runtime-config on the API "
               "server, and the gate on kube-scheduler)")
    if spec.unavailable_api == "WithoutGang":
        return NativeVerdict(None, f"pod admitted without gang {spec.name} (policy "
                                   f"gang.unavailableApi WithoutGang): {problem}")
    return NativeVerdict(None, f"gang {spec.name} (backend kubernetes): {problem}; the pod is "
                               "refused until the API is served, or the policy sets "
                               "gang.unavailableApi: WithoutGang", refuse=True)


def with_api(decision: Decision, api: str) -> Decision:
    """The decision with its native gang in the shape of `api`."""
    assert decision.pod_group is not None
    return dataclasses.replace(decision, pod_group=dataclasses.replace(
        decision.pod_group, api_version=api))
