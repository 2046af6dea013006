"""`helm upgrade`, `helm rollback` and `helm uninstall` on the real node. Runs after the other real
tests (file order): the uninstall removes Muster."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from pathlib import Path
from typing import Any

import yaml
from jobs import ensure_namespace, mpijob, submit
from real_helpers import (
    kubectl,
    policies_everywhere,
    release_values,
    run_helm,
    webhook_pods,
)

from e2e.cluster import NAMESPACE, RELEASE
from e2e.node.assets import REPO
from e2e.node.cluster import NodeCluster
from e2e.probes import (
    EXTRA_POLICY,
    ROLLOUT_NAMESPACE,
    eventually,
    pods_of,
    probe_labels,
    rollout_loaded,
    rollout_policies,
)
from webhook import keys
from webhook.kube import (
    COSCHEDULING_PODGROUPS,
    EVENTS,
    MPIJOBS,
    MUTATING_WEBHOOKS,
    VALIDATING_WEBHOOKS,
    KubeApi,
)

CHART = str(REPO / "charts" / "muster")
async def _webhook_restarts(kube: KubeApi) -> dict[str, int]:
    """Each webhook pod's uid → its containers' restarts."""
    return {p["metadata"]["uid"]: sum(c["restartCount"] for c in p["status"]["containerStatuses"])
            for p in await webhook_pods(kube, terminating=True)}


async def _ca_bundles(kube: KubeApi) -> list[bytes]:
    found = []
    for resource in (MUTATING_WEBHOOKS, VALIDATING_WEBHOOKS):
        for config in (await kube.list(resource))["items"]:
            if config["metadata"]["name"].endswith(RELEASE):
                found += [base64.b64decode(w["clientConfig"]["caBundle"])
                          for w in config["webhooks"]]
    return found


def _values_file(cluster: NodeCluster, values: dict[str, Any]) -> Path:
    path = cluster.dir / "values-upgrade.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


async def test_upgrade_applies_policies_live_and_rollback_restores_them(
        kube: KubeApi, node_cluster: NodeCluster) -> None:
    ns = await ensure_namespace(kube, "team-c")
    assert "cost-center" not in await probe_labels(kube, ns)
    before_pods, before_ca = await _webhook_restarts(kube), await _ca_bundles(kube)

    values = release_values(node_cluster)
    values["policies"]["team-c.yaml"] = EXTRA_POLICY
    await asyncio.to_thread(run_helm, node_cluster, "upgrade", RELEASE, CHART, "--namespace",
                            NAMESPACE, "--values", str(_values_file(node_cluster, values)),
                            "--wait", "--timeout", "3m")

    async def labelled() -> bool:
        return (await probe_labels(kube, ns)).get("cost-center") == "vision"
    await eventually(labelled, within=120, what="the upgraded policies to apply without a restart")
    assert await _webhook_restarts(kube) == before_pods  # same pods, no restart
    assert await _ca_bundles(kube) == before_ca  # the caBundle survived the upgrade

    await asyncio.to_thread(run_helm, node_cluster, "rollback", RELEASE, "1", "--namespace",
                            NAMESPACE, "--wait", "--timeout", "3m")

    async def unlabelled() -> bool:
        return "cost-center" not in await probe_labels(kube, ns)
    await eventually(unlabelled, within=120, what="the rollback to restore the old policies")
    assert await _ca_bundles(kube) == before_ca


async def _job_pods(kube: KubeApi, ns: str, job: str) -> list[dict[str, Any]]:
    """The job's 5 pods, once the Job controller has made its launcher."""
    async def all_there() -> list[dict[str, Any]] | None:
        pods = await pods_of(kube, ns, job)
        return pods if len(pods) == 5 else None
    found: list[dict[str, Any]] = await eventually(all_there, within=60,
                                                   what=f"{job}'s launcher pod")
    return found


def _without_gpus(job: dict[str, Any]) -> dict[str, Any]:
    """The job with no GPU limits: the audited job's pods are not gang-scheduled, and the
    default scheduler runs them beside the other tests' without taking GPUs."""
    for spec in job["spec"]["mpiReplicaSpecs"].values():
        for c in spec["template"]["spec"]["containers"]:
            c["resources"].pop("limits", None)
    return job


