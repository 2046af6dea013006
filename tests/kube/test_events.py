"""EventRecorder: core/v1 Events with involvedObject, aggregation of repeats, never raising."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from webhook.doubles.emulator import ApiServerEmulator
from webhook.kube import CONFIGMAPS, EVENTS, EventRecorder, KubeApi, make_api_client


async def test_emit_and_aggregate(kube: KubeApi, apiserver: ApiServerEmulator) -> None:
    cm = await kube.create(CONFIGMAPS, {"metadata": {"name": "muster-policies"}}, "team-a")
    recorder = EventRecorder(kube, "muster-webhook", "pod-1")
    for _ in range(3):
        await recorder.emit(cm, "Warning", "PolicyUpdateRefused", "bad policy: line 3")
    await recorder.emit(cm, "Normal", "PolicyReloaded", "2 policies")
    listed = await kube.list(EVENTS, "team-a",
                             field_selector="involvedObject.name=muster-policies,"
                                            "involvedObject.kind=ConfigMap")
    by_reason = {e["reason"]: e for e in listed["items"]}
    assert set(by_reason) == {"PolicyUpdateRefused", "PolicyReloaded"}
    refused = by_reason["PolicyUpdateRefused"]
    assert refused["count"] == 3 and refused["type"] == "Warning"
    assert refused["involvedObject"]["uid"] == cm["metadata"]["uid"]
    assert refused["source"] == {"component": "muster-webhook", "host": "pod-1"}
    assert refused["firstTimestamp"] <= refused["lastTimestamp"]


async def test_event_for_cluster_scoped_object_goes_to_default(kube: KubeApi) -> None:
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "uid": "u-1"}}
    await EventRecorder(kube, "muster-agent").emit(node, "Warning", "NvmlFailed", "no driver")
    listed = await kube.list(EVENTS, "default", field_selector="involvedObject.kind=Node")
    assert [e["involvedObject"]["name"] for e in listed["items"]] == ["n1"]


async def test_emit_never_raises(tmp_path: Path) -> None:
    api = ApiServerEmulator()
    await api.start()
    client = await make_api_client(str(api.write_kubeconfig(tmp_path / "kc")))
    await api.stop()  # the API server is gone: the event is logged, not raised
    try:
        cm = {"apiVersion": "v1", "kind": "ConfigMap",
              "metadata": {"name": "c", "namespace": "x"}}
        await EventRecorder(KubeApi(client), "muster-webhook").emit(cm, "Normal", "R", "m")
    finally:
        await client.close()


async def test_an_event_named_once_is_recorded_once_by_every_replica(
        kube: KubeApi, caplog: pytest.LogCaptureFixture) -> None:
    """Two webhook replicas see pods of one job: the Event named by what it is about is
    created by the first, and the second's create is a quiet conflict."""
    job = {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob",
           "metadata": {"name": "j", "namespace": "team-a", "uid": "u-j"}}
    replicas = [EventRecorder(kube, "muster-webhook", f"pod-{i}") for i in range(2)]
    with caplog.at_level(logging.WARNING):
        for recorder in replicas:
            await recorder.emit(job, "Normal", "PolicyAudit", "would set a PodGroup",
                                once_as="muster-audit.0123")
    listed = await kube.list(EVENTS, "team-a", field_selector="involvedObject.name=j")
    assert [e["metadata"]["name"] for e in listed["items"]] == ["muster-audit.0123"]
    assert listed["items"][0]["count"] == 1
    assert not [r for r in caplog.records if r.getMessage() == "event not recorded"]
