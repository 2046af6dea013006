"""Running the training jobs of the multi-node tier as a user does: submitted, watched to
their end (failing at once on a pod that cannot run), their pods read by role."""

from __future__ import annotations

from typing import Any

from e2e import training
from e2e.probes import eventually, pods_of
from webhook.kube import PODS, ApiError, KubeApi, Resource
from webhook.policy.operators import JOB_ROLE_LABEL

#: a pod in one of these states will not run by itself: its job fails at once, saying why
HOPELESS = {"UnexpectedAdmissionError", "ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull"}


def live(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


async def running(kube: KubeApi, ns: str, selector: str, count: int, within: float = 300
                  ) -> list[dict[str, Any]]:
    """The `count` live pods of `selector`, once every one runs."""
    async def up() -> list[dict[str, Any]] | None:
        pods = live((await kube.list(PODS, namespace=ns, label_selector=selector))["items"])
        return pods if len(pods) == count and all(
            p["status"].get("phase") == "Running" for p in pods) else None
    found: list[dict[str, Any]] = await eventually(up, within=within, interval=1,
                                                   what=f"{count} pods of {selector} running")
    return found


def waiting_reasons(pod: dict[str, Any]) -> list[str]:
    status = pod.get("status") or {}
    return [status.get("reason", "")] + [
        (c.get("state") or {}).get("waiting", {}).get("reason", "")
        for c in status.get("initContainerStatuses", []) + status.get("containerStatuses", [])]


async def finished(kube: KubeApi, resource: Resource, name: str, ns: str,
                   within: float = 600) -> str:
    """The job's end: "Succeeded" or "Failed"."""
    async def ended() -> str | None:
        stuck = [(p["metadata"]["name"], why) for p in await pods_of(kube, ns, name)
                 for why in waiting_reasons(p) if why in HOPELESS]
        assert not stuck, f"a pod of {ns}/{name} cannot run: {stuck}"
        job = await kube.get(resource, name, namespace=ns)
        for cond in (job.get("status") or {}).get("conditions") or []:
            if cond.get("type") in ("Succeeded", "Failed") and cond.get("status") == "True":
                return str(cond["type"])
        return None
    found: str = await eventually(ended, within=within, interval=1,
                                  what=f"{resource.kind} {ns}/{name} to finish")
    return found


def role(pods: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return sorted((p for p in pods if p["metadata"]["labels"].get(JOB_ROLE_LABEL) == name),
                  key=lambda p: p["metadata"]["name"])


async def made(kube: KubeApi, resource: Resource, name: str, ns: str) -> dict[str, Any]:
    """The object once it exists (the webhook makes a PodGroup before it answers the first pod)."""
    async def get() -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = await kube.get(resource, name, namespace=ns)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        return found
    got: dict[str, Any] = await eventually(get, within=120, interval=0.5,
                                           what=f"{resource.kind} {ns}/{name}")
    return got


#: the ServiceAccount the PyTorchJob's pods run as: they may patch their own namespace's pods
TRAINER = "trainer"
RBAC = (Resource("", "v1", "serviceaccounts", True, "ServiceAccount"),
        Resource("rbac.authorization.k8s.io", "v1", "roles", True, "Role"),
        Resource("rbac.authorization.k8s.io", "v1", "rolebindings", True, "RoleBinding"))


async def ensure_trainer(kube: KubeApi, ns: str) -> None:
    """`TRAINER` in `ns`, with the Role that lets its pods say when they checkpointed."""
    for resource, obj in zip(RBAC, training.checkpoint_rbac(ns, TRAINER), strict=True):
        try:
            await kube.create(resource, obj, namespace=ns)
        except ApiError as exc:
            if not exc.conflict:
                raise
