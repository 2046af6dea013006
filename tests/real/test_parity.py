"""The emulator against the real kube-apiserver: the same checks, run on both backends.

The emulator follows the newest release (`versions.KUBERNETES`); the tier also runs these checks
on the oldest supported one (`versions.KUBERNETES_OLDEST`), where a check whose answer changed
between them says so.

Each test states what the real API server does with something Muster writes or relies on, and
runs once against the emulator and once against the real node's API server. Where the emulator
differs on purpose, the difference is listed in docs/emulator.md ("Known approximations") and
the test checks that exact difference, so the document cannot go stale.
"""

from __future__ import annotations

import contextlib
import dataclasses
import subprocess
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from real_helpers import crd_documents

from e2e.cluster import helm
from e2e.node import versions
from e2e.node.assets import REPO
from e2e.node.cluster import NodeCluster
from e2e.probes import eventually
from webhook import keys
from webhook.agent.discovery import discover
from webhook.agent.dra.claims import plan
from webhook.agent.dra.publisher import SlicePublisher
from webhook.agent.dra.slices import slice_name
from webhook.binder.claims import ClaimInfo, allocated_status, parse_claim
from webhook.binder.claimstate import ClaimState, ClaimWrite
from webhook.binder.dra import claim_devices, resolve
from webhook.binder.extended import (
    class_resources,
    gpu_class,
    pod_claims,
    pod_status,
    special_claim,
)
from webhook.binder.fit import gpu_serving
from webhook.binder.pods import parse_pod
from webhook.doubles.emulator import ApiServerEmulator
from webhook.doubles.fakenvml import FakeNvml
from webhook.kube import (
    CONFIGMAPS,
    ENDPOINT_SLICES,
    NAMESPACES,
    PODS,
    SERVICES,
    VOLCANO_PODGROUPS,
    ApiError,
    KubeApi,
    Resource,
    make_api_client,
)
from webhook.kube.api import DEVICE_CLASSES, RESOURCE_CLAIMS, RESOURCE_SLICES
from webhook.topology.model import ContainerGpus, GpuAssignment

PRIORITY_CLASSES = Resource("scheduling.k8s.io", "v1", "priorityclasses", False, "PriorityClass")
ENDPOINTS = Resource("", "v1", "endpoints", True, "Endpoints")
NS = "parity"


@pytest.fixture(scope="module")
def crds() -> list[dict[str, Any]]:
    return crd_documents()


@pytest.fixture(params=["emulator", "real"])
async def api(request: pytest.FixtureRequest, node_cluster: NodeCluster,
              crds: list[dict[str, Any]]) -> AsyncIterator[tuple[str, KubeApi]]:
    """(backend, client) with an empty namespace `parity` (created once per backend)."""
    with tempfile.TemporaryDirectory(prefix="muster-parity-") as tmp:
        if request.param == "emulator":
            emulator = ApiServerEmulator(crds=crds)
            await emulator.start()
            kubeconfig = str(emulator.write_kubeconfig(Path(tmp) / "kubeconfig"))
        else:
            emulator, kubeconfig = None, str(node_cluster.kubeconfig)
        client = await make_api_client(kubeconfig)
        kube = KubeApi(client)
        try:
            try:
                await kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace",
                                               "metadata": {"name": NS}})
            except ApiError as exc:
                if not exc.conflict:
                    raise
            yield request.param, kube
        finally:
            await client.close()
            if emulator is not None:
                await emulator.stop()


def pod(name: str, *, container: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"schedulerName": "nobody",  # nothing schedules or runs these pods
                     "containers": [{"name": "c", "image": "busybox", **(container or {})}],
                     **spec}}


async def refused(call: Any) -> ApiError:
    with pytest.raises(ApiError) as err:
        await call
    return err.value


async def test_version_is_the_one_built(api: tuple[str, KubeApi]) -> None:
    """The emulator answers as the newest release; the real server is the release this run
    built (the newest, or the oldest supported on that pass)."""
    backend, kube = api
    version = await kube.request("GET", "/version")
    expected = versions.KUBERNETES if backend == "emulator" else versions.kubernetes()
    major, minor = expected.removeprefix("v").split(".")[:2]
    assert (version["major"], version["minor"]) == (major, minor)
    assert version["gitVersion"].startswith(expected)


async def test_a_deprecated_api_is_answered_with_its_warning(api: tuple[str, KubeApi]) -> None:
    """Every answer about v1 Endpoints carries the server's deprecation warning (KEP-4974,
    since 1.33), which KubeApi logs; the EndpointSlices that replace them, which `muster
    analyze` reads, carry none."""
    _, kube = api
    await kube.list(ENDPOINT_SLICES, NS)
    assert len(kube.warnings) == 0
    await kube.list(ENDPOINTS, NS)
    said = "v1 Endpoints is deprecated in v1.33+; use discovery.k8s.io/v1 EndpointSlice"
    assert len(kube.warnings) == 1
    assert kube.warnings.get(said) == f"GET /api/v1/namespaces/{NS}/endpoints"


async def test_dry_run_persists_nothing_and_only_all_is_accepted(api: tuple[str, KubeApi]
                                                                 ) -> None:
    _, kube = api
    made = await kube.create(PODS, pod("dry"), NS, dry_run=True)
    assert made["metadata"]["name"] == "dry"
    assert (await refused(kube.get(PODS, "dry", namespace=NS))).status == 404
    err = await refused(kube.request("POST", PODS.path(NS), [("dryRun", "true")],
                                     body=pod("dry-true")))
    assert err.status == 422 and 'supported values: "All"' in err.message
    assert (await refused(kube.get(PODS, "dry-true", namespace=NS))).status == 404


