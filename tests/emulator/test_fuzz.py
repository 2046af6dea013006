"""Bad input never makes the emulator answer 5xx (nor poisons the store for later readers)."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from webhook.doubles.emulator import ApiServerEmulator

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.text(max_size=6), children, max_size=3), max_leaves=12)

meta_values = st.fixed_dictionaries({}, optional={
    "name": json_values | st.sampled_from(["ok", "x-1", "UPPER", "a" * 300]),
    "generateName": json_values, "namespace": json_values,
    "labels": json_values | st.dictionaries(st.text(max_size=4), st.text(max_size=4)),
    "annotations": json_values, "finalizers": json_values, "ownerReferences": json_values,
    "resourceVersion": json_values})

bodies = st.one_of(
    json_values,
    st.fixed_dictionaries({"metadata": meta_values}, optional={
        "apiVersion": json_values | st.just("v1"), "kind": json_values | st.just("ConfigMap"),
        "data": json_values, "spec": json_values}))

PATHS = ["/api/v1/namespaces/team-a/configmaps", "/api/v1/namespaces/team-a/pods",
         "/apis/scheduling.volcano.sh/v1beta1/namespaces/team-a/podgroups", "/api/v1/nodes"]


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=bodies, path=st.sampled_from(PATHS), selector=st.text(max_size=12))
async def test_random_writes_and_selectors_never_5xx(shared_crds: list[dict[str, Any]],
                                                     body: Any, path: str,
                                                     selector: str) -> None:
    async with ApiServerEmulator(crds=shared_crds) as api, aiohttp.ClientSession() as http:
        api.seed({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}})
        async with http.post(api.url + path, data=json.dumps(body),
                             headers={"Content-Type": "application/json"}) as resp:
            assert resp.status < 500, await resp.text()
        for query in ({}, {"labelSelector": selector}, {"fieldSelector": selector},
                      {"watch": "1", "timeoutSeconds": "0"}):
            async with http.get(api.url + path, params=query) as resp:
                assert resp.status < 500, await resp.text()
                await resp.read()
        async with http.patch(api.url + path + "/ok", data=json.dumps(body),
                              headers={"Content-Type": "application/merge-patch+json"}) as resp:
            assert resp.status < 500, await resp.text()


hooks = st.lists(st.fixed_dictionaries({"name": st.just("a.b.c")}, optional={
    "rules": json_values | st.lists(st.fixed_dictionaries({}, optional={
        "operations": json_values | st.just(["*"]), "apiGroups": json_values | st.just([""]),
        "apiVersions": json_values | st.just(["*"]),
        "resources": json_values | st.just(["pods"])}), max_size=2),
    "namespaceSelector": json_values, "objectSelector": json_values,
    "clientConfig": json_values, "sideEffects": st.just("None"),
    "admissionReviewVersions": st.just(["v1"]), "failurePolicy": json_values}), max_size=2)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(webhooks=hooks)
async def test_random_webhook_configurations_never_5xx_later(webhooks: Any) -> None:
    async with ApiServerEmulator() as api, aiohttp.ClientSession() as http:
        config = {"apiVersion": "admissionregistration.k8s.io/v1",
                  "kind": "MutatingWebhookConfiguration", "metadata": {"name": "x"},
                  "webhooks": webhooks}
        async with http.post(api.url + "/apis/admissionregistration.k8s.io/v1/"
                             "mutatingwebhookconfigurations", json=config) as resp:
            assert resp.status < 500, await resp.text()
        pod = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}
        async with http.post(api.url + "/api/v1/namespaces/default/pods", json=pod) as resp:
            # a stored configuration is well formed: calling it may fail (Fail policy), crash not
            assert resp.status < 500 or "failed calling webhook" in await resp.text()
