"""A webhook called after Muster's puts the pod in its own gang (LeaderWorkerSet's Volcano
provider overwrites `scheduling.k8s.io/group-name`): the emulator calls `muster serve` first
(configuration `0-muster`, reinvocationPolicy IfNeeded, as the chart names it), then the other
controller's webhook, then Muster again. Muster stands aside on that pass: the pod keeps the
other gang and loses Muster's record, and the PodGroup Muster made on the first pass goes unless
a stored pod still joins it. A dry run deletes nothing."""

from __future__ import annotations

import asyncio
import base64
import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from admission_helpers import JOB, Tls, metric, mpijob_in, running

from e2e.probes import eventually
from webhook.admission.server import WebhookServer
from webhook.doubles.emulator import ApiServerEmulator
from webhook.doubles.webhooks import WebhookServers, admission_response
from webhook.keys import ANN_JOINED_GANG, ANN_POLICY, VOLCANO_GROUP_ANNOTATION, joined_gang
from webhook.kube import PODS, KubeApi
from webhook.policy.podgroup import MANAGED_BY

PODGROUPS = "podgroups.scheduling.volcano.sh"
#: the other controller's gang (LWS names it `<set>-<group>-<revision>`)
THEIRS = f"{JOB}-0-5d8f"
GROUP_KEY_PATH = "/metadata/annotations/" + VOLCANO_GROUP_ANNOTATION.replace("/", "~1")


@dataclass
class Env:
    tls: Tls
    policy_dir: Path
    api: ApiServerEmulator
    kubeconfig: Path
    shared: Path


@pytest.fixture
def env(tls: Tls, policy_dir: Path, apiserver: ApiServerEmulator, kubeconfig: Path,
        shared_dir: Path) -> Env:
    return Env(tls, policy_dir, apiserver, kubeconfig, shared_dir)


def _config(name: str, url: str, ca_pem: bytes, **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [{
            "name": f"{name}.pods.test", "admissionReviewVersions": ["v1"],
            "sideEffects": "NoneOnDryRun", "failurePolicy": "Fail", "timeoutSeconds": 5,
            "clientConfig": {"url": url, "caBundle": base64.b64encode(ca_pem).decode()},
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                       "resources": ["pods"]}], **extra}]}


def _their_gang(review: dict[str, Any]) -> dict[str, Any]:
    """The other controller's pod webhook: its group key, whatever was there (as LWS's
    InjectPodGroupMetadata does)."""
    ann = review["request"]["object"]["metadata"].get("annotations")
    patch = ([{"op": "add", "path": "/metadata/annotations", "value": {}}] if ann is None
             else [])
    return admission_response(review, patch=[
        *patch, {"op": "add", "path": GROUP_KEY_PATH, "value": THEIRS}])


async def _setup(tls: Tls, apiserver: ApiServerEmulator, srv: WebhookServer,
                 others: WebhookServers, *, theirs: bool) -> None:
    await apiserver.create("MutatingWebhookConfiguration", _config(
        "0-muster", f"{srv.url}/mutate/pods", tls.ca.cert_pem, reinvocationPolicy="IfNeeded"))
    if theirs:
        await _register_theirs(apiserver, others)


async def _register_theirs(apiserver: ApiServerEmulator, others: WebhookServers) -> None:
    hook = await others.start(_their_gang)
    config = _config("z-their-gang", "", b"")
    config["webhooks"][0]["clientConfig"] = hook.client_config()
    await apiserver.create("MutatingWebhookConfiguration", config)
    # the other controller's own PodGroup, which Muster never touches
    apiserver.seed({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
                    "metadata": {"name": THEIRS, "namespace": "team-a"},
                    "spec": {"minMember": 3}})


def _worker(shared_dir: Path, job: dict[str, Any], i: int) -> dict[str, Any]:
    body = json.loads((shared_dir / "fixtures" / "admission" / "pod-create-worker.json")
                      .read_text())
    pod: dict[str, Any] = copy.deepcopy(body["request"]["object"])
    pod["metadata"].pop("managedFields", None)
    pod["metadata"]["ownerReferences"][0]["uid"] = job["metadata"]["uid"]
    pod["metadata"]["name"] = f"{JOB}-worker-{i}"
    return pod


def _groups(apiserver: ApiServerEmulator) -> dict[str, bool]:
    """PodGroup name → made by Muster."""
    return {g["metadata"]["name"]: all((g["metadata"].get("labels") or {}).get(k) == v
                                       for k, v in MANAGED_BY.items())
            for g in apiserver.objects(PODGROUPS, "team-a")}