@pytest.mark.parametrize(("toleration", "message"), [
    ({"key": "k", "operator": "Bogus"},
     'spec.tolerations[0].operator: Unsupported value: "Bogus"'),
    ({"key": "k", "operator": "Exists", "value": "v"},
     "value must be empty when `operator` is 'Exists'"),
])
async def test_tolerations_are_validated(api: tuple[str, KubeApi], toleration: dict[str, str],
                                         message: str) -> None:
    _, kube = api
    err = await refused(kube.create(PODS, pod("tol", tolerations=[toleration]), NS,
                                    dry_run=True))
    assert err.status == 422 and message in err.message


def _causes(err: ApiError) -> list[str]:
    return [f"{c['field']}: {c['message']}" for c in err.body["details"]["causes"]]


async def test_a_name_is_checked_with_the_rest_of_the_object(api: tuple[str, KubeApi]
                                                           ) -> None:
    """A name must be a DNS subdomain, a Namespace's a DNS label (of a name that would be a
    subdomain, the dots are named). Its causes come first in one answer with the labels' and
    the pod spec's, as ValidatePodCreate gives them."""
    _, kube = api
    bad = pod("Bad_Name.x", tolerations=[{"key": "k", "operator": "Bogus"}])
    bad["metadata"]["labels"] = {"app": "bad value!"}
    err = await refused(kube.create(PODS, bad, NS, dry_run=True))
    assert err.status == 422
    causes = _causes(err)
    assert causes[:2] == [f'metadata.name: Invalid value: "Bad_Name.x": {_SUBDOMAIN_SHAPE}',
                          f'metadata.labels: Invalid value: "bad value!": {_VALUE_SHAPE}']
    assert causes[2].startswith('spec.tolerations[0].operator: Unsupported value: "Bogus"')
    assert len(causes) == 3
    err = await refused(kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace",
                                                 "metadata": {"name": "a.b"}}, dry_run=True))
    assert _causes(err) == ['metadata.name: Invalid value: "a.b": must not contain dots']


async def test_a_generate_name_is_checked_as_the_name_it_starts(api: tuple[str, KubeApi]
                                                                ) -> None:
    """generateName is checked by the kind's name rule, its trailing '-' taken as a letter, and
    before the name made from it (a name given beside it does not spare it)."""
    _, kube = api
    made = await kube.create(PODS, {**pod(""), "metadata": {"generateName": "ok-"}}, NS,
                             dry_run=True)
    assert made["metadata"]["name"].startswith("ok-") and len(made["metadata"]["name"]) == 8
    err = await refused(kube.create(PODS, {**pod(""), "metadata": {"generateName": "Bad_"}}, NS,
                                    dry_run=True))
    [prefix, name] = _causes(err)
    assert prefix == f'metadata.generateName: Invalid value: "Bad_": {_SUBDOMAIN_SHAPE}'
    assert name.startswith('metadata.name: Invalid value: "Bad_') and \
        name.endswith(f'": {_SUBDOMAIN_SHAPE}')
    both = {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "ok", "generateName": "A."}}
    err = await refused(kube.create(CONFIGMAPS, both, NS, dry_run=True))
    assert _causes(err) == [f'metadata.generateName: Invalid value: "A.": {_SUBDOMAIN_SHAPE}']


async def test_a_services_name_is_a_dns_label(api: tuple[str, KubeApi]) -> None:
    """RelaxedServiceNameValidation (on in 1.37): a Service's name is an RFC 1123 label, so it
    may start with a digit and may not contain dots. 1.34 wants a DNS-1035 label."""
    backend, kube = api
    newest = backend == "emulator" or versions.kubernetes() == versions.KUBERNETES

    def service(name: str) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
                "spec": {"ports": [{"port": 80}]}}

    if newest:
        made = await kube.create(SERVICES, service("1abc"), NS, dry_run=True)
        assert made["metadata"]["name"] == "1abc"
        err = await refused(kube.create(SERVICES, service("a.b"), NS, dry_run=True))
        assert _causes(err) == ['metadata.name: Invalid value: "a.b": must not contain dots']
        return
    for name in ("1abc", "a.b"):
        err = await refused(kube.create(SERVICES, service(name), NS, dry_run=True))
        assert _causes(err) == [f'metadata.name: Invalid value: "{name}": {_DNS1035_SHAPE}']


_TERMS = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
_PREFERRED = "spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution"


def _on_nodes(*reqs: dict[str, Any], fields: bool = False) -> dict[str, Any]:
    kind = "matchFields" if fields else "matchExpressions"
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{kind: list(reqs)}]}}}


