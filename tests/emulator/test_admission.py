"""Admission webhooks called as kube-apiserver calls them: real HTTPS with the caBundle,
AdmissionReview shapes as in the captured requests, patches, denials, failure policies,
dry run, selectors, ordering and reinvocation."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from webhook.doubles.emulator import ApiServerEmulator
from webhook.doubles.webhooks import (
    TlsWebhook,
    WebhookServers,
    admission_response,
    make_certs,
)
from webhook.kube import CONFIGMAPS, MUTATING_WEBHOOKS, NAMESPACES, PODS, ApiError, KubeApi

FIXTURES = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "admission"


def pod(name: str | None = None, generate: str | None = None,
        labels: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"labels": labels or {}}
    if name:
        meta["name"] = name
    if generate:
        meta["generateName"] = generate
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"containers": [
        {"name": "main", "image": "busybox:1.36"}]}}


def webhook_config(name: str, hooks: list[dict[str, Any]],
                   kind: str = "MutatingWebhookConfiguration") -> dict[str, Any]:
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
            "metadata": {"name": name}, "webhooks": hooks}


def hook(name: str, client_config: dict[str, Any], **extra: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": name, "clientConfig": client_config, "admissionReviewVersions": ["v1"],
        "sideEffects": "None", "failurePolicy": "Fail",
        "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                   "resources": ["pods"]}]}
    entry.update(extra)
    return entry


def add_label(review: dict[str, Any]) -> dict[str, Any]:
    return admission_response(review, patch=[
        {"op": "add", "path": "/metadata/labels/muster.io~1seen", "value": "yes"}],
        warnings=["labelled by test"])


async def test_mutating_webhook_over_https_patches_and_warns(
        apiserver: ApiServerEmulator, tls_webhook: WebhookServers) -> None:
    server = await tls_webhook.start(add_label)
    apiserver.seed(webhook_config("muster", [hook("pods.muster.io", server.client_config(),
                                                  timeoutSeconds=5)]))
    async with aiohttp.ClientSession() as http, http.post(
            f"{apiserver.url}/api/v1/namespaces/team-a/pods",
            json=pod(generate="launcher-")) as resp:
        assert resp.status == 201
        created = await resp.json()
        assert resp.headers.getall("Warning") == ['299 - "labelled by test"']
    assert created["metadata"]["labels"] == {"muster.io/seen": "yes"}
    assert apiserver.get("pods", created["metadata"]["name"], "team-a") is not None
    assert server.queries == [{"timeout": "5s"}]
    assert server.headers[0]["User-Agent"] == "kube-apiserver-admission"
    request = server.reviews[0]["request"]
    assert "name" not in request  # generateName: no name yet, as in the captured request
    assert request["namespace"] == "team-a" and request["operation"] == "CREATE"
    assert request["object"]["metadata"]["creationTimestamp"] is None
    assert request["options"] == {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}
    call = apiserver.webhook_calls[0]
    assert (call.webhook, call.error) == ("pods.muster.io", None)
    assert call.request == server.reviews[0]  # recorded exactly as sent
    assert call.response is not None and call.response["response"]["allowed"] is True


async def test_review_has_the_shape_of_the_captured_request(
        apiserver: ApiServerEmulator, tls_webhook: WebhookServers) -> None:
    captured = json.loads((FIXTURES / "pod-create-launcher-generatename.json").read_text())
    server = await tls_webhook.start(admission_response)
    apiserver.seed(webhook_config("muster", [hook("pods.muster.io", server.client_config())]))
    sent = dict(captured["request"]["object"])
    sent["spec"] = {"containers": [{k: v for k, v in c.items() if k in (
        "name", "image", "command", "resources")} for c in sent["spec"]["containers"]],
        "restartPolicy": "Never"}
    sent["metadata"] = {k: v for k, v in sent["metadata"].items() if k != "managedFields"}
    await apiserver.create("pods", sent, "team-a")
    ours = server.reviews[0]["request"]
    real = captured["request"]
    assert set(ours) == set(real)
    for key in ("kind", "resource", "requestKind", "requestResource", "namespace",
                "operation", "userInfo", "dryRun", "oldObject"):
        assert ours[key] == real[key], key
    # defaulting and built-in admission plugins as in the real request
    want_spec = {k: v for k, v in real["object"]["spec"].items() if k != "volumes"}
    got_spec = {k: v for k, v in ours["object"]["spec"].items() if k != "volumes"}
    for c in (*want_spec["containers"], *got_spec["containers"]):
        c.pop("volumeMounts")
    assert got_spec == want_spec
    assert ours["object"]["spec"]["volumes"][0]["name"].startswith("kube-api-access-")
    assert ours["object"]["status"] == {}
    # the record keeps the object as sent, not as it was stored afterwards
    recorded = apiserver.webhook_calls[0].request["request"]["object"]["metadata"]
    assert recorded["creationTimestamp"] is None and "uid" not in recorded


async def test_denial_carries_the_webhook_message(apiserver: ApiServerEmulator,
                                                 tls_webhook: WebhookServers,
                                                 kube: KubeApi) -> None:
    server = await tls_webhook.start(lambda r: admission_response(
        r, allowed=False, message="nobody picks their own GPUs", code=403))
    apiserver.seed(webhook_config("muster", [hook("pods.muster.io", server.client_config())]))
    with pytest.raises(ApiError) as err:
        await kube.create(PODS, pod("p"), "team-a")
    assert err.value.status == 403
    assert err.value.message == ('admission webhook "pods.muster.io" denied the request: '
                                 "nobody picks their own GPUs")
    assert apiserver.get("pods", "p", "team-a") is None


async def test_failure_policy_when_the_webhook_is_down(apiserver: ApiServerEmulator,
                                                      kube: KubeApi) -> None:
    dead = {"url": "https://127.0.0.1:1/mutate"}
    apiserver.seed(webhook_config("a", [hook("ignore.muster.io", dead,
                                             failurePolicy="Ignore")]))
    await kube.create(PODS, pod("fails-open"), "team-a")  # Ignore: created all the same
    apiserver.seed(webhook_config("b", [hook("fail.muster.io", dead)]))
    with pytest.raises(ApiError) as err:
        await kube.create(PODS, pod("fails-closed"), "team-a")
    assert (err.value.status, err.value.reason) == (500, "InternalError")
    assert err.value.message.startswith(
        'Internal error occurred: failed calling webhook "fail.muster.io": failed to call '
        'webhook: Post "https://127.0.0.1:1/mutate?timeout=10s"')


async def test_timeout_seconds_is_honoured(apiserver: ApiServerEmulator,
                                           tls_webhook: WebhookServers, kube: KubeApi) -> None:
    async def slow(review: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(3)
        return admission_response(review)

    server = await tls_webhook.start(slow)
    apiserver.seed(webhook_config("muster", [hook("slow.muster.io", server.client_config(),
                                                  timeoutSeconds=1)]))
    with pytest.raises(ApiError) as err:
        await kube.create(PODS, pod("p"), "team-a")
    assert "context deadline exceeded" in err.value.message
    assert apiserver.webhook_calls[0].duration_s < 2


async def test_ca_bundle_is_verified(apiserver: ApiServerEmulator, tls_webhook: WebhookServers,
                                     kube: KubeApi) -> None:
    server = await tls_webhook.start(admission_response)
    stranger = make_certs(["localhost"]).ca_bundle  # a valid CA, but not the server's issuer
    apiserver.seed(webhook_config("muster", [hook("tls.muster.io", {
        "url": server.url, "caBundle": stranger})]))
    with pytest.raises(ApiError) as err:
        await kube.create(PODS, pod("p"), "team-a")
    assert err.value.status == 500 and "CERTIFICATE_VERIFY_FAILED" in err.value.message
    assert server.reviews == []


async def test_service_reference_uses_the_service_dns_name(
        apiserver: ApiServerEmulator, tls_webhook: WebhookServers, kube: KubeApi) -> None:
    server = await tls_webhook.start(add_label, path="/mutate/pods")
    apiserver.service_hosts[("muster-system", "muster-webhook")] = f"127.0.0.1:{server.port}"
    svc = {"service": {"namespace": "muster-system", "name": "muster-webhook",
                       "path": "/mutate/pods", "port": 443}, "caBundle": server.ca_bundle}
    apiserver.seed(webhook_config("muster", [hook("pods.muster.io", svc)]))
    created = await kube.create(PODS, pod("p"), "team-a")
    assert created["metadata"]["labels"]["muster.io/seen"] == "yes"
    # a service whose certificate does not carry its DNS name is refused
    apiserver.service_hosts[("muster-system", "elsewhere")] = f"127.0.0.1:{server.port}"
    svc2 = {"service": {"namespace": "muster-system", "name": "elsewhere",
                        "path": "/mutate/pods"}, "caBundle": server.ca_bundle}
    apiserver.seed(webhook_config("zz", [hook("other.muster.io", svc2)]))
    with pytest.raises(ApiError) as err:
        await kube.create(PODS, pod("q"), "team-a")
    assert err.value.status == 500 and "other.muster.io" in err.value.message


async def test_dry_run_and_side_effects(apiserver: ApiServerEmulator,
                                        tls_webhook: WebhookServers, kube: KubeApi) -> None:
    server = await tls_webhook.start(add_label)
    apiserver.seed(webhook_config("muster", [hook("pods.muster.io", server.client_config())]))
    dry = await kube.create(PODS, pod("p"), "team-a", dry_run=True)
    assert dry["metadata"]["labels"]["muster.io/seen"] == "yes"
    assert apiserver.get("pods", "p", "team-a") is None
    request = server.reviews[0]["request"]
    assert request["dryRun"] is True and request["options"]["dryRun"] == ["All"]
    apiserver.seed(webhook_config("muster", [hook("pods.muster.io", server.client_config(),
                                                  sideEffects="Some")]))
    with pytest.raises(ApiError) as err:
        await kube.create(PODS, pod("p"), "team-a", dry_run=True)
    assert (err.value.status, err.value.message) == (
        400, 'admission webhook "pods.muster.io" does not support dry run')
    assert len(server.reviews) == 1


async def test_selectors_and_rules(apiserver: ApiServerEmulator, tls_webhook: WebhookServers,
                                   kube: KubeApi) -> None:
    server = await tls_webhook.start(add_label)
    apiserver.seed(webhook_config("muster", [hook(
        "pods.muster.io", server.client_config(),
        namespaceSelector={"matchExpressions": [{"key": "kubernetes.io/metadata.name",
                                                 "operator": "In", "values": ["team-a"]}]},
        objectSelector={"matchExpressions": [{"key": "skip", "operator": "DoesNotExist"}]})]))
    await kube.create(NAMESPACES, {"metadata": {"name": "team-b"}})
    await kube.create(PODS, pod("other-ns"), "team-b")
    await kube.create(PODS, pod("skipped", labels={"skip": "1"}), "team-a")
    await kube.create(CONFIGMAPS, {"metadata": {"name": "not-a-pod"}}, "team-a")
    assert server.reviews == []
    await kube.create(PODS, pod("matched"), "team-a")
    assert [r["request"]["name"] for r in server.reviews] == ["matched"]


async def test_order_reinvocation_and_validation(apiserver: ApiServerEmulator,
                                                 tls_webhook: WebhookServers,
                                                 kube: KubeApi) -> None:
    order: list[str] = []

    def first(review: dict[str, Any]) -> dict[str, Any]:
        order.append("a-first")
        labels = review["request"]["object"]["metadata"].get("labels") or {}
        if "second" in labels:
            return admission_response(review)
        return admission_response(review, patch=[
            {"op": "add", "path": "/metadata/labels/first", "value": "1"}])

    def second(review: dict[str, Any]) -> dict[str, Any]:
        order.append("b-second")
        return admission_response(review, patch=[
            {"op": "add", "path": "/metadata/labels/second", "value": "1"}])

    validated: list[dict[str, Any]] = []

    def validate(review: dict[str, Any]) -> dict[str, Any]:
        validated.append(review["request"]["object"])
        return admission_response(review)

    s1: TlsWebhook = await tls_webhook.start(first)
    s2 = await tls_webhook.start(second)
    s3 = await tls_webhook.start(validate, path="/validate")
    apiserver.seed(webhook_config("b-config", [hook("second.muster.io", s2.client_config())]))
    apiserver.seed(webhook_config("a-config", [hook("first.muster.io", s1.client_config(),
                                                    reinvocationPolicy="IfNeeded")]))
    apiserver.seed(webhook_config("v", [hook("v.muster.io", s3.client_config())],
                                  kind="ValidatingWebhookConfiguration"))
    created = await kube.create(PODS, pod(generate="w-"), "team-a")
    # configurations in name order, then the IfNeeded webhook once more after a later change
    assert order == ["a-first", "b-second", "a-first"]
    assert [c.reinvocation for c in apiserver.webhook_calls[:3]] == [False, False, True]
    assert created["metadata"]["labels"] == {"first": "1", "second": "1"}
    # validating webhooks see the final object, with its generated name
    assert validated[0]["metadata"]["labels"] == {"first": "1", "second": "1"}
    assert validated[0]["metadata"]["name"] == created["metadata"]["name"]


async def test_update_and_delete_reviews_carry_old_object(
        apiserver: ApiServerEmulator, tls_webhook: WebhookServers, kube: KubeApi) -> None:
    server = await tls_webhook.start(admission_response)
    apiserver.seed(webhook_config("muster", [hook(
        "cm.muster.io", server.client_config(),
        rules=[{"operations": ["UPDATE", "DELETE"], "apiGroups": [""], "apiVersions": ["v1"],
                "resources": ["configmaps"], "scope": "Namespaced"}])]))
    await kube.create(CONFIGMAPS, {"metadata": {"name": "c"}, "data": {"a": "1"}}, "team-a")
    await kube.patch(CONFIGMAPS, "c", {"data": {"a": "2"}}, "team-a")
    await kube.delete(CONFIGMAPS, "c", "team-a")
    update, delete = (r["request"] for r in server.reviews)
    assert update["operation"] == "UPDATE" and update["oldObject"]["data"] == {"a": "1"}
    assert update["object"]["data"] == {"a": "2"}
    assert update["options"]["kind"] == "UpdateOptions"
    assert delete["operation"] == "DELETE" and delete["object"] is None
    assert delete["oldObject"]["data"] == {"a": "2"}
    assert delete["options"]["kind"] == "DeleteOptions"


async def test_binding_subresource_rule(apiserver: ApiServerEmulator,
                                        tls_webhook: WebhookServers, kube: KubeApi) -> None:
    server = await tls_webhook.start(admission_response)
    apiserver.seed(webhook_config("muster", [hook(
        "bind.muster.io", server.client_config(),
        rules=[{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                "resources": ["pods/binding"]}])]))
    await kube.create(PODS, pod("p"), "team-a")
    assert server.reviews == []  # pods/binding rule does not match pods
    await kube.bind("team-a", "p", "n1")
    request = server.reviews[0]["request"]
    assert request["kind"]["kind"] == "Binding" and request["subResource"] == "binding"
    assert request["object"]["target"]["name"] == "n1"


async def test_webhook_configurations_are_validated(kube: KubeApi) -> None:
    bad = webhook_config("broken", [{
        "name": "short", "clientConfig": {"url": "http://127.0.0.1:1/x"},
        "admissionReviewVersions": ["v2"], "timeoutSeconds": 60,
        "rules": []}])
    with pytest.raises(ApiError) as err:
        await kube.create(MUTATING_WEBHOOKS, bad)
    assert err.value.status == 422
    fields = [c["field"] for c in err.value.body["details"]["causes"]]
    assert fields == ["webhooks[0].name", "webhooks[0].sideEffects",
                      "webhooks[0].admissionReviewVersions", "webhooks[0].timeoutSeconds",
                      "webhooks[0].clientConfig.url"]
    good = webhook_config("fine", [hook("pods.muster.io", {"url": "https://127.0.0.1:1/m"})])
    created = await kube.create(MUTATING_WEBHOOKS, good)
    assert created["metadata"]["generation"] == 1


async def test_concurrent_writes_while_webhooks_run(apiserver: ApiServerEmulator,
                                                   tls_webhook: WebhookServers,
                                                   kube: KubeApi) -> None:
    async def slow(review: dict[str, Any]) -> dict[str, Any]:
        data = review["request"]["object"].get("data") or {}
        await asyncio.sleep(0.3 if "put" in data else 0.05)
        return admission_response(review)

    server = await tls_webhook.start(slow)
    apiserver.seed(webhook_config("muster", [hook(
        "cm.muster.io", server.client_config(),
        rules=[{"operations": ["CREATE", "UPDATE"], "apiGroups": [""], "apiVersions": ["v1"],
                "resources": ["configmaps"]}])]))
    # 20 creates of one name: exactly one wins, the others get AlreadyExists
    results = await asyncio.gather(*(kube.create(CONFIGMAPS, {
        "metadata": {"name": "one"}, "data": {"i": str(i)}}, "team-a") for i in range(20)),
        return_exceptions=True)
    errors = [r for r in results if isinstance(r, ApiError)]
    assert len(errors) == 19 and {e.reason for e in errors} == {"AlreadyExists"}
    # merge patches racing through admission are retried on the new state: none is lost
    await asyncio.gather(*(kube.patch(CONFIGMAPS, "one", {"data": {f"k{i}": "v"}}, "team-a")
                           for i in range(5)))
    data = (await kube.get(CONFIGMAPS, "one", "team-a"))["data"]
    assert {f"k{i}" for i in range(5)} <= set(data)
    # a PUT pinned to a resourceVersion that changes while its webhook runs is a Conflict
    current = await kube.get(CONFIGMAPS, "one", "team-a")
    put, patched = await asyncio.gather(
        kube.replace(CONFIGMAPS, "one", {**current, "data": {"put": "1"}}, "team-a"),
        kube.patch(CONFIGMAPS, "one", {"data": {"patched": "1"}}, "team-a"),
        return_exceptions=True)
    assert isinstance(put, ApiError) and put.reason == "Conflict"
    assert isinstance(patched, dict) and patched["data"]["patched"] == "1"


async def test_malformed_answers_and_bad_ca_bundle_follow_the_failure_policy(
        apiserver: ApiServerEmulator, tls_webhook: WebhookServers, kube: KubeApi) -> None:
    def wrong_uid(review: dict[str, Any]) -> dict[str, Any]:
        answer = admission_response(review)
        answer["response"]["uid"] = "someone-else"
        return answer

    server = await tls_webhook.start(wrong_uid)
    apiserver.seed(webhook_config("a", [hook("uid.muster.io", server.client_config())]))
    with pytest.raises(ApiError) as err:
        await kube.create(PODS, pod("p"), "team-a")
    assert err.value.status == 500 and "expected response.uid=" in err.value.message
    apiserver.seed(webhook_config("a", [hook("uid.muster.io", server.client_config(),
                                             failurePolicy="Ignore")]))
    apiserver.seed(webhook_config("b", [hook("ca.muster.io", {
        "url": server.url, "caBundle": "not base64!"}, failurePolicy="Ignore")]))
    created = await kube.create(PODS, pod("p"), "team-a")
    assert created["metadata"]["name"] == "p"
    assert [c.webhook for c in apiserver.webhook_calls if c.error] == [
        "uid.muster.io", "uid.muster.io", "ca.muster.io"]