async def _roll(kube: KubeApi, cluster: NodeCluster, enforcement: str, marker: str) -> None:
    """`helm upgrade` with the rollout policies in `enforcement` mode, until every webhook
    replica has them."""
    values = release_values(cluster)
    values["policies"].update(rollout_policies(enforcement, marker))
    await asyncio.to_thread(run_helm, cluster, "upgrade", RELEASE, CHART, "--namespace",
                            NAMESPACE, "--values", str(_values_file(cluster, values)), "--wait",
                            "--timeout", "3m")

    await eventually(lambda: policies_everywhere(kube, cluster,
                                                 lambda: rollout_loaded(kube, marker)),
                     within=120, interval=1,
                     what=f"every replica's policies with the gang in {enforcement} mode")


async def _audit_events(kube: KubeApi, ns: str) -> list[dict[str, Any]]:
    return [e for e in (await kube.list(EVENTS, namespace=ns))["items"]
            if e.get("reason") == "PolicyAudit"]


async def test_a_policy_rolled_out_from_audit_to_enforce_by_helm_upgrade(
        kube: KubeApi, node_cluster: NodeCluster) -> None:
    """docs/policies.md, "Rolling out a policy": in audit mode the MPIJob's pods get no
    PodGroup and the job one PolicyAudit Event; after `helm upgrade` to enforce the next job
    gets its PodGroup, before its pods."""
    ns = await ensure_namespace(kube, ROLLOUT_NAMESPACE)
    await _roll(kube, node_cluster, "audit", "v1")
    audited = await submit(kube, _without_gpus(mpijob("audited", ns)))
    for pod in await _job_pods(kube, ns, "audited"):
        assert keys.COSCHEDULING_GROUP_LABEL not in pod["metadata"]["labels"]
    assert (await kube.list(COSCHEDULING_PODGROUPS, namespace=ns))["items"] == []
    [event] = await eventually(lambda: _audit_events(kube, ns), within=60,
                               what="the job's PolicyAudit Event")
    assert event["involvedObject"]["uid"] == audited["metadata"]["uid"]
    assert event["message"].startswith(
        f"policy rollout-gangs (audit) would set PodGroup {ns}/audited (coscheduling, "
        "minMember 5)")

    await _roll(kube, node_cluster, "enforce", "v2")
    await submit(kube, _without_gpus(mpijob("enforced", ns)))
    pods = await _job_pods(kube, ns, "enforced")
    group = await kube.get(COSCHEDULING_PODGROUPS, "enforced", namespace=ns)
    assert group["spec"]["minMember"] == 5
    for pod in pods:
        assert pod["metadata"]["labels"][keys.COSCHEDULING_GROUP_LABEL] == "enforced"
        # etcd revisions: the PodGroup was written before any member pod
        assert int(group["metadata"]["resourceVersion"]) < int(
            pod["metadata"]["resourceVersion"])
    assert len(await _audit_events(kube, ns)) == 1  # nothing audited any more
    for job in ("audited", "enforced"):  # their pods go with them (garbage collector)
        await kube.delete(MPIJOBS, job, namespace=ns, propagation_policy="Background")


def test_uninstall_removes_the_webhooks_first_and_leaves_nothing(
        node_cluster: NodeCluster) -> None:
    out = run_helm(node_cluster, "uninstall", RELEASE, "--namespace", NAMESPACE, "--wait",
                   "--timeout", "3m")
    assert "uninstalled" in out.stdout
    events = json.loads(kubectl(node_cluster, "get", "events", "-n", NAMESPACE,
                                "-o", "json").stdout)["items"]
    assert any(e["involvedObject"]["name"] == f"{RELEASE}-uninstall"
               and e["reason"] == "Completed" for e in events), "the pre-delete hook never ran"
    assert any(e["involvedObject"]["name"] == f"{RELEASE}-cleanup"
               and e["reason"] == "Completed" for e in events), "the post-delete hook never ran"
    deadline = time.monotonic() + 90  # the pods' grace period and preStop sleep
    while (ours := _left(node_cluster)) and time.monotonic() < deadline:
        time.sleep(1)
    assert ours == [], f"left behind after helm uninstall: {ours}"


def _left(cluster: NodeCluster) -> list[str]:
    """Every object of Muster's still there: in its namespace, and cluster-wide by name."""
    left = kubectl(cluster, "get", "all,configmaps,secrets,serviceaccounts,roles,"
                   "rolebindings,leases,poddisruptionbudgets,networkpolicies", "-n", NAMESPACE,
                   "-o", "name")
    ours = [n for n in left.stdout.split()
            if n not in ("serviceaccount/default", "configmap/kube-root-ca.crt")]
    cluster_wide = kubectl(cluster, "get", "clusterroles,clusterrolebindings,"
                           "mutatingwebhookconfigurations,validatingwebhookconfigurations",
                           "-o", "name").stdout.split()
    return ours + [n for n in cluster_wide if RELEASE in n.split("/", 1)[1]]