@pytest.mark.parametrize(("affinity", "messages"), [
    # what a test of the binder first wrote, and only the real server refused
    (_on_nodes({"key": "metadata.name", "operator": "In", "values": ["n1", "n2"]},
               fields=True),
     [f"{_TERMS}.nodeSelectorTerms[0].matchFields[0].values: Required value: must be only one "
      "value when `operator` is 'In' or 'NotIn' for node field selector"]),
    (_on_nodes({"key": "metadata.labels", "operator": "Exists"}, fields=True),
     [f'{_TERMS}.nodeSelectorTerms[0].matchFields[0].operator: Invalid value: "Exists": not a '
      "valid selector operator",
      f'{_TERMS}.nodeSelectorTerms[0].matchFields[0].key: Invalid value: "metadata.labels": '
      "not a valid field selector key"]),
    (_on_nodes({"key": "zone", "operator": "In", "values": []},
               {"key": "spot", "operator": "DoesNotExist", "values": ["x"]},
               {"key": "gen", "operator": "Gt", "values": ["1", "2"]},
               {"key": "rack", "operator": "Near", "values": ["r1"]}),
     [f"{_TERMS}.nodeSelectorTerms[0].matchExpressions[0].values: Required value: must be "
      "specified when `operator` is 'In' or 'NotIn'",
      f"{_TERMS}.nodeSelectorTerms[0].matchExpressions[1].values: Forbidden: may not be "
      "specified when `operator` is 'Exists' or 'DoesNotExist'",
      f"{_TERMS}.nodeSelectorTerms[0].matchExpressions[2].values: Required value: must be "
      "specified single value when `operator` is 'Lt' or 'Gt'",
      f'{_TERMS}.nodeSelectorTerms[0].matchExpressions[3].operator: Invalid value: "Near": not '
      "a valid selector operator"]),
    ({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": []}}},
     [f"{_TERMS}.nodeSelectorTerms: Required value: must have at least one node selector "
      "term"]),
    ({"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 0, "preference": {"matchFields": [
            {"key": "metadata.name", "operator": "NotIn", "values": ["a", "b"]}]}}]},
      "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
          {"weight": 101, "podAffinityTerm": {"topologyKey": "rack"}}]}},
     [f"{_PREFERRED}[0].weight: Invalid value: 0: must be in the range 1-100",
      f"{_PREFERRED}[0].preference.matchFields[0].values: Required value: must be only one "
      "value when `operator` is 'In' or 'NotIn' for node field selector",
      "spec.affinity.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].weight:"
      " Invalid value: 101: must be in the range 1-100"]),
])
async def test_node_affinity_and_weights_are_validated(
        api: tuple[str, KubeApi], affinity: dict[str, Any], messages: list[str]) -> None:
    """Each message the real server gives, and no other: the binder parses only terms it
    accepted, and a test must not pass on the emulator with a term the real server refuses."""
    _, kube = api
    err = await refused(kube.create(PODS, pod("aff", affinity=affinity), NS, dry_run=True))
    assert err.status == 422
    assert _causes(err) == messages
    one_name = _on_nodes({"key": "metadata.name", "operator": "In", "values": ["n1"]},
                         fields=True)
    made = await kube.create(PODS, pod("aff", affinity=one_name), NS, dry_run=True)
    assert made["spec"]["affinity"] == one_name


_POD_TERM = "spec.affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution[0]"
_NAME_SHAPE = ("must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
               "with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', "
               "regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')")
_VALUE_SHAPE = ("a valid label must be an empty string or consist of alphanumeric characters, "
                "'-', '_' or '.', and must start and end with an alphanumeric character (e.g. "
                "'MyValue',  or 'my_value',  or '12345', regex used for validation is "
                "'(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')")
_NS_SHAPE = ("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or "
             "'-', and must start and end with an alphanumeric character (e.g. 'my-name',  or "
             "'123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')")
_DNS1035_SHAPE = ("a DNS-1035 label must consist of lower case alphanumeric characters or '-', "
                  "start with an alphabetic character, and end with an alphanumeric character "
                  "(e.g. 'my-name',  or 'abc-123', regex used for validation is "
                  "'[a-z]([-a-z0-9]*[a-z0-9])?')")
_SUBDOMAIN_SHAPE = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
                    "characters, '-' or '.', and must start and end with an alphanumeric "
                    "character (e.g. 'example.com', regex used for validation is "
                    r"'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')")
_NO_TOPOLOGY_KEY = ["topologyKey: Required value: can not be empty",
                    'topologyKey: Invalid value: "": name part must be non-empty',
                    f'topologyKey: Invalid value: "": name part {_NAME_SHAPE}']


def _three_parts(key: str, newest: bool) -> str:
    """A key with two '/': "a valid label key" since 1.37, "a qualified name" before."""
    what = "a valid label key" if newest else "a qualified name"
    return (f'Invalid value: "{key}": {what} {_NAME_SHAPE} with an optional DNS subdomain prefix '
            "and '/' (e.g. 'example.com/MyName')")


def _pod_term(**term: Any) -> dict[str, Any]:
    return {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}


