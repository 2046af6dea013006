"""The whole path: pods created through the API (kubernetes-asyncio → emulator), the emulator
calling `muster serve` over HTTPS as kube-apiserver does (MutatingWebhookConfiguration with
caBundle, ?timeout=, failurePolicy, sideEffects NoneOnDryRun), patches applied to stored pods."""

from __future__ import annotations

import asyncio
import base64
import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from admission_helpers import Tls, running

from e2e.probes import eventually
from webhook.doubles.emulator import ApiServerEmulator
from webhook.keys import ANN_GPU_ASSIGNMENT, ANN_POLICY, ISTIO_INJECT, VOLCANO_GROUP_ANNOTATION
from webhook.kube import CONFIGMAPS, PODS, ApiError, KubeApi

JOB = "tensorflow-topo-4-vgg16"
FIXTURES = Path(__file__).resolve().parents[3] / "shared" / "fixtures"


def _configurations(url: str, ca_pem: bytes) -> list[dict[str, Any]]:
    bundle = base64.b64encode(ca_pem).decode()
    return [{
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "a-muster"},
        "webhooks": [{
            "name": "pods.muster.io", "admissionReviewVersions": ["v1"],
            "sideEffects": "NoneOnDryRun", "failurePolicy": "Ignore", "timeoutSeconds": 5,
            "reinvocationPolicy": "IfNeeded",
            "clientConfig": {"url": f"{url}/mutate/pods", "caBundle": bundle},
            "namespaceSelector": {"matchExpressions": [{
                "key": "kubernetes.io/metadata.name", "operator": "NotIn",
                "values": ["kube-system", "muster"]}]},
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                       "resources": ["pods"]}]}]}, {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration", "metadata": {"name": "a-muster"},
        "webhooks": [{
            "name": "policies.muster.io", "admissionReviewVersions": ["v1"],
            "sideEffects": "None", "failurePolicy": "Fail", "timeoutSeconds": 5,
            "clientConfig": {"url": f"{url}/validate/policies", "caBundle": bundle},
            "objectSelector": {"matchLabels": {"muster.io/policies": "true"}},
            "rules": [{"operations": ["CREATE", "UPDATE"], "apiGroups": [""],
                       "apiVersions": ["v1"], "resources": ["configmaps"]}]}]}]


def _pod(template: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    pod = copy.deepcopy(template)
    pod["metadata"].pop("managedFields", None)
    if name is not None:
        pod["metadata"]["name"] = name
    return pod


@pytest.mark.slow
async def test_gang_created_through_the_api(
        tls: Tls, policy_dir: Path, apiserver: ApiServerEmulator, kubeconfig: Path,
        kube: KubeApi) -> None:
    job = yaml.safe_load((FIXTURES / "jobs" / "mpijob-vgg16-4workers.yaml").read_text())
    job = await apiserver.create("mpijobs.kubeflow.org", job, namespace="team-a")
    worker = json.loads((FIXTURES / "admission" / "pod-create-worker.json")
                        .read_text())["request"]["object"]
    worker["metadata"]["ownerReferences"][0]["uid"] = job["metadata"]["uid"]
    async with running(tls, [policy_dir], kubeconfig=str(kubeconfig), namespace="muster") as srv:
        await eventually(srv.admitter.ready)
        for config in _configurations(srv.url, tls.ca.cert_pem):
            await apiserver.create(config["kind"], config)

        # server-side dry run: the pod comes back mutated, nothing is created
        dry = await kube.create(PODS, _pod(worker, f"{JOB}-worker-0"), "team-a", dry_run=True)
        assert dry["metadata"]["annotations"][VOLCANO_GROUP_ANNOTATION] == JOB
        assert apiserver.objects("podgroups.scheduling.volcano.sh", "team-a") == []

        # four workers at once; one of them tries to choose its own GPUs
        pods = [_pod(worker, f"{JOB}-worker-{i}") for i in range(4)]
        pods[3]["metadata"].setdefault("annotations", {})[ANN_GPU_ASSIGNMENT] = "{}"
        created = await asyncio.gather(*(kube.create(PODS, p, "team-a") for p in pods))
        for pod in created:
            assert pod["metadata"]["annotations"][VOLCANO_GROUP_ANNOTATION] == JOB
            assert pod["metadata"]["annotations"][ANN_POLICY] == "mpi-volcano"
            assert ANN_GPU_ASSIGNMENT not in pod["metadata"]["annotations"]
            assert pod["spec"]["schedulerName"] == "volcano"
        groups = apiserver.objects("podgroups.scheduling.volcano.sh", "team-a")
        assert [(g["metadata"]["name"], g["spec"]["minMember"]) for g in groups] == [(JOB, 5)]

        # every call carried the API server's deadline
        calls = [c for c in apiserver.webhook_calls if "/mutate/pods" in c.url]
        assert calls and all("timeout=5s" in c.url for c in calls)

        # a broken policies ConfigMap is refused with the loader's message
        with pytest.raises(ApiError) as info:
            await kube.create(CONFIGMAPS, {
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "muster-policies", "namespace": "team-a",
                             "labels": {"muster.io/policies": "true"}},
                "data": {"policy.yaml": "kind: SchedulingPolicy"}}, "team-a")
        assert "policy.yaml:1:" in info.value.message, info.value.message
        assert 'admission webhook "policies.muster.io" denied the request' in info.value.message

    # the webhook is gone: failurePolicy Ignore admits pods unchanged, nobody is blocked
    plain = await kube.create(PODS, {"apiVersion": "v1", "kind": "Pod",
                                     "metadata": {"name": "after", "namespace": "team-a"},
                                     "spec": {"containers": [{"name": "c", "image": "i"}]}},
                              "team-a")
    assert ISTIO_INJECT not in (plain["metadata"].get("labels") or {})
