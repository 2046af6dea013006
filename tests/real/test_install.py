"""`helm install` with hooks on a real node: what a user sees after installing Muster."""

from __future__ import annotations

import base64

from real_helpers import kubectl, pod_ready, run_helm

from e2e.cluster import NAMESPACE, RELEASE
from e2e.node.cluster import NodeCluster
from e2e.probes import eventually
from webhook.certs.manager import CA_CERT_KEY
from webhook.kube import (
    DEPLOYMENTS,
    ENDPOINT_SLICES,
    EVENTS,
    LEASES,
    MUTATING_WEBHOOKS,
    PODS,
    SECRETS,
    VALIDATING_WEBHOOKS,
    KubeApi,
    Resource,
)

DAEMONSETS = Resource("apps", "v1", "daemonsets", True, "DaemonSet")


async def test_certificate_hook_ran_as_a_pod_and_patched_the_ca_bundle(kube: KubeApi) -> None:
    events = (await kube.list(EVENTS, namespace=NAMESPACE))["items"]
    job = f"{RELEASE}-webhook-certs"
    created = [e for e in events if e["involvedObject"]["kind"] == "Job"
               and e["involvedObject"]["name"] == job and e["reason"] == "SuccessfulCreate"]
    assert created, f"the Job controller never created the {job} hook pod"
    hook_pod = created[0]["message"].removeprefix("Created pod: ")
    started = [e for e in events if e["involvedObject"]["name"] == hook_pod
               and e["reason"] == "Started"]
    assert started, f"the kubelet never started the hook pod {hook_pod}"
    assert any(e["involvedObject"]["name"] == job and e["reason"] == "Completed" for e in events)

    ca = base64.b64decode((await kube.get(SECRETS, f"{RELEASE}-webhook-ca",
                                          namespace=NAMESPACE))["data"][CA_CERT_KEY])
    for resource in (MUTATING_WEBHOOKS, VALIDATING_WEBHOOKS):
        found = [c for c in (await kube.list(resource))["items"]
                 if c["metadata"]["name"].endswith(RELEASE)]
        assert found, f"no {resource.kind} of the release"
        for hook in found[0]["webhooks"]:
            assert ca in base64.b64decode(hook["clientConfig"]["caBundle"]), hook["name"]


async def test_two_webhook_replicas_are_ready_behind_the_service(kube: KubeApi) -> None:
    deployment = await kube.get(DEPLOYMENTS, f"{RELEASE}-webhook", namespace=NAMESPACE)
    assert deployment["status"].get("readyReplicas") == 2
    slices = (await kube.list(ENDPOINT_SLICES, NAMESPACE, label_selector=(
        f"kubernetes.io/service-name={RELEASE}-webhook")))["items"]
    addresses = [a for es in slices for e in es.get("endpoints") or ()
                 if (e.get("conditions") or {}).get("ready") for a in e["addresses"]]
    assert len(addresses) == 2
    pods = (await kube.list(PODS, namespace=NAMESPACE,
                            label_selector="app.kubernetes.io/component=webhook"))["items"]
    assert sorted(p["status"]["podIP"] for p in pods if pod_ready(p)) == sorted(
        addresses)


async def test_binder_holds_its_lease_and_agent_runs_on_the_node(kube: KubeApi) -> None:
    lease = await kube.get(LEASES, "muster-binder", namespace=NAMESPACE)
    holder = lease["spec"].get("holderIdentity")
    binders = (await kube.list(PODS, namespace=NAMESPACE,
                               label_selector="app.kubernetes.io/component=binder"))["items"]
    assert holder and any(holder.startswith(p["metadata"]["name"]) for p in binders), holder
    agent = await kube.get(DAEMONSETS, f"{RELEASE}-agent", namespace=NAMESPACE)
    assert agent["status"]["desiredNumberScheduled"] == 1

    async def ready() -> bool:
        """The agent is Ready once the kubelet took its device plugin: `helm install --wait`
        waits for none on one node (the DaemonSet's maxUnavailable is 1)."""
        got = await kube.get(DAEMONSETS, f"{RELEASE}-agent", namespace=NAMESPACE)
        return bool(got["status"].get("numberReady") == 1)
    await eventually(ready, within=60, what="the agent pod Ready")


def test_helm_test_passes(node_cluster: NodeCluster) -> None:
    out = run_helm(node_cluster, "test", RELEASE, "--namespace", NAMESPACE, "--logs")
    assert "OK: policy" in out.stdout, out.stdout


def test_only_the_cert_rotator_may_rewrite_the_webhook_configurations(
        node_cluster: NodeCluster) -> None:
    """The webhook's ServiceAccount may neither update its webhook configurations nor read its
    CA Secret; the cert-rotator's may, and it runs (asked of the real API server's RBAC)."""
    ready = kubectl(node_cluster, "get", "deployment", f"{RELEASE}-cert-rotator", "-n",
                    NAMESPACE, "-o", "jsonpath={.status.readyReplicas}")
    assert ready.stdout.strip() == "1", ready.stdout
    asks = [("update", f"mutatingwebhookconfigurations/0-{RELEASE}"),
            ("patch", f"validatingwebhookconfigurations/0-{RELEASE}"),
            ("get", f"secrets/{RELEASE}-webhook-ca")]
    for account, allowed in ((f"{RELEASE}-webhook", "no"), (f"{RELEASE}-cert-rotator", "yes")):
        for verb, what in asks:
            out = kubectl(node_cluster, "auth", "can-i", verb, what, "-n", NAMESPACE,
                          f"--as=system:serviceaccount:{NAMESPACE}:{account}", check=False)
            assert out.stdout.strip() == allowed, (account, verb, what, out.stdout, out.stderr)


def test_network_policies_are_installed(node_cluster: NodeCluster) -> None:
    """The chart's NetworkPolicies (on by default) install; this node's bridge CNI enforces no
    NetworkPolicy, so what they admit is checked in tests/chart, not here. Every other test of
    this tier runs with them installed."""
    names = kubectl(node_cluster, "get", "networkpolicies", "-n", NAMESPACE, "-o",
                    "jsonpath={.items[*].metadata.name}").stdout.split()
    assert sorted(names) == [f"{RELEASE}-agent", f"{RELEASE}-binder", f"{RELEASE}-webhook"]