@pytest.mark.parametrize("case", ["selector operators", "names", "label keys", "no selector"])
async def test_pod_affinity_terms_are_validated(api: tuple[str, KubeApi], case: str) -> None:
    """Each pod (anti-)affinity term's selectors, namespaces, matchLabelKeys and topologyKey,
    with every cause the real server gives, in order (the binder reads these terms). Two
    answers changed in 1.37: a key with two '/' is named "a valid label key", and a cause found
    twice is given once."""
    backend, kube = api
    newest = backend == "emulator" or versions.kubernetes() == versions.KUBERNETES
    affinity, messages = {
        "selector operators": (
            {**_pod_term(labelSelector={"matchExpressions": [
                {"key": "app", "operator": "In", "values": []},
                {"key": "tier", "operator": "Exists", "values": ["x"]},
                {"key": "zone", "operator": "Gt", "values": ["1"]}]}, topologyKey=""),
             "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                 {"weight": 10, "podAffinityTerm": {"labelSelector": {
                     "matchLabels": {"app": "x"}}}}]}},
            [f"{_POD_TERM}.labelSelector.matchExpressions[0].values: Required value: must be "
             "specified when `operator` is 'In' or 'NotIn'",
             f"{_POD_TERM}.labelSelector.matchExpressions[1].values: Forbidden: may not be "
             "specified when `operator` is 'Exists' or 'DoesNotExist'",
             f'{_POD_TERM}.labelSelector.matchExpressions[2].operator: Invalid value: "Gt": not '
             "a valid selector operator",
             *(f"{_POD_TERM}.{m}" for m in _NO_TOPOLOGY_KEY),
             *("spec.affinity.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution"
               f"[0].podAffinityTerm.{m}" for m in _NO_TOPOLOGY_KEY)]),
        "names": (
            # one matchLabels entry: Go walks a map in random order
            _pod_term(labelSelector={"matchLabels": {"bad key!": "bad value!"},
                                     "matchExpressions": [{"key": "a/b/c", "operator": "In",
                                                           "values": ["-x"]}]},
                      namespaceSelector={"matchExpressions": [{"key": "",
                                                               "operator": "Exists"}]},
                      namespaces=["Bad_NS"], topologyKey="Example.com/rack"),
            [f'{_POD_TERM}.labelSelector.matchLabels: Invalid value: "bad key!": name part '
             f"{_NAME_SHAPE}",
             f'{_POD_TERM}.labelSelector.matchLabels: Invalid value: "bad value!": '
             f"{_VALUE_SHAPE}",
             f"{_POD_TERM}.labelSelector.matchExpressions[0].key: "
             f"{_three_parts('a/b/c', newest)}",
             f'{_POD_TERM}.labelSelector.matchExpressions[0].values[0]: Invalid value: "-x": '
             f"{_VALUE_SHAPE}",
             f'{_POD_TERM}.namespaceSelector.matchExpressions[0].key: Invalid value: "": name '
             "part must be non-empty",
             f'{_POD_TERM}.namespaceSelector.matchExpressions[0].key: Invalid value: "": name '
             f"part {_NAME_SHAPE}",
             f'{_POD_TERM}.namespace: Invalid value: "Bad_NS": {_NS_SHAPE}',
             f'{_POD_TERM}.topologyKey: Invalid value: "Example.com/rack": prefix part '
             f"{_SUBDOMAIN_SHAPE}"]),
        # `job` ends up in the selector three times: the user's, and merged from both lists
        "label keys": (
            _pod_term(labelSelector={"matchExpressions": [
                {"key": "job", "operator": "In", "values": ["a"]}]},
                matchLabelKeys=["job", "a/b/c"], mismatchLabelKeys=["job"], topologyKey="rack"),
            [f"{_POD_TERM}.matchLabelKeys[1]: {_three_parts('a/b/c', newest)}",
             *[f'{_POD_TERM}[0]: Invalid value: "job": exists in both matchLabelKeys and '
               "labelSelector"] * (1 if newest else 2),
             f'{_POD_TERM}.matchLabelKeys[0]: Invalid value: "job": exists in both '
             "matchLabelKeys and mismatchLabelKeys"]),
        "no selector": (
            _pod_term(matchLabelKeys=["job"], topologyKey="rack"),
            [f"{_POD_TERM}.matchLabelKeys: Forbidden: must not be specified when labelSelector "
             "is not set"]),
    }[case]
    labelled = pod("aff", affinity=affinity)
    labelled["metadata"]["labels"] = {"job": "a"}
    err = await refused(kube.create(PODS, labelled, NS, dry_run=True))
    assert err.status == 422
    assert _causes(err) == messages


