"""What kube-apiserver adds to objects before admission webhooks see them (defaulting and the
built-in admission plugins ServiceAccount, DefaultTolerationSeconds, Priority) and after
(pod status), so that webhooks receive the shapes of the real captured requests."""

from __future__ import annotations

import datetime as dt
import random
from typing import Any

NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # apimachinery's utilrand alphabet

_DEFAULT_TOLERATIONS = (
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
     "tolerationSeconds": 300},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
     "tolerationSeconds": 300},
)


def random_suffix(n: int = 5) -> str:
    return "".join(random.choice(NAME_CHARS) for _ in range(n))


def _pull_policy(image: str) -> str:
    tag = image.rsplit("/", 1)[-1]
    if "@" in tag:
        return "IfNotPresent"
    return "Always" if ":" not in tag or tag.endswith(":latest") else "IfNotPresent"


def _default_container(c: dict[str, Any], mount: dict[str, Any] | None) -> None:
    c.setdefault("resources", {})
    res = c["resources"]
    if res.get("limits"):
        # requests default to limits where unset (core/v1 SetDefaults_Container)
        requests = res.setdefault("requests", {})
        for k, v in res["limits"].items():
            requests.setdefault(k, v)
    c.setdefault("terminationMessagePath", "/dev/termination-log")
    c.setdefault("terminationMessagePolicy", "File")
    c.setdefault("imagePullPolicy", _pull_policy(c.get("image", "")))
    if mount is not None and not any(m.get("mountPath") == mount["mountPath"]
                                     for m in c.get("volumeMounts") or []):
        c.setdefault("volumeMounts", []).append(dict(mount))


def default_pod(pod: dict[str, Any]) -> None:
    """In place, on a pod being created."""
    spec = pod.setdefault("spec", {})
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("securityContext", {})
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("enableServiceLinks", True)
    spec.setdefault("serviceAccountName", spec.get("serviceAccount") or "default")
    spec["serviceAccount"] = spec["serviceAccountName"]
    if "priority" not in spec and not spec.get("priorityClassName"):
        spec["priority"] = 0
    spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
    tolerations = spec.setdefault("tolerations", [])
    for tol in _DEFAULT_TOLERATIONS:
        if not any(t.get("key") == tol["key"] for t in tolerations):
            tolerations.append(dict(tol))
    mount = None
    if spec.get("automountServiceAccountToken", True):
        volume_name = f"kube-api-access-{random_suffix()}"
        spec.setdefault("volumes", []).append({"name": volume_name, "projected": {
            "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt",
                               "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {
                    "apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}],
            "defaultMode": 420}})
        mount = {"name": volume_name, "readOnly": True,
                 "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}
    for c in spec.get("initContainers") or []:
        _default_container(c, mount)
    for c in spec.get("containers") or []:
        _default_container(c, mount)
    pod.setdefault("status", {})


def qos_class(pod: dict[str, Any]) -> str:
    """Guaranteed / Burstable / BestEffort from cpu and memory requests and limits."""
    containers = (pod.get("spec") or {}).get("containers") or []
    requests: list[dict[str, Any]] = []
    limits: list[dict[str, Any]] = []
    for c in containers:
        res = c.get("resources") or {}
        requests.append({k: v for k, v in (res.get("requests") or {}).items()
                         if k in ("cpu", "memory")})
        limits.append({k: v for k, v in (res.get("limits") or {}).items()
                       if k in ("cpu", "memory")})
    if not any(requests) and not any(limits):
        return "BestEffort"
    if all(len(lim) == 2 and req == lim for req, lim in zip(requests, limits, strict=True)):
        return "Guaranteed"
    return "Burstable"


def pod_status_on_create(pod: dict[str, Any]) -> None:
    status = pod.setdefault("status", {})
    status.setdefault("phase", "Pending")
    status["qosClass"] = qos_class(pod)
    if (pod.get("spec") or {}).get("schedulingGates"):
        # kube-apiserver's pod strategy marks a gated pod, for users and autoscalers
        status["conditions"] = [{
            "type": "PodScheduled", "status": "False", "reason": "SchedulingGated",
            "message": "Scheduling is blocked due to non-empty scheduling gates",
            "lastProbeTime": None, "lastTransitionTime": dt.datetime.now(dt.UTC).strftime(
                "%Y-%m-%dT%H:%M:%SZ")}]


def default_namespace(ns: dict[str, Any]) -> None:
    meta = ns["metadata"]
    if meta.get("name"):
        meta.setdefault("labels", {})["kubernetes.io/metadata.name"] = meta["name"]
    ns.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
    ns.setdefault("status", {}).setdefault("phase", "Active")


def generated_name(prefix: str) -> str:
    return prefix[:58] + random_suffix()