def _stood_aside_events(apiserver: ApiServerEmulator) -> list[dict[str, Any]]:
    return [e for e in apiserver.objects("events", "team-a") if e.get("reason") == "GangStoodAside"]


def _in_their_gang(pod: dict[str, Any]) -> None:
    ann = pod["metadata"]["annotations"]
    assert ann[VOLCANO_GROUP_ANNOTATION] == THEIRS
    assert ANN_JOINED_GANG not in ann, ann
    assert ann[ANN_POLICY] == "mpi-volcano"


async def test_pods_taken_into_another_gang_leave_no_podgroup_of_muster_s(
        env: Env, kube: KubeApi, tls_webhook: WebhookServers) -> None:
    tls, apiserver, shared_dir = env.tls, env.api, env.shared
    job = await mpijob_in(apiserver, shared_dir)
    async with running(tls, [env.policy_dir], kubeconfig=str(env.kubeconfig)) as srv:
        await eventually(srv.admitter.ready)
        await _setup(tls, apiserver, srv, tls_webhook, theirs=True)
        # the gang's pods arrive together, as a StatefulSet with Parallel pods makes them
        created = await asyncio.gather(*(kube.create(PODS, _worker(shared_dir, job, i), "team-a")
                                         for i in range(4)))
        for pod in created:
            _in_their_gang(pod)
        # each pod: Muster, the other webhook, Muster again
        calls = [c.reinvocation for c in apiserver.webhook_calls if "/mutate/pods" in c.url]
        assert sorted(calls) == [False] * 4 + [True] * 4
        assert _groups(apiserver) == {THEIRS: False}  # theirs, untouched; none of Muster's
        assert metric(srv, "muster_gang_interventions_total", reason="stood_aside") == 4
        created_by_muster = metric(srv, "muster_podgroup_writes_total", result="created")
        assert created_by_muster >= 1  # the first passes made it ...
        # ... and the second passes deleted it (made again by a later first pass: again)
        assert metric(srv, "muster_podgroup_writes_total", result="withdrawn") == \
            created_by_muster
        await eventually(lambda: _stood_aside_events(apiserver))
        (event,) = {e["involvedObject"]["uid"]: e for e in _stood_aside_events(apiserver)
                    }.values()
        assert event["involvedObject"]["kind"] == "MPIJob"
        assert f"gang '{THEIRS}'" in event["message"], event["message"]


async def test_a_podgroup_a_pod_still_joins_stays_and_a_dry_run_deletes_nothing(
        env: Env, kube: KubeApi, tls_webhook: WebhookServers) -> None:
    tls, apiserver, shared_dir = env.tls, env.api, env.shared
    job = await mpijob_in(apiserver, shared_dir)
    async with running(tls, [env.policy_dir], kubeconfig=str(env.kubeconfig)) as srv:
        await eventually(srv.admitter.ready)
        await _setup(tls, apiserver, srv, tls_webhook, theirs=False)
        # admitted before the other controller took the job's pods over: in Muster's gang
        first = await kube.create(PODS, _worker(shared_dir, job, 0), "team-a")
        assert first["metadata"]["annotations"][ANN_JOINED_GANG] == joined_gang("volcano", JOB)
        assert _groups(apiserver) == {JOB: True}
        await _register_theirs(apiserver, tls_webhook)

        _in_their_gang(await kube.create(PODS, _worker(shared_dir, job, 1), "team-a"))
        assert _groups(apiserver) == {JOB: True, THEIRS: False}  # worker-0 still joins it

        await kube.delete(PODS, first["metadata"]["name"], "team-a")
        _in_their_gang(await kube.create(PODS, _worker(shared_dir, job, 2), "team-a",
                                         dry_run=True))
        assert _groups(apiserver) == {JOB: True, THEIRS: False}  # a dry run: no side effect
        assert _stood_aside_events(apiserver) == []

        _in_their_gang(await kube.create(PODS, _worker(shared_dir, job, 2), "team-a"))
        assert _groups(apiserver) == {THEIRS: False}
        assert metric(srv, "muster_gang_interventions_total", reason="stood_aside") == 3
        assert metric(srv, "muster_podgroup_writes_total", result="withdrawn") == 1
        await eventually(lambda: _stood_aside_events(apiserver))