async def test_match_label_keys_are_merged_into_the_selector(api: tuple[str, KubeApi]) -> None:
    """On create, after the webhooks, each pod term's matchLabelKeys become `In` the pod's
    value and its mismatchLabelKeys `NotIn`, in its labelSelector (an empty one too); keys the
    pod lacks are left out. The binder reads the merged selector, as kube-scheduler does."""
    _, kube = api
    affinity = {
        "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": "x"}}, "topologyKey": "rack",
             "matchLabelKeys": ["job"], "mismatchLabelKeys": ["team"]}]},
        "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 5, "podAffinityTerm": {"labelSelector": {}, "topologyKey": "rack",
                                              "matchLabelKeys": ["job", "absent"]}}]}}
    labelled = pod("merged", affinity=affinity)
    labelled["metadata"]["labels"] = {"job": "a", "team": "t"}
    made = await kube.create(PODS, labelled, NS, dry_run=True)
    required = made["spec"]["affinity"]["podAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert required["labelSelector"] == {"matchLabels": {"app": "x"}, "matchExpressions": [
        {"key": "job", "operator": "In", "values": ["a"]},
        {"key": "team", "operator": "NotIn", "values": ["t"]}]}
    assert required["matchLabelKeys"] == ["job"]  # kept beside the merged selector
    preferred = made["spec"]["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
    assert preferred["labelSelector"] == {"matchExpressions": [
        {"key": "job", "operator": "In", "values": ["a"]}]}


@pytest.mark.parametrize(("resources", "message"), [
    ({"requests": {"nvidia.com/gpu": "1"}},
     "Limit must be set for non overcommitable resources"),
    ({"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "2"}},
     "must be equal to nvidia.com/gpu limit of 2"),
])
async def test_a_gpu_request_needs_an_equal_limit(api: tuple[str, KubeApi],
                                                  resources: dict[str, Any],
                                                  message: str) -> None:
    _, kube = api
    err = await refused(kube.create(PODS, pod("gpu", container={"resources": resources}), NS,
                                    dry_run=True))
    assert err.status == 422 and message in err.message


async def test_a_gpu_limit_alone_defaults_the_request(api: tuple[str, KubeApi]) -> None:
    _, kube = api
    made = await kube.create(PODS, pod("gpu", container={"resources": {
        "limits": {"nvidia.com/gpu": "2"}}}), NS, dry_run=True)
    assert made["spec"]["containers"][0]["resources"]["requests"] == {"nvidia.com/gpu": "2"}


async def test_priority_class_name_is_resolved_before_webhooks(api: tuple[str, KubeApi]
                                                               ) -> None:
    _, kube = api
    err = await refused(kube.create(PODS, pod("prio", priorityClassName="nope"), NS,
                                    dry_run=True))
    assert err.status == 403 and "no PriorityClass with name nope was found" in err.message
    made = await kube.create(PODS, pod("prio", priorityClassName="system-node-critical"), NS,
                             dry_run=True)
    assert made["spec"]["priority"] == 2000001000
    try:
        await kube.create(PRIORITY_CLASSES, {"apiVersion": "scheduling.k8s.io/v1",
                                             "kind": "PriorityClass",
                                             "metadata": {"name": "parity-high"}, "value": 777})
    except ApiError as exc:
        if not exc.conflict:
            raise

    async def resolved() -> dict[str, Any] | None:
        # kube-apiserver's Priority admission reads PriorityClasses from an informer: a class
        # just created is found once the informer has it
        try:
            return await kube.create(PODS, pod("prio", priorityClassName="parity-high"), NS,
                                     dry_run=True)
        except ApiError as exc:
            if "no PriorityClass with name parity-high" not in exc.message:
                raise
            return None
    made = await eventually(resolved, within=10, what="the new PriorityClass to be resolved")
    assert made["spec"]["priority"] == 777


async def test_tolerations_can_be_added_on_update_but_not_removed(api: tuple[str, KubeApi]
                                                                  ) -> None:
    _, kube = api
    made = await kube.create(PODS, pod("upd", tolerations=[{"key": "a", "operator": "Exists"}]),
                             NS)
    try:
        made["spec"]["tolerations"].append({"key": "b", "operator": "Exists"})
        made = await kube.request("PUT", PODS.path(NS, "upd"), body=made)
        assert {"key": "b", "operator": "Exists"} in made["spec"]["tolerations"]
        made["spec"]["tolerations"] = [t for t in made["spec"]["tolerations"]
                                       if t["key"] != "a"]
        err = await refused(kube.request("PUT", PODS.path(NS, "upd"), body=made))
        assert err.status == 422
        assert "existing toleration can not be modified except its tolerationSeconds" in \
            err.message
    finally:
        await kube.delete(PODS, "upd", NS)


async def test_bindings_are_checked_as_the_binder_relies_on(api: tuple[str, KubeApi]) -> None:
    _, kube = api
    made = await kube.create(PODS, pod("bind"), NS)
    path = PODS.path(NS, "bind") + "/binding"

    def binding(**meta: str) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "bind", **meta},
                "target": {"kind": "Node", "name": "nowhere"}}
    try:
        wrong_name = {**binding(), "metadata": {"name": "other"}}
        err = await refused(kube.request("POST", path, body=wrong_name))
        assert err.status == 400 and "does not match name in Binding" in err.message
        wrong_kind = {**binding(), "target": {"kind": "Pod", "name": "nowhere"}}
        err = await refused(kube.request("POST", path, body=wrong_kind))
        assert err.status == 500 and 'target.kind: Unsupported value: "Pod"' in err.message
        err = await refused(kube.request("POST", path, body=binding(resourceVersion="1")))
        assert err.status == 409 and "Precondition failed: ResourceVersion" in err.message
        err = await refused(kube.request("POST", path, body=binding(uid="not-the-pod")))
        assert err.status == 409 and "Precondition failed: UID" in err.message
        # the node need not exist; the pod's uid and current resourceVersion pass; the
        # Binding's annotations land on the pod in the same write (how the binder's assignment
        # gets there; a muster.io/ key on anyone else's Binding is refused by the chart's
        # annotation guard: tests/real/test_forgery.py)
        body = binding(uid=made["metadata"]["uid"],
                       resourceVersion=made["metadata"]["resourceVersion"])
        body["metadata"]["annotations"] = {"example.com/assignment": "{}"}
        await kube.request("POST", path, body=body)
        bound = await kube.get(PODS, "bind", namespace=NS)
        assert bound["spec"]["nodeName"] == "nowhere"
        assert bound["metadata"]["annotations"]["example.com/assignment"] == "{}"
        assert {"type": "PodScheduled", "status": "True"}.items() <= next(
            c for c in bound["status"]["conditions"] if c["type"] == "PodScheduled").items()
        err = await refused(kube.request("POST", path, body=binding()))
        assert err.status == 409 and 'is already assigned to node "nowhere"' in err.message
    finally:
        await kube.delete(PODS, "bind", NS)


async def test_a_json_patch_test_of_a_stale_resource_version_is_refused(
        api: tuple[str, KubeApi]) -> None:
    """The binder strips a stale assignment with a `test` of resourceVersion
    (webhook.binder)."""
    _, kube = api
    made = await kube.create(PODS, pod("patch"), NS)
    try:
        ops = [{"op": "test", "path": "/metadata/resourceVersion", "value": "1"},
               {"op": "add", "path": "/metadata/annotations", "value": {"a": "b"}}]
        err = await refused(kube.patch(PODS, "patch", ops, NS, patch_type="json"))
        assert err.status == 422 and "rejected our request" in err.message
        ops[0]["value"] = made["metadata"]["resourceVersion"]
        done = await kube.patch(PODS, "patch", ops, NS, patch_type="json")
        assert done["metadata"]["annotations"] == {"a": "b"}
    finally:
        await kube.delete(PODS, "patch", NS)


async def test_a_volcano_podgroup_gets_the_crd_defaults(api: tuple[str, KubeApi]) -> None:
    _, kube = api
    made = await kube.create(VOLCANO_PODGROUPS, {
        "apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
        "metadata": {"name": "pg"}, "spec": {"minMember": 2}}, NS, dry_run=True)
    assert made["spec"]["minMember"] == 2
    assert made["spec"].get("queue") == "default"


async def test_a_pod_field_typo_under_strict_validation(api: tuple[str, KubeApi]) -> None:
    """Documented difference: the emulator has no built-in schemas for pods (it validates the
    rules above), so it stores an unknown pod field; kube-apiserver refuses it."""
    backend, kube = api
    body = pod("typo", container={"imagePullPolicyy": "Never"})
    call = kube.request("POST", PODS.path(NS), [("fieldValidation", "Strict"),
                                                ("dryRun", "All")], body=body)
    if backend == "real":
        err = await refused(call)
        assert err.status == 400
        assert 'strict decoding error: unknown field "spec.containers[0].imagePullPolicyy"' \
            in err.message
    else:
        assert (await call)["metadata"]["name"] == "typo"


async def test_scheduling_gates_hold_a_pod_until_removed(api: tuple[str, KubeApi]) -> None:
    """A gated pod is not schedulable: the API server marks it SchedulingGated, refuses a
    Binding of it and refuses new gates; removing the gates is the one change allowed."""
    _, kube = api
    made = await kube.create(PODS, pod("gated", schedulingGates=[{"name": "example.com/hold"}]),
                             NS)
    try:
        cond = next(c for c in made["status"]["conditions"] if c["type"] == "PodScheduled")
        assert (cond["status"], cond["reason"]) == ("False", "SchedulingGated")
        err = await refused(kube.bind(NS, "gated", "nowhere", uid=made["metadata"]["uid"]))
        assert "non-empty .spec.schedulingGates" in err.message
        made["spec"]["schedulingGates"].append({"name": "example.com/more"})
        err = await refused(kube.request("PUT", PODS.path(NS, "gated"), body=made))
        assert err.status == 422 and "only deletion is allowed" in err.message
        ungated = await kube.patch(PODS, "gated", {"spec": {"schedulingGates": None}}, NS,
                                   patch_type="strategic")
        assert not ungated["spec"].get("schedulingGates")
        await kube.bind(NS, "gated", "nowhere", uid=made["metadata"]["uid"])
    finally:
        await kube.delete(PODS, "gated", NS)


async def test_a_sidecar_is_an_init_container_that_restarts_always(api: tuple[str, KubeApi]
                                                                    ) -> None:
    """Sidecars (GA in 1.33) are kept as written: Muster counts them as the kubelet does
    (webhook.podresources). 1.34.4 and 1.37.2 also accept `OnFailure` on an init container
    (container restart rules), a regular init container to Muster."""
    _, kube = api
    sidecar = {"name": "side", "image": "busybox", "restartPolicy": "Always",
               "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    made = await kube.create(PODS, pod("side", initContainers=[sidecar]), NS, dry_run=True)
    kept = made["spec"]["initContainers"][0]
    assert kept["restartPolicy"] == "Always"
    assert kept["resources"]["requests"] == {"nvidia.com/gpu": "1"}


async def test_a_watch_list_streams_the_state_then_a_bookmark(api: tuple[str, KubeApi]) -> None:
    """A streaming list (`sendInitialEvents`, the WatchList feature): every current object as
    ADDED, then one BOOKMARK annotated `k8s.io/initial-events-end`, then changes."""
    _, kube = api
    labelled = {"labels": {"parity": "watch-list"}}
    await kube.create(PODS, {**pod("wl-a"), "metadata": {"name": "wl-a", **labelled}}, NS)
    try:
        seen: list[tuple[str, str]] = []
        stream = kube.watch(PODS, NS, send_initial_events=True, timeout_seconds=10,
                            label_selector="parity=watch-list")
        async with contextlib.aclosing(stream):
            async for kind, obj in stream:
                meta = obj.get("metadata") or {}
                if kind == "BOOKMARK":
                    assert meta["annotations"] == {"k8s.io/initial-events-end": "true"}
                    assert int(meta["resourceVersion"]) > 0
                    seen.append((kind, ""))
                    await kube.create(PODS, {**pod("wl-b"), "metadata": {
                        "name": "wl-b", **labelled}}, NS)
                    continue
                seen.append((kind, meta["name"]))
                if meta["name"] == "wl-b":
                    break
        assert seen == [("ADDED", "wl-a"), ("BOOKMARK", ""), ("ADDED", "wl-b")]
        err = await refused(kube.request("GET", PODS.path(NS), [
            ("watch", "true"), ("sendInitialEvents", "true")]))
        assert err.status == 422 and "resourceVersionMatch" in err.message
    finally:
        for name in ("wl-a", "wl-b"):
            with contextlib.suppress(ApiError):
                await kube.delete(PODS, name, NS)


def chart_device_class() -> str:
    return subprocess.run(
        [helm(), "template", "muster", str(REPO / "charts" / "muster"), "--set",
         "agent.gpuServing=dra", "--show-only", "templates/agent-deviceclass.yaml"],
        capture_output=True, text=True, check=True, timeout=60).stdout


async def test_the_dra_drivers_objects_are_accepted_as_published(api: tuple[str, KubeApi]
                                                                   ) -> None:
    """resource.k8s.io/v1 as the DRA driver uses it: the agent's ResourceSlice (typed attributes,
    the standard pcieRoot, memory capacity) created, listed by spec.nodeName and spec.driver and
    replaced; the chart's DeviceClass; and a claim allocated the way kube-scheduler writes it,
    read back into the devices the driver would prepare."""
    backend, kube = api
    topology = discover(FakeNvml.profile("dgx1-v100")).topology
    assert topology is not None
    node = "parity-dra-node"
    (device_class,) = [d for d in yaml.safe_load_all(chart_device_class()) if d]
    publisher = SlicePublisher(kube, node)
    try:
        roots = {g.index: "pci0000:00" if g.index < 4 else "pci0000:80" for g in topology.gpus}
        assert await publisher.publish(topology, roots)
        assert not await publisher.publish(topology, roots)  # read back exactly as written
        gpus = list(topology.gpus)
        gpus[1] = dataclasses.replace(gpus[1], healthy=False)
        assert await publisher.publish(dataclasses.replace(topology, gpus=tuple(gpus)), roots)
        listed = (await kube.list(RESOURCE_SLICES, field_selector=(
            f"spec.nodeName={node},spec.driver={keys.DRA_DRIVER}")))["items"]
        assert [s["metadata"]["name"] for s in listed] == [slice_name(node)]
        assert listed[0]["spec"]["pool"] == {"name": node, "generation": 2,
                                             "resourceSliceCount": 1}
        assert len(listed[0]["spec"]["devices"]) == 7

        stored_class = await kube.create(DEVICE_CLASSES, device_class)
        # DRA-backed extended resources (KEP-5004) are on from 1.37 (beta); an API server with
        # the DRAExtendedResource gate off drops the field, so the chart may always send it
        version = await kube.request("GET", "/version")
        mapped = backend == "emulator" or int(version["minor"].rstrip("+")) >= 37
        assert stored_class["spec"].get("extendedResourceName") == (
            "nvidia.com/gpu" if mapped else None)
        claim = await kube.create(RESOURCE_CLAIMS, {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "dra-parity"},
            "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
                "deviceClassName": keys.DRA_DRIVER, "count": 2}}]}}}, NS)
        claim["status"] = {
            "allocation": {"devices": {"results": [
                {"request": "gpus", "driver": keys.DRA_DRIVER, "pool": node, "device": d}
                for d in ("gpu-0", "gpu-3")]}},
            "reservedFor": [{"resource": "pods", "name": "p",
                             "uid": "7d1c6e2a-0000-4000-8000-000000000001"}]}
        stored = await kube.replace(RESOURCE_CLAIMS, "dra-parity", claim, NS,
                                    subresource="status")
        uid = stored["metadata"]["uid"]
        planned = plan(stored, NS, "dra-parity", uid, node=node,
                       gpus={f"gpu-{g.index}": g.uuid or "" for g in topology.gpus})
        assert [d.uuid for d in planned.devices] == [topology.gpus[0].uuid,
                                                     topology.gpus[3].uuid]
    finally:
        for resource, name, ns in ((RESOURCE_SLICES, slice_name(node), None),
                                   (DEVICE_CLASSES, keys.DRA_DRIVER, None),
                                   (RESOURCE_CLAIMS, "dra-parity", NS)):
            with contextlib.suppress(ApiError):
                await kube.delete(resource, name, ns)


async def test_the_binders_claim_allocation_and_release_are_accepted(
        api: tuple[str, KubeApi]) -> None:
    """The status the binder writes for the claims of a pod it places (webhook.binder.claims,
    through the binder's own writer): allocation results of our driver with a node selector
    and the pod in reservedFor, stored as written; a write with a stale resourceVersion is a
    409 that releases the claims written with it; and the release (allocation and reservedFor
    removed together) is accepted too. The pod exists, unscheduled, as the binder's would: the
    resourceclaim controller drops reservations for pods that do not."""
    _, kube = api
    names = ("binder-a", "binder-b")
    for name in names:
        await kube.create(RESOURCE_CLAIMS, {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
                "deviceClassName": keys.DRA_DRIVER, "count": 2}}]}}}, NS)
    member = parse_pod(await kube.create(PODS, pod("w-0", container={"resources": {
        "claims": [{"name": "a"}, {"name": "b"}]}}, resourceClaims=[
            {"name": "a", "resourceClaimName": "binder-a"},
            {"name": "b", "resourceClaimName": "binder-b"}]), NS))
    state = ClaimState(kube, changed=lambda _key: None, check_fence=lambda: None)

    async def read(name: str) -> ClaimInfo:
        state.on_event("MODIFIED", await kube.get(RESOURCE_CLAIMS, name, NS), None)
        info = state.get(f"{NS}/{name}")
        assert info is not None
        return info

    def write(info: ClaimInfo, gpus: tuple[int, int]) -> ClaimWrite:
        return member, "parity-dra-node", info, tuple(("gpus", i) for i in gpus)

    try:
        claim_a, claim_b = [await read(n) for n in names]
        # someone else writes b after the binder read it: the binder's write of b is a 409
        theirs = await kube.get(RESOURCE_CLAIMS, "binder-b", NS)
        theirs["status"] = allocated_status({}, "other-node", [("gpus", 0), ("gpus", 1)],
                                            "w-0", member.uid)
        await kube.replace(RESOURCE_CLAIMS, "binder-b", theirs, NS, subresource="status")
        failed = await state.allocate([write(claim_a, (4, 5)), write(claim_b, (6, 7))])
        assert [e.status for e in failed] == [409], failed
        assert not (await read("binder-a")).allocated, "a was not released"
        # read again, a is allocated for the pod as written, with kube-scheduler's finalizer
        assert await state.allocate([write(await read("binder-a"), (4, 5))]) == []
        stored = await kube.get(RESOURCE_CLAIMS, "binder-a", NS)
        assert stored["metadata"]["finalizers"] == [keys.CLAIM_FINALIZER]
        assert stored["status"] == allocated_status({}, "parity-dra-node",
                                                    [("gpus", 4), ("gpus", 5)], "w-0", member.uid)
        assert parse_claim(stored).reserved_only_for(member.uid)
        await state.release(f"{NS}/binder-a", member.uid)
        assert not (await read("binder-a")).allocated
    finally:
        with contextlib.suppress(ApiError):
            await kube.delete(PODS, "w-0", NS)
        for name in names:
            await _delete_claim(kube, name)


async def _delete_claim(kube: KubeApi, name: str) -> None:
    """Delete a claim the test made, its finalizer first: no resourceclaim controller runs
    here to remove it."""
    with contextlib.suppress(ApiError):
        claim = await kube.get(RESOURCE_CLAIMS, name, NS)
        if claim["metadata"].get("finalizers"):
            claim["metadata"]["finalizers"] = []
            await kube.replace(RESOURCE_CLAIMS, name, claim, NS)
        await kube.delete(RESOURCE_CLAIMS, name, NS)


async def test_the_binders_special_claim_and_pod_status_are_accepted(
        api: tuple[str, KubeApi]) -> None:
    """A plain `nvidia.com/gpu` pod served through DRA (webhook.binder.extended), written as the
    binder writes it: the special claim (generated name, the pod as controller, the annotation,
    one request per container) created, allocated and reserved for the pod, and the pod status
    `extendedResourceClaimStatus` naming it, read back as written; a status patch for another
    pod of the same name (uid) refused; the claim deleted. Where the API server drops the
    DeviceClass's extendedResourceName (the DRAExtendedResource gate off, as on 1.34), no class
    serves the resource, the binder keeps such pods on the device plugin's path, and the pod
    status field is dropped too."""
    backend, kube = api
    (device_class,) = [d for d in yaml.safe_load_all(chart_device_class()) if d]
    version = await kube.request("GET", "/version")
    mapped = backend == "emulator" or int(version["minor"].rstrip("+")) >= 37
    state = ClaimState(kube, changed=lambda _key: None, check_fence=lambda: None)
    made: list[str] = []
    try:
        stored_class = await kube.create(DEVICE_CLASSES, device_class)
        served = gpu_class(class_resources([stored_class]))
        plain = parse_pod(await kube.create(PODS, pod("ext-0", container={"resources": {
            "limits": {"nvidia.com/gpu": "2"}}}), NS), "default-scheduler")
        member = dataclasses.replace(plain, gpu_class=served)
        assert gpu_serving(member) == ("either" if mapped else "devicePlugin")
        requests = member.extended
        assert requests == (("c", "container-0-request-0", 2),)
        assert isinstance(requests, tuple)

        info = await state.create(special_claim(NS, "ext-0", member.uid, requests))
        made.append(info.name)
        assert info.name.startswith("ext-0-extended-resources-")
        assert info.extended_for == ("ext-0", member.uid) and not info.problem
        created = await kube.get(RESOURCE_CLAIMS, info.name, NS)
        assert created["metadata"]["annotations"] == {
            keys.EXTENDED_CLAIM_ANNOTATION: "true"}
        assert created["metadata"]["finalizers"] == [keys.CLAIM_FINALIZER]
        attached = resolve(dataclasses.replace(member, claims=pod_claims(
            requests, info.name, ["c"])), state.get)
        assert attached.dra and not attached.claim_problems
        chosen = GpuAssignment("parity-dra-node", {"c": ContainerGpus((4, 5), ("", ""))})
        writes = [(attached, "parity-dra-node", c, d)
                  for c, d in claim_devices(attached, chosen, state.get)]
        assert writes[0][3] == (("container-0-request-0", 4), ("container-0-request-0", 5))
        assert await state.allocate(writes) == []
        stored = await kube.get(RESOURCE_CLAIMS, info.name, NS)
        assert stored["status"] == allocated_status(
            {}, "parity-dra-node", writes[0][3], "ext-0", member.uid)

        patch = pod_status(member.uid, info.name, requests)
        err = await refused(kube.patch(PODS, "ext-0", {**patch, "metadata": {
            "uid": "7d1c6e2a-0000-4000-8000-000000000009"}}, NS, subresource="status"))
        assert err.status in (409, 422), err
        written = await kube.patch(PODS, "ext-0", patch, NS, subresource="status")
        if mapped:
            assert written["status"]["extendedResourceClaimStatus"] == patch["status"][
                "extendedResourceClaimStatus"]
            read = parse_pod(await kube.get(PODS, "ext-0", NS), "default-scheduler")
            assert read.dra and read.extended_status == info.name
        else:
            assert "extendedResourceClaimStatus" not in written["status"]
        await state.delete(f"{NS}/{info.name}")
        assert state.get(f"{NS}/{info.name}") is None
        assert (await refused(kube.get(RESOURCE_CLAIMS, info.name, NS))).status == 404
    finally:
        with contextlib.suppress(ApiError):
            await kube.delete(PODS, "ext-0", NS)
        for name in made:
            await _delete_claim(kube, name)
        with contextlib.suppress(ApiError):
            await kube.delete(DEVICE_CLASSES, keys.DRA_DRIVER)
