"""`muster analyze`: a healthy cluster has no finding, and each misconfiguration makes exactly
its own finding fire (pure checks over a snapshot), then the command against the emulator."""

from __future__ import annotations

import asyncio
import base64
import copy
import dataclasses
import datetime as dt
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from reader_role import Requests, reader_rules

from webhook import keys
from webhook.analyze.collect import binder_levels, collect
from webhook.analyze.findings import Finding, Snapshot, analyze
from webhook.certs import generate_ca, issue_serving_cert
from webhook.cli import main
from webhook.demo import scenario
from webhook.doubles.emulator import ApiServerEmulator
from webhook.kube import KubeApi, make_api_client
from webhook.policy import load_policy_texts
from webhook.topology import builtin, codec

NOW = dt.datetime(2026, 11, 23, 12, 0, tzinfo=dt.UTC)
POLICY = """\
apiVersion: muster.io/v1alpha1
kind: SchedulingPolicy
metadata: {name: mpi-volcano}
spec:
  match: {namespaces: [team-a]}
  gang: {backend: volcano, queue: training}
"""
CA = generate_ca("analyze-ca", days=365, now=NOW - dt.timedelta(days=1))
SERVING = issue_serving_cert(CA, ["muster-webhook.muster-system.svc"], days=365,
                             now=NOW - dt.timedelta(days=1))
OTHER_CA = generate_ca("someone-else", days=365, now=NOW - dt.timedelta(days=1))


def configuration(ca_pem: bytes = CA.cert_pem, failure: str = "Ignore",
                  excluded: tuple[str, ...] = ("kube-system", "muster-system")
                  ) -> dict[str, Any]:
    return {"apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration", "metadata": {"name": "0-muster"},
            "webhooks": [{
                "name": "pods.muster.io", "failurePolicy": failure,
                "admissionReviewVersions": ["v1"], "sideEffects": "NoneOnDryRun",
                "clientConfig": {"caBundle": base64.b64encode(ca_pem).decode(), "service": {
                    "name": "muster-webhook", "namespace": "muster-system"}},
                "namespaceSelector": {"matchExpressions": [{
                    "key": "kubernetes.io/metadata.name", "operator": "NotIn",
                    "values": list(excluded)}]}}]}


def _calling(service: str, name: str = "a-muster") -> dict[str, Any]:
    """Muster's configuration, named `name`, its webhook calling Service `service`."""
    config = copy.deepcopy(configuration())
    config["metadata"]["name"] = name
    config["webhooks"][0]["clientConfig"]["service"]["name"] = service
    return config


def gpu_node(name: str, *, published: bool = True, tainted: bool = True,
             agent: str | None = None) -> dict[str, Any]:
    """A GPU node; `agent`: the agent pod (in muster-system, uid `uid-NAME`) its record names."""
    node = scenario.node(name)
    if published:
        node["metadata"]["annotations"] = {keys.ANN_NODE_TOPOLOGY: codec.encode(
            builtin("dgx1-v100"))}
    if agent is not None:
        node["metadata"].setdefault("annotations", {})[keys.ANN_GPU_AGENT] = keys.gpu_agent(
            "muster-system", agent, f"uid-{agent}")
    if tainted:
        node["spec"] = {"taints": [{"key": keys.TAINT_GPU_TOPOLOGY, "value": "enabled",
                                    "effect": "NoSchedule"}]}
    return node


def agent_pod(name: str, node: str, *, ready: bool = True, uid: str | None = None,
              deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "muster-system",
                            "uid": uid or f"uid-{name}",
                            "labels": {"app.kubernetes.io/component": "agent"}}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-23T11:59:00Z"
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"nodeName": node, "containers": [{"name": "agent", "image": "muster:1"}]},
            "status": {"phase": "Running", "conditions": [
                {"type": "Ready", "status": "True" if ready else "False"}]}}


def mpijob(name: str, uid: str, state: str | None = None) -> dict[str, Any]:
    job: dict[str, Any] = {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob",
                           "metadata": {"name": name, "namespace": "team-a", "uid": uid,
                                        "annotations": {}},
                           "spec": {"runPolicy": {"cleanPodPolicy": "Running"}}}
    if state:
        job["status"] = {"conditions": [{"type": state, "status": "True"}],
                         "completionTime": "2026-11-23T10:00:00Z"}
    return job


def podgroup(job: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
            "metadata": {"name": job["metadata"]["name"], "namespace": "team-a",
                         "labels": {"app.kubernetes.io/managed-by": "muster"},
                         "ownerReferences": [{"apiVersion": job["apiVersion"], "kind": "MPIJob",
                                              "name": job["metadata"]["name"],
                                              "uid": job["metadata"]["uid"],
                                              "controller": True}]},
            "spec": {"minMember": 5}}


def waiting_pod(age: int, reason: str | None = None) -> dict[str, Any]:
    conditions = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                   "message": reason}] if reason else []
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "w-0", "namespace": "team-a",
                         "creationTimestamp": (NOW - dt.timedelta(seconds=age)).strftime(
                             "%Y-%m-%dT%H:%M:%SZ"),
                         "annotations": {keys.ANN_GANG_NAME: "w", keys.ANN_GANG_MIN_MEMBER: "5",
                                         keys.ANN_GANG_TIMEOUT: "600"}},
            "status": {"phase": "Pending", "conditions": conditions}}


SHADOW = POLICY.replace("name: mpi-volcano", "name: again")
#: a policy that keeps a gang on one node, in team-a (the shipped mpi-topology's rule)
ONE_NODE = """\
apiVersion: muster.io/v1alpha1
kind: SchedulingPolicy
metadata: {name: mpi-topology}
spec:
  priority: 10
  match: {namespaces: [team-a]}
  gang: {backend: muster, minAvailable: auto}
  topology: {mode: required, singleNode: true}
"""
AUDITED = POLICY.replace("spec:\n", "spec:\n  enforcement: audit\n", 1)


def audit_event(message: str, job: str = "running", reason: str = "PolicyAudit",
                at: str = "2026-11-23T11:00:00Z") -> dict[str, Any]:
    """An Event as the webhook records it on a job for a policy in audit or warn mode."""
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{job}.{abs(hash(message)):x}", "namespace": "team-a"},
            "involvedObject": {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob",
                               "name": job, "namespace": "team-a", "uid": f"uid-{job}"},
            "reason": reason, "message": message, "type": "Normal", "count": 1,
            "firstTimestamp": at, "lastTimestamp": at}


WOULD = ("policy mpi-volcano (audit) would set PodGroup team-a/{job} (volcano, minMember 5, "
         "queue training); schedulerName volcano (first seen on pod {job}-worker-0)")


def endpoint_slice(*ready: bool | None, service: str = "muster-webhook") -> dict[str, Any]:
    """An EndpointSlice of `service` with an endpoint per `ready` (None: no ready condition)."""
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": f"{service}-abcde", "namespace": "muster-system",
                         "labels": {"kubernetes.io/service-name": service}},
            "addressType": "IPv4", "ports": [{"port": 8443}],
            "endpoints": [{"addresses": [f"10.0.0.{i + 1}"],
                           "conditions": {} if r is None else {"ready": r}}
                          for i, r in enumerate(ready)]}


def healthy() -> Snapshot:
    running = mpijob("running", "uid-running")
    return Snapshot(
        namespace="muster-system", webhook_configuration="0-muster", service="muster-webhook",
        binder_lease="muster-binder", policies=load_policy_texts({"p.yaml": POLICY}),
        crds=frozenset({"podgroups.scheduling.volcano.sh"}),
        queues={q: scenario.volcano_queue(q) for q in scenario.QUEUES},
        mutating=[configuration()],
        endpoint_slices=[endpoint_slice(True)],
        serving_cert=SERVING.cert_pem, nodes=[gpu_node("gpu-1", agent="agent-a")],
        agent_pods=[agent_pod("agent-a", "gpu-1")],
        podgroups=[("kubeflow.org/MPIJob", podgroup(running))],
        jobs={"uid-running": running},
        namespaces=[{"metadata": {"name": n, "labels": {}}} for n in ("team-a", "muster-system")],
        waiting_pods=[waiting_pod(age=30)],
        leases={"muster-binder": {"spec": {
            "holderIdentity": "muster-binder-abc", "leaseDurationSeconds": 15,
            "renewTime": (NOW - dt.timedelta(seconds=3)).isoformat()}}})


def test_a_healthy_cluster_has_no_finding() -> None:
    assert analyze(healthy(), NOW) == []


def _set(**changes: Any) -> Callable[[Snapshot], Snapshot]:
    return lambda s: dataclasses.replace(s, **changes)


def _unreadable_record(s: Snapshot) -> Snapshot:
    node = gpu_node("gpu-1")
    node["metadata"]["annotations"][keys.ANN_GPU_AGENT] = "a/b/c/d"
    return dataclasses.replace(s, nodes=[node])


def _gone_job(s: Snapshot) -> Snapshot:
    return dataclasses.replace(s, jobs={})


def _finished_job(s: Snapshot) -> Snapshot:
    done = mpijob("running", "uid-running", "Succeeded")
    return dataclasses.replace(s, jobs={"uid-running": done})


def _closed_queue(s: Snapshot) -> Snapshot:
    queues = dict(s.queues)
    queues["training"] = scenario.volcano_queue("training", "Closed")
    return dataclasses.replace(s, queues=queues)


def _job_names_missing_queue(s: Snapshot) -> Snapshot:
    job = copy.deepcopy(s.jobs["uid-running"])
    job["metadata"]["annotations"][keys.VOLCANO_QUEUE_ANNOTATION] = "nope"
    return dataclasses.replace(s, jobs={"uid-running": job})


def _short_ca(s: Snapshot) -> Snapshot:
    ca = generate_ca("short", days=20, now=NOW - dt.timedelta(days=1))
    serving = issue_serving_cert(ca, ["x"], days=365, now=NOW - dt.timedelta(days=1))
    return dataclasses.replace(s, mutating=[configuration(ca_pem=ca.cert_pem)],
                               serving_cert=serving.cert_pem)


def _fail_closed_namespaces(s: Snapshot) -> Snapshot:
    """The chart's entry for namespaces labelled fail-closed beside the default one: said, not
    warned of as a configuration that fails closed."""
    config = configuration()
    closed = copy.deepcopy(config["webhooks"][0])
    closed.update(name="pods-fail-closed.muster.io", failurePolicy="Fail")
    closed["clientConfig"]["service"]["path"] = keys.FAIL_CLOSED_PATH
    closed["namespaceSelector"]["matchExpressions"].append(
        {"key": "muster.io/admission", "operator": "In", "values": ["required"]})
    config["webhooks"].append(closed)
    return dataclasses.replace(s, mutating=[config])


CASES: list[tuple[str, Callable[[Snapshot], Snapshot], str, str]] = [
    ("backend", _set(crds=frozenset()), "BackendNotInstalled", "error"),
    ("queue missing", _set(queues={"default": scenario.volcano_queue("default")}),
     "QueueUnavailable", "error"),
    ("queue closed", _closed_queue, "QueueUnavailable", "error"),
    ("job's queue", _job_names_missing_queue, "QueueUnavailable", "warning"),
    ("after istio", _set(webhook_configuration="zz-muster", mutating=[
        {**configuration(), "metadata": {"name": "zz-muster"}},
        {"metadata": {"name": "istio-sidecar-injector"}, "webhooks": []}]),
     "WebhookAfterIstio", "warning"),
    # named by the admin's webhook.configurationNamePrefix: found by the Service it calls
    ("after istio, named by the admin", _set(mutating=[
        {**configuration(), "metadata": {"name": "zz-muster"}},
        {"metadata": {"name": "istio-sidecar-injector"}, "webhooks": []}]),
     "WebhookAfterIstio", "warning"),
    ("another Service's configuration", _set(mutating=[_calling("other")]),
     "WebhookNotInstalled", "error"),
    ("no configuration", _set(mutating=[]), "WebhookNotInstalled", "error"),
    ("fails closed", _set(mutating=[configuration(failure="Fail")]), "WebhookFailsClosed",
     "warning"),
    ("fail-closed namespaces", _fail_closed_namespaces, "FailClosedNamespaces", "info"),
    ("system namespaces", _set(mutating=[configuration(excluded=("muster-system",))]),
     "SystemNamespacesNotExcluded", "warning"),
    ("no endpoints", _set(endpoint_slices=[]), "WebhookNotReady", "error"),
    ("no ready endpoint", _set(endpoint_slices=[endpoint_slice(False), endpoint_slice()]),
     "WebhookNotReady", "error"),
    ("wrong caBundle", _set(mutating=[configuration(ca_pem=OTHER_CA.cert_pem)]),
     "CaBundleMismatch", "error"),
    ("expiring", _set(serving_cert=issue_serving_cert(
        CA, ["x"], days=10, now=NOW - dt.timedelta(days=1)).cert_pem),
     "CertificateExpiring", "warning"),
    # a serving certificate never outlives its CA: both say so
    ("CA expiring", _short_ca, "CaBundleExpiring+CertificateExpiring", "warning"),
    ("no topology", _set(nodes=[gpu_node("gpu-1", published=False)]), "TopologyNotPublished",
     "error"),
    ("no taint", _set(nodes=[gpu_node("gpu-1", tainted=False)]), "TopologyNodeNotTainted",
     "warning"),
    # the record outlived its agent: nothing will replace it
    ("agent gone", _set(agent_pods=[]), "GpuAgentGone", "error"),
    ("agent of another node", _set(agent_pods=[agent_pod("agent-a", "gpu-2")]),
     "GpuAgentGone", "error"),
    # a new agent on the node that has not registered yet, the old one going, or not Ready
    ("agent replaced", _set(agent_pods=[agent_pod("agent-b", "gpu-1")]),
     "GpuAgentNotServing", "warning"),
    ("agent restarted", _set(agent_pods=[agent_pod("agent-a", "gpu-1", uid="uid-2")]),
     "GpuAgentNotServing", "warning"),
    ("agent going", _set(agent_pods=[agent_pod("agent-a", "gpu-1", deleting=True),
                                     agent_pod("agent-b", "gpu-1", ready=False)]),
     "GpuAgentNotServing", "warning"),
    ("agent not Ready", _set(agent_pods=[agent_pod("agent-a", "gpu-1", ready=False)]),
     "GpuAgentNotServing", "warning"),
    ("record names no pod", _unreadable_record, "GpuAgentNotServing", "warning"),
    ("orphaned PodGroup", _gone_job, "PodGroupOrphaned", "warning"),
    ("finished job's PodGroup", _finished_job, "PodGroupOfFinishedJob", "warning"),
    ("no binder leader", _set(leases={}), "BinderNotLeading", "error"),
    ("matches nothing", _set(namespaces=[{"metadata": {"name": "other"}}]),
     "PolicyMatchesNothing", "warning"),
    ("shadowed", _set(policies=load_policy_texts({"p.yaml": POLICY, "q.yaml": SHADOW})),
     "PolicyShadowed", "warning"),
    ("gang waiting", _set(waiting_pods=[waiting_pod(age=900, reason="0/3 nodes fit")]),
     "GangWaiting", "warning"),
    ("not enforced", _set(policies=load_policy_texts({"p.yaml": AUDITED})), "PolicyNotEnforced",
     "info"),
    # a policy in audit mode decides nothing, so it shadows nothing either
    ("shadowed by an audit", _set(policies=load_policy_texts({"p.yaml": AUDITED,
                                                              "q.yaml": SHADOW})),
     "PolicyNotEnforced", "info"),
]


def test_the_fail_closed_entry_names_the_namespaces_that_carry_its_label() -> None:
    [unlabelled] = analyze(_fail_closed_namespaces(healthy()), NOW)
    assert unlabelled.message.endswith(
        "pods of namespaces labelled muster.io/admission=required are refused while Muster "
        "cannot apply their policies (failurePolicy Fail): no namespace carries it yet")
    labelled = dataclasses.replace(_fail_closed_namespaces(healthy()), namespaces=[
        {"metadata": {"name": n, "labels": {"muster.io/admission": value}}}
        for n, value in [*((f"team-{i}", "required") for i in range(7)), ("other", "no")]])
    [found] = [f for f in analyze(labelled, NOW) if f.code == "FailClosedNamespaces"]
    assert found.message.endswith(": team-0, team-1, team-2, team-3, team-4 and 2 more")


def test_an_unreachable_webhook_is_said_to_refuse_where_its_entry_fails_closed() -> None:
    """Without endpoints (or with a caBundle that fails TLS) the API server admits the default
    entry's pods unchanged and refuses the fail-closed entry's: each finding says both."""
    down = dataclasses.replace(_fail_closed_namespaces(healthy()), endpoint_slices=[])
    [found] = [f for f in analyze(down, NOW) if f.code == "WebhookNotReady"]
    assert found.message == (
        "no Ready webhook endpoint: after the webhook's timeout, pods are admitted unchanged "
        "(failurePolicy Ignore); pods in namespaces labelled muster.io/admission=required are "
        "refused (failurePolicy Fail)")
    [only] = [f for f in analyze(dataclasses.replace(healthy(), endpoint_slices=[]), NOW)
              if f.code == "WebhookNotReady"]
    assert only.message.endswith("pods are admitted unchanged (failurePolicy Ignore)")
    config = _fail_closed_namespaces(healthy()).mutating[0]
    for hook in config["webhooks"]:
        hook["clientConfig"]["caBundle"] = base64.b64encode(OTHER_CA.cert_pem).decode()
    tls = dataclasses.replace(healthy(), mutating=[config])
    assert [f.message.rpartition(": ")[2] for f in analyze(tls, NOW)
            if f.code == "CaBundleMismatch"] == [
        "every call fails TLS and pods are admitted unchanged (failurePolicy Ignore)",
        "every call fails TLS and pods in namespaces labelled muster.io/admission=required are "
        "refused (failurePolicy Fail)"]


@pytest.mark.parametrize(("what", "breaks", "code", "severity"), CASES,
                         ids=[c[0] for c in CASES])
def test_each_misconfiguration_makes_its_own_finding(
        what: str, breaks: Callable[[Snapshot], Snapshot], code: str, severity: str) -> None:
    findings = analyze(breaks(healthy()), NOW)
    assert [(f.code, f.severity) for f in findings] == [(c, severity) for c in code.split("+")], \
        what
    assert findings[0].fix and findings[0].object


def test_a_configuration_named_by_the_admin_is_muster_s_by_the_service_it_calls() -> None:
    """`webhook.configurationNamePrefix` is the admin's to set: the configuration is found by
    the Service its webhooks call, not only by the name the chart gives it by default."""
    assert analyze(dataclasses.replace(healthy(), mutating=[_calling("muster-webhook")]),
                   NOW) == []


def test_an_endpoint_of_unknown_readiness_counts_as_ready() -> None:
    """The EndpointSlice API says a missing ready condition is to be read as ready."""
    either = dataclasses.replace(healthy(), endpoint_slices=[endpoint_slice(False, None)])
    assert [f.code for f in analyze(either, NOW)] == []


async def test_the_command_reads_a_cluster_and_gates_on_errors(
        tmp_path: Path, shared_crds: list[dict[str, Any]],
        capsys: pytest.CaptureFixture[str]) -> None:
    api = ApiServerEmulator(crds=shared_crds)
    for obj in [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}}
                for n in ("muster-system", "team-a")]:
        api.seed(obj)
    api.seed({"apiVersion": "v1", "kind": "ConfigMap",
              "metadata": {"name": "muster-policies", "namespace": "muster-system"},
              "data": {"p.yaml": POLICY}})
    api.seed(configuration())
    api.seed(gpu_node("gpu-1", tainted=False))
    gone = mpijob("gone", "uid-gone")
    api.seed(podgroup(gone))  # its job was never there
    async with api:
        kubeconfig = api.write_kubeconfig(tmp_path / "kc")

        async def run(*flags: str) -> tuple[int, str, str]:
            # the CLI runs its own event loop: from a thread, beside the emulator's
            code = await asyncio.to_thread(main, ["analyze", "--kubeconfig", str(kubeconfig),
                                                  *flags])
            out, err = capsys.readouterr()
            return code, out, err

        code, out, _ = await run("--output", "json")
        listed = json.loads(out)
        found = {(f["code"], f["object"]) for f in listed}
        assert code == 1  # errors found
        assert ("QueueUnavailable", "SchedulingPolicy/mpi-volcano") in found  # no queues at all
        assert ("WebhookNotReady", "Service/muster-system/muster-webhook") in found
        assert ("TopologyNodeNotTainted", "Node/gpu-1") in found
        assert ("PodGroupOrphaned", "PodGroup/team-a/gone") in found
        assert not any(c == "BinderNotLeading" for c, _ in found)  # no binder Deployment here
        # the errors accepted on purpose: the warnings are left, and pass the default gate
        accepted = ("-S", "QueueUnavailable", "--suppress",
                    "WebhookNotReady=Service/muster-system/*")
        code, out, err = await run(*accepted)
        assert code == 0 and "ERROR" not in out and "TopologyNodeNotTainted" in out
        accepted_errors = sum(f["code"] in ("QueueUnavailable", "WebhookNotReady")
                              for f in listed)
        assert err.endswith(f"{len(listed) - accepted_errors} finding(s), {accepted_errors} "
                            "suppressed\n")
        code, _, _ = await run(*accepted, "--failure-threshold", "warning")
        assert code == 1
        code, out, err = await run("--output-threshold", "error")
        assert code == 1 and "WARNING" not in out
        assert "below --output-threshold error" in err
        code, _, err = await run("--suppress", "=Node/gpu-1")
        assert code == 2 and "give CODE or CODE=OBJECT" in err


def test_a_waiting_gang_carries_the_binders_reason() -> None:
    snap = dataclasses.replace(healthy(), waiting_pods=[waiting_pod(900, "0/3 nodes fit")])
    [finding] = analyze(snap, NOW)
    assert "past its 600 s timeout: 0/3 nodes fit" in finding.message
    assert finding.object == "Pod/team-a/w-0"


@pytest.mark.parametrize(("said", "fix"), [
    # the binder's own words (tests/binder: test_events, test_planner)
    ("gang team-a/w cannot be placed: waiting for members: 2 of minMember 5 exist",
     "its other pods do not exist"),
    ("gang team-a/w cannot be placed: queued behind gang team-a/big, which has waited longer "
     "than 60s for resources", "an older gang holds the room back"),
    ("gang team-a/w cannot be placed: gang team-a/w needs 16 GPUs (2 members x 8 GPUs) within "
     "one rack; the largest free one (rack r1) has 8 free GPUs", "free the resources it needs"),
    (None, "app.kubernetes.io/component=binder"),
])
def test_a_waiting_gangs_fix_follows_what_it_waits_for(said: str | None, fix: str) -> None:
    snap = dataclasses.replace(healthy(), waiting_pods=[waiting_pod(900, said)])
    [finding] = analyze(snap, NOW)
    assert fix in finding.fix
    assert (said or "the binder has not said why") in finding.message


def test_a_coscheduling_scheduler_nobody_runs() -> None:
    policy = POLICY.replace("backend: volcano, queue: training",
                            "backend: coscheduling, schedulerName: plugins")
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "p", "namespace": "team-a",
                        "creationTimestamp": (NOW - dt.timedelta(seconds=300)).strftime(
                            "%Y-%m-%dT%H:%M:%SZ")},
           "spec": {"schedulerName": "plugins"}, "status": {"phase": "Pending"}}
    base = dataclasses.replace(healthy(), policies=load_policy_texts({"p.yaml": policy}),
                               crds=frozenset({"podgroups.scheduling.x-k8s.io"}))
    [finding] = analyze(dataclasses.replace(base, unscheduled_pods=[pod]), NOW)
    assert (finding.code, finding.object) == ("SchedulerNotRunning", "Scheduler/plugins")
    # a scheduler that looked at the pod (and could not place it) is running
    seen = copy.deepcopy(pod)
    seen["status"]["conditions"] = [{"type": "PodScheduled", "status": "False"}]
    assert analyze(dataclasses.replace(base, unscheduled_pods=[seen]), NOW) == []
    young = copy.deepcopy(pod)
    young["metadata"]["creationTimestamp"] = NOW.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert analyze(dataclasses.replace(base, unscheduled_pods=[young]), NOW) == []


def test_a_policy_not_enforced_is_told_what_its_events_say_it_would_do() -> None:
    base = dataclasses.replace(healthy(), policies=load_policy_texts({"p.yaml": AUDITED}))
    [alone] = analyze(base, NOW)
    assert alone.message == (
        "in audit mode: it changes no pod. Its PolicyAudit Events name no workload it matched "
        "yet (Events last the API server's --event-ttl, 1 h by default)")
    assert "spec.enforcement: enforce" in alone.fix and "helm upgrade" in alone.fix
    events = [audit_event(WOULD.format(job="old"), "old", at="2026-11-23T10:00:00Z"),
              audit_event(WOULD.format(job="new"), "new"),
              audit_event("policy mpi-volcano (audit) matches but would change nothing (first "
                          "seen on pod x-0)", "x"),
              audit_event("policy other (warn) would set label a=b (first seen on pod y-0)"),
              audit_event(WOULD.format(job="z"), "z", reason="Scheduled")]
    [told] = analyze(dataclasses.replace(base, audit_events=events), NOW)
    assert (told.code, told.severity, told.object) == (
        "PolicyNotEnforced", "info", "SchedulingPolicy/mpi-volcano")
    assert told.message == (
        "in audit mode: it changes no pod. Its PolicyAudit Events name 2 workload(s) it would "
        "change and 1 it matches without changing, e.g. MPIJob team-a/new: "
        + WOULD.format(job="new"))
    warned = dataclasses.replace(base, policies=load_policy_texts(
        {"p.yaml": AUDITED.replace("audit", "warn")}), audit_events=events[2:3])
    [told] = analyze(warned, NOW)
    assert told.message == (
        "in warn mode: it changes no pod and warns whoever creates one it matches. Its "
        "PolicyAudit Events name 1 workload(s) it matches, none of which it would change (the "
        "enforced policies already do it, or override it)")


# --- the same findings on a cluster set up to have them (emulator, through `collect`) ----------

def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def cluster_objects(ca: Any = None, serving: Any = None) -> list[dict[str, Any]]:
    """A healthy cluster with Muster installed (release muster in muster-system)."""
    now = _now()
    ca = ca or generate_ca("analyze-live-ca", days=365)
    serving = serving or issue_serving_cert(ca, ["muster-webhook.muster-system.svc"], days=365)
    running = mpijob("running", "uid-running")
    return [
        *({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}}
          for n in ("muster-system", "team-a")),
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": {"name": "muster-policies", "namespace": "muster-system"},
         "data": {"p.yaml": POLICY}},
        *(scenario.volcano_queue(q) for q in scenario.QUEUES),
        configuration(ca_pem=ca.cert_pem),
        endpoint_slice(True),
        {"apiVersion": "v1", "kind": "Secret",
         "metadata": {"name": "muster-webhook-tls", "namespace": "muster-system"},
         "data": {"tls.crt": base64.b64encode(serving.cert_pem).decode()}},
        gpu_node("gpu-1"), running, podgroup(running),
        {"apiVersion": "apps/v1", "kind": "Deployment",
         "metadata": {"name": "muster-binder", "namespace": "muster-system"},
         "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {
             "metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c"}]}}}},
        {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
         "metadata": {"name": "muster-binder", "namespace": "muster-system"},
         "spec": {"holderIdentity": "muster-binder-abc", "leaseDurationSeconds": 15,
                  "renewTime": now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")}},
    ]


def _replace(kind: str, name: str, new: dict[str, Any] | None
             ) -> Callable[[list[dict[str, Any]]], list[dict[str, Any]]]:
    def change(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        kept = [o for o in objs if not (o.get("kind") == kind
                                        and o["metadata"]["name"] == name)]
        return kept + ([new] if new is not None else [])
    return change


def _add(*new: dict[str, Any]) -> Callable[[list[dict[str, Any]]], list[dict[str, Any]]]:
    return lambda objs: [*objs, *new]


def _config(**kw: Any) -> Callable[[list[dict[str, Any]]], list[dict[str, Any]]]:
    def change(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        bundle = next(o for o in objs if o.get("kind") == "MutatingWebhookConfiguration")
        ca_pem = base64.b64decode(bundle["webhooks"][0]["clientConfig"]["caBundle"])
        return _replace("MutatingWebhookConfiguration", "0-muster",
                        configuration(**{"ca_pem": ca_pem, **kw}))(objs)
    return change


def _job(**status: Any) -> Callable[[list[dict[str, Any]]], list[dict[str, Any]]]:
    job = mpijob("running", "uid-running", status.get("state"))
    job["metadata"]["annotations"].update(status.get("annotations") or {})
    return _replace("MPIJob", "running", job)


def _expiring(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    ca = generate_ca("short", days=20)
    return cluster_objects(ca, issue_serving_cert(ca, ["x"], days=20))


def _stuck_pod(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A binder pod with a 1 s gang timeout (the test waits past it: the emulator stamps
    creationTimestamp itself)."""
    pod = waiting_pod(0, "0/3 nodes fit")
    pod["metadata"]["annotations"][keys.ANN_GANG_TIMEOUT] = "1"
    pod["spec"] = {"schedulerName": keys.DEFAULT_BINDER_SCHEDULER_NAME,
                   "containers": [{"name": "c"}]}
    return [*objs, pod]


def kueue_queues(topology: str | None, ns: str = "team-a") -> list[dict[str, Any]]:
    """Kueue's flavor `gpus` (of Topology `topology`: Kueue places by it), ClusterQueue
    `training` of it and LocalQueue `team` in `ns`, as Kueue's API serves them."""
    api = "kueue.x-k8s.io/v1beta2"
    flavor: dict[str, Any] = {"nodeLabels": {"pool": "gpu"}}
    if topology is not None:
        flavor["topologyName"] = topology
    return [{"apiVersion": api, "kind": "ResourceFlavor", "metadata": {"name": "gpus"},
             "spec": flavor},
            {"apiVersion": api, "kind": "ClusterQueue", "metadata": {"name": "training"},
             "spec": {"namespaceSelector": {}, "resourceGroups": [{
                 "coveredResources": [keys.GPU_RESOURCE],
                 "flavors": [{"name": "gpus", "resources": [
                     {"name": keys.GPU_RESOURCE, "nominalQuota": "8"}]}]}]}},
            {"apiVersion": api, "kind": "LocalQueue",
             "metadata": {"name": "team", "namespace": ns},
             "spec": {"clusterQueue": "training"}}]


def _kueue_tas(topology: str | None, policy: str = ONE_NODE
               ) -> Callable[[list[dict[str, Any]]], list[dict[str, Any]]]:
    def change(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return _replace("ConfigMap", "muster-policies", {
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "muster-policies", "namespace": "muster-system"},
            "data": {"p.yaml": POLICY, "q.yaml": policy}})(objs) + kueue_queues(topology)
    return change


def _hypernode(name: str, *members: dict[str, Any], tier: int = 1) -> dict[str, Any]:
    return {"apiVersion": "topology.volcano.sh/v1alpha1", "kind": "HyperNode",
            "metadata": {"name": name}, "spec": {"tier": tier, "members": list(members)}}


def _levels_binder(levels: str, objects: list[dict[str, Any]]
                   ) -> Callable[[list[dict[str, Any]]], list[dict[str, Any]]]:
    """A binder with `--network-levels=<levels>` (the chart's binder.networkLevels), and the
    objects that give them (HyperNodes, a Topology)."""
    def change(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = copy.deepcopy(objs)
        for o in out:
            if o["kind"] == "Deployment" and o["metadata"]["name"] == "muster-binder":
                o["spec"]["template"]["spec"]["containers"][0]["args"] = [
                    "bind", f"--network-levels={levels}"]
        return [*out, *objects]
    return change


def _hypernode_binder(hypernodes: list[dict[str, Any]]
                      ) -> Callable[[list[dict[str, Any]]], list[dict[str, Any]]]:
    """A binder whose levels are Volcano's HyperNodes (the chart's networkLevels: volcano),
    and these HyperNodes."""
    return _levels_binder("volcano", hypernodes)


def _kai_topology(*levels: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "kai.scheduler/v1alpha1", "kind": "Topology",
            "metadata": {"name": "cluster"}, "spec": {"levels": list(levels)}}


async def findings_of(api: ApiServerEmulator, tmp_path: Path) -> list[Finding]:
    """Start the seeded emulator, read it as `muster analyze` does, and workload_of."""
    async with api:
        client = await make_api_client(str(api.write_kubeconfig(tmp_path / "kc")))
        try:
            snapshot = await collect(KubeApi(client), "muster-system", "muster")
        finally:
            await client.close()
    return analyze(snapshot, _now())


LIVE: list[tuple[str, Callable[[list[dict[str, Any]]], list[dict[str, Any]]], str]] = [
    ("healthy", lambda objs: objs, ""),
    ("queue missing", _replace("Queue", "training", None), "QueueUnavailable"),
    ("queue closed", _replace("Queue", "training", scenario.volcano_queue("training", "Closed")),
     "QueueUnavailable"),
    ("job's queue", _job(annotations={keys.VOLCANO_QUEUE_ANNOTATION: "nope"}),
     "QueueUnavailable"),
    ("no configuration", _replace("MutatingWebhookConfiguration", "0-muster", None),
     "WebhookNotInstalled"),
    ("fails closed", _config(failure="Fail"), "WebhookFailsClosed"),
    ("system namespaces", _config(excluded=("muster-system",)), "SystemNamespacesNotExcluded"),
    ("no endpoints", _replace("EndpointSlice", "muster-webhook-abcde", None), "WebhookNotReady"),
    ("only another Service's endpoints", _replace("EndpointSlice", "muster-webhook-abcde",
                                                  endpoint_slice(True, service="other")),
     "WebhookNotReady"),
    ("wrong caBundle", _config(ca_pem=OTHER_CA.cert_pem), "CaBundleMismatch"),
    ("expiring", _expiring, "CaBundleExpiring+CertificateExpiring"),
    ("no topology", _replace("Node", "gpu-1", gpu_node("gpu-1", published=False)),
     "TopologyNotPublished"),
    ("no taint", _replace("Node", "gpu-1", gpu_node("gpu-1", tainted=False)),
     "TopologyNodeNotTainted"),
    ("orphaned PodGroup", _replace("MPIJob", "running", None), "PodGroupOrphaned"),
    ("finished job's PodGroup", _job(state="Succeeded"), "PodGroupOfFinishedJob"),
    ("no binder leader", _replace("Lease", "muster-binder", None), "BinderNotLeading"),
    ("matches nothing", _replace("ConfigMap", "muster-policies", {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "muster-policies", "namespace": "muster-system"},
        "data": {"p.yaml": POLICY.replace("[team-a]", "[team-z]")}}), "PolicyMatchesNothing"),
    ("shadowed", _replace("ConfigMap", "muster-policies", {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "muster-policies", "namespace": "muster-system"},
        "data": {"p.yaml": POLICY, "q.yaml": SHADOW}}), "PolicyShadowed"),
    ("gang waiting", _stuck_pod, "GangWaiting"),
    ("no HyperNode holds a GPU node", _hypernode_binder([_hypernode(
        "leaf", {"type": "Node", "selector": {"exactMatch": {"name": "gpu-9"}}})]),
     "HyperNodeMissing"),
    ("the HyperNodes hold every GPU node", _hypernode_binder([_hypernode(
        "leaf", {"type": "Node", "selector": {"regexMatch": {"pattern": "^gpu-"}}})]), ""),
    ("the binder's KAI Topology is missing", _levels_binder("kai:cluster", []),
     "NetworkTopologyMissing"),
    ("the binder's KAI Topology cannot be read", _levels_binder("kai:cluster", [_kai_topology(
        {"nodeLabel": "example.com/rack", "alias": "kubernetes.io/hostname"})]),
     "NetworkTopologyUnread"),
    # its levels are the binder's: the GPU nodes lack the rack label
    ("the binder's KAI Topology names a label the nodes lack", _levels_binder(
        "kai:cluster", [_kai_topology({"nodeLabel": "example.com/rack", "alias": "rack"})]),
     "NetworkLevelMissing"),
    ("the binder's KAI Topology", _levels_binder("kai:cluster", [_kai_topology(
        {"nodeLabel": "kubernetes.io/hostname"})]), ""),
    ("not enforced", _replace("ConfigMap", "muster-policies", {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "muster-policies", "namespace": "muster-system"},
        "data": {"p.yaml": AUDITED}}), "PolicyNotEnforced"),
    ("a single-node policy beside Kueue TAS queues", _kueue_tas("racks"),
     "SingleNodeBesideKueueTAS"),
    ("a single-node policy beside Kueue queues without TAS", _kueue_tas(None), ""),
    ("a preferred single-node policy beside Kueue TAS queues", _kueue_tas(
        "racks", ONE_NODE.replace("mode: required", "mode: preferred")), ""),
]


@pytest.mark.parametrize(("what", "breaks", "codes"), LIVE, ids=[c[0] for c in LIVE])
async def test_each_finding_on_a_cluster_set_up_to_have_it(
        what: str, breaks: Callable[[list[dict[str, Any]]], list[dict[str, Any]]], codes: str,
        shared_crds: list[dict[str, Any]], tmp_path: Path) -> None:
    api = ApiServerEmulator(crds=shared_crds)
    objs = breaks(cluster_objects())
    uids = {}  # the emulator gives seeded objects their own uid: owner references follow
    for obj in (o for o in objs if o["kind"] != "PodGroup"):
        uids[obj["metadata"].get("uid")] = api.seed(obj)["metadata"]["uid"]
    for pg in (o for o in objs if o["kind"] == "PodGroup"):
        for ref in pg["metadata"]["ownerReferences"]:
            ref["uid"] = uids.get(ref["uid"], ref["uid"])
        api.seed(pg)
    if any(o["kind"] == "Pod" for o in objs):
        await asyncio.sleep(1.2)  # past the pod's gang timeout
    found = sorted(f.code for f in await findings_of(api, tmp_path))
    assert found == sorted(filter(None, codes.split("+"))), what


READER_CASES = {"healthy": lambda objs: objs,
                "volcano levels": _hypernode_binder([]),
                "kai levels": _levels_binder("kai:cluster", []),
                "kueue levels and queues": lambda objs: _levels_binder("kueue:cluster", [])(
                    _kueue_tas("racks")(objs)),
                "audit mode": _replace("ConfigMap", "muster-policies", {
                    "apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": "muster-policies", "namespace": "muster-system"},
                    "data": {"p.yaml": AUDITED}})}


@pytest.mark.parametrize("case", READER_CASES)
async def test_the_charts_reader_role_allows_every_read_analyze_makes(
        case: str, shared_crds: list[dict[str, Any]], tmp_path: Path) -> None:
    """What `muster analyze` reads, on each path its checks take, is what the chart's reader
    ClusterRole allows (held to its rules as RBAC would; the real tier runs the command as a
    ServiceAccount bound to it)."""
    api = ApiServerEmulator(crds=shared_crds)
    for obj in (o for o in READER_CASES[case](cluster_objects()) if o["kind"] != "PodGroup"):
        api.seed(obj)
    async with api:
        client = await make_api_client(str(api.write_kubeconfig(tmp_path / "kc")))
        try:
            kube = KubeApi(client)
            requests = Requests(kube)
            await collect(kube, "muster-system", "muster")
        finally:
            await client.close()
    rules = reader_rules()
    assert len(requests.made) > 20 and requests.refused_by(rules) == []
    # the check can fail: without its rule for the webhook's endpoints, a read is refused
    narrowed = [r for r in rules if "endpointslices" not in r["resources"]]
    assert requests.refused_by(narrowed) == ["list discovery.k8s.io/endpointslices"]


async def test_the_certificate_checked_is_the_one_the_webhook_mounts(
        shared_crds: list[dict[str, Any]], tmp_path: Path) -> None:
    """certs.mode external: the webhook's Deployment mounts the admin's Secret; its certificate
    is the one checked, not a stale `-tls` Secret beside it."""
    ca = generate_ca("analyze-live-ca", days=365)
    objs = cluster_objects(ca)  # its `muster-webhook-tls` is good for a year
    short = issue_serving_cert(ca, ["muster-webhook.muster-system.svc"], days=20)
    objs += [{"apiVersion": "v1", "kind": "Secret",
              "metadata": {"name": "admin-tls", "namespace": "muster-system"},
              "data": {"tls.crt": base64.b64encode(short.cert_pem).decode()}},
             {"apiVersion": "apps/v1", "kind": "Deployment",
              "metadata": {"name": "muster-webhook", "namespace": "muster-system"},
              "spec": {"selector": {"matchLabels": {"a": "w"}}, "template": {
                  "metadata": {"labels": {"a": "w"}},
                  "spec": {"containers": [{
                      "name": "webhook", "args": ["serve", "--tls-cert-file", "/etc/tls/tls.crt"],
                      "volumeMounts": [{"name": "policies", "mountPath": "/etc/policies"},
                                       {"name": "certs", "mountPath": "/etc/tls"}]}],
                      "volumes": [{"name": "policies", "configMap": {"name": "p"}},
                                  {"name": "certs", "secret": {"secretName": "admin-tls"}}]}}}}]
    api = ApiServerEmulator(crds=shared_crds)
    for obj in (o for o in objs if o["kind"] != "PodGroup"):
        api.seed(obj)
    [finding] = await findings_of(api, tmp_path)
    assert (finding.code, finding.object) == ("CertificateExpiring",
                                              "Secret/muster-system/admin-tls")


async def test_a_policy_not_enforced_on_a_cluster_with_its_events(
        shared_crds: list[dict[str, Any]], tmp_path: Path) -> None:
    api = ApiServerEmulator(crds=shared_crds)
    objs = _replace("ConfigMap", "muster-policies", {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "muster-policies", "namespace": "muster-system"},
        "data": {"p.yaml": AUDITED}})(cluster_objects())
    for obj in (o for o in objs if o["kind"] != "PodGroup"):
        api.seed(obj)
    api.seed(audit_event(WOULD.format(job="running")))
    api.seed(audit_event(WOULD.format(job="other"), "other", reason="Scheduled"))
    [finding] = await findings_of(api, tmp_path)
    assert finding.code == "PolicyNotEnforced"
    assert "name 1 workload(s) it would change, e.g. MPIJob team-a/running: policy mpi-volcano " \
        "(audit) would set PodGroup" in finding.message


async def test_a_backend_without_its_crd_on_a_cluster(shared_crds: list[dict[str, Any]],
                                                      tmp_path: Path) -> None:
    crds = [c for c in shared_crds if c["metadata"]["name"] != "podgroups.scheduling.volcano.sh"]
    api = ApiServerEmulator(crds=crds)
    for obj in cluster_objects():
        if obj["kind"] != "PodGroup":
            api.seed(obj)
    assert [f.code for f in await findings_of(api, tmp_path)] == ["BackendNotInstalled"]



NATIVE_POLICY = """\
apiVersion: muster.io/v1alpha1
kind: SchedulingPolicy
metadata: {name: mpi-native}
spec:
  match: {namespaces: [team-a]}
  gang: {backend: kubernetes%s}
"""


@pytest.mark.parametrize(("served", "extra", "expected"), [
    ("v1beta1", "", ("NativeGangs", "info", "serves scheduling.k8s.io/v1beta1")),
    ("v1alpha1", "", ("NativeGangs", "info", "serves scheduling.k8s.io/v1alpha1")),
    (None, "", ("WorkloadApiNotServed", "error", "pods are refused")),
    (None, ", unavailableApi: WithoutGang",
     ("WorkloadApiNotServed", "warning", "admitted without a gang")),
])
async def test_a_native_gang_policy_is_reported_with_what_the_cluster_serves(
        served: str | None, extra: str, expected: tuple[str, str, str],
        shared_crds: list[dict[str, Any]], tmp_path: Path) -> None:
    api = ApiServerEmulator(crds=shared_crds, workload_api=served)
    objs = _replace("ConfigMap", "muster-policies", {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "muster-policies", "namespace": "muster-system"},
        "data": {"p.yaml": NATIVE_POLICY % extra}})(cluster_objects())
    for obj in (o for o in objs if o["kind"] != "PodGroup"):
        api.seed(obj)
    found = [f for f in await findings_of(api, tmp_path)
             if f.code in ("NativeGangs", "WorkloadApiNotServed")]
    code, severity, words = expected
    assert [(f.code, f.severity) for f in found] == [(code, severity)]
    assert words in found[0].message and found[0].object == "SchedulingPolicy/mpi-native"


NETWORK = """\
apiVersion: muster.io/v1alpha1
kind: SchedulingPolicy
metadata: {name: racks}
spec:
  match: {namespaces: [team-b]}
  gang: {backend: muster}
  topology:
    mode: preferred
    network: {required: example.com/rack, slice: {level: kubernetes.io/hostname, size: 2}}
"""


def test_a_single_node_policy_where_kueue_places_by_its_topology() -> None:
    """Kueue's TAS may spread a gang over nodes; a policy that keeps it on one node then
    leaves it waiting: said before any job meets it, with the queue and how Kueue places it."""
    kueue: dict[str, list[dict[str, Any]]] = {}
    for obj in kueue_queues("racks") + kueue_queues("racks", "team-b")[2:]:
        kueue.setdefault(obj["kind"].lower() + "s", []).append(obj)  # (the plurals)
    names = [{"metadata": {"name": n, "labels": {}}} for n in ("team-a", "team-b")]
    s = dataclasses.replace(healthy(), namespaces=names, kueue=kueue, policies=load_policy_texts(
        {"p.yaml": POLICY, "q.yaml": ONE_NODE.replace("[team-a]", "[team-a, team-b]")}))
    found = [f for f in analyze(s, NOW) if f.code == "SingleNodeBesideKueueTAS"]
    assert [(f.severity, f.object, f.message) for f in found] == [(
        "warning", "SchedulingPolicy/mpi-topology",
        "it keeps a gang on one node (topology.singleNode, mode required) in namespace team-a, "
        "whose LocalQueue team (ClusterQueue training, flavor gpus of Topology racks) is placed "
        "by Kueue's topology-aware scheduling (and 1 more LocalQueues): a gang Kueue spreads "
        "over nodes waits unbound, and waitForPodsReady evicts it")]
    assert "podset-required-topology: kubernetes.io/hostname" in found[0].fix
    # no queue of a Topology's flavor in the namespaces it matches: nothing to say
    other = dataclasses.replace(s, policies=load_policy_texts({"q.yaml": ONE_NODE.replace(
        "[team-a]", "[team-c]")}))
    assert not [f for f in analyze(other, NOW) if f.code == "SingleNodeBesideKueueTAS"]


def test_gpu_nodes_without_a_label_a_network_policy_names() -> None:
    labelled = gpu_node("gpu-2")
    labelled["metadata"]["labels"]["example.com/rack"] = "r1"
    s = healthy()
    s.policies = load_policy_texts({"p.yaml": POLICY, "n.yaml": NETWORK})
    s.nodes = [gpu_node("gpu-1"), labelled, scenario.node("gpu-3")]
    [finding] = [f for f in analyze(s, NOW) if f.code == "NetworkLabelMissing"]
    assert finding.severity == "warning" and finding.object == "SchedulingPolicy/racks"
    assert "2 GPU node(s) lack the label example.com/rack" in finding.message
    assert "(gpu-1, gpu-3)" in finding.message  # the hostname level is every node's
    # a policy may name a level by the alias the binder's levels give it
    s.policies = load_policy_texts({"p.yaml": POLICY, "n.yaml": NETWORK.replace(
        "required: example.com/rack", "required: rack")})
    [aliased] = [f for f in analyze(s, NOW) if f.code == "NetworkLabelMissing"]
    assert "lack the label rack " in aliased.message  # unknown to analyze: a label
    s.levels = binder_levels({"spec": {"template": {"spec": {"containers": [{"args": [
        "bind", "--network-levels=block=example.com/block,rack=example.com/rack"]}]}}}})
    [aliased] = [f for f in analyze(s, NOW) if f.code == "NetworkLabelMissing"]
    assert aliased.message == finding.message


def test_gpu_nodes_without_the_widest_level_are_in_no_domain() -> None:
    s = healthy()
    s.levels = binder_levels({"spec": {"template": {"spec": {"containers": [{"args": [
        "bind", "--network-levels=example.com/block,example.com/rack"]}]}}}})
    racked = gpu_node("gpu-2")
    racked["metadata"]["labels"]["example.com/rack"] = "r1"  # a rack, but no block
    blocked = gpu_node("gpu-3")
    blocked["metadata"]["labels"]["example.com/block"] = "b1"
    s.nodes = [gpu_node("gpu-1"), racked, blocked]
    [finding] = [f for f in analyze(s, NOW) if f.code == "NetworkLevelMissing"]
    assert finding.severity == "warning"
    assert ("2 GPU node(s) lack the binder's widest network level example.com/block "
            "(gpu-1, gpu-2)") in finding.message
    # Topograph's levels are the ones the nodes carry: none yet, then a two-tier fabric
    s.levels = binder_levels({"spec": {"template": {"spec": {"containers": [{"args": [
        "bind", "--network-levels=topograph"]}]}}}})
    [finding] = [f for f in analyze(s, NOW) if f.code == "NetworkLevelMissing"]
    assert "no node carries them" in finding.message
    for i, n in enumerate(s.nodes):
        n["metadata"]["labels"] |= {"network.topology.nvidia.com/spine": "s1",
                                    "network.topology.nvidia.com/leaf": f"l{i}"}
    assert not [f for f in analyze(s, NOW) if f.code == "NetworkLevelMissing"]


def test_hypernode_levels_checked_as_the_binder_reads_them() -> None:
    s = healthy()
    s.levels = binder_levels({"spec": {"template": {"spec": {"containers": [{"args": [
        "bind", "--network-levels=volcano"]}]}}}})
    assert s.levels.hypernodes
    # the flag's value as the next argument reads the same
    assert binder_levels({"spec": {"template": {"spec": {"containers": [{"args": [
        "bind", "--network-levels", "volcano"]}]}}}}) == s.levels
    # the CRD missing: a gang that names a tier gets one node
    [missing] = [f for f in analyze(s, NOW) if f.code.startswith("HyperNode")]
    assert (missing.severity, missing.code) == ("error", "HyperNodeCRDMissing")
    # a leaf by tierName, a GPU node outside it, a member that is no pattern
    leaf = _hypernode("leaf-1", {"type": "Node", "selector": {"exactMatch": {"name": "gpu-1"}}},
                      {"type": "Node", "selector": {"regexMatch": {"pattern": "("}}})
    leaf["spec"]["tierName"] = "rack"
    s.hypernodes = [leaf]
    unlabelled = scenario.node("cpu-1")
    del unlabelled["metadata"]["labels"][keys.LABEL_GPU_TOPOLOGY]
    s.nodes = [gpu_node("gpu-1"), gpu_node("gpu-2"), unlabelled]
    # a policy naming the tier's name: a HyperNode tier, no node label to lack
    s.policies = load_policy_texts({"p.yaml": POLICY, "n.yaml": NETWORK.replace(
        "required: example.com/rack", "required: rack")})
    found = {f.code: f for f in analyze(s, NOW) if f.code.startswith(("HyperNode", "Network"))}
    assert set(found) == {"HyperNodeMissing", "HyperNodeUnread"}
    assert "1 GPU node(s) are in no HyperNode (gpu-2)" in found["HyperNodeMissing"].message
    assert "regexMatch '(' is not a regular expression" in found["HyperNodeUnread"].message


def preemption_event(reason: str, pod: str, message: str, at: str) -> dict[str, Any]:
    """An Event as the binder records it on a pod when a gang preempts (webhook.binder.evict)."""
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{pod}.{abs(hash(message)):x}", "namespace": "team-a"},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": pod,
                               "namespace": "team-a"},
            "reason": reason, "message": message, "type": "Normal", "count": 1,
            "firstTimestamp": at, "lastTimestamp": at}


def test_when_and_why_a_gang_preempted_or_was_preempted() -> None:
    victim = ("preempted by gang team-a/high of priority 1000: gang team-a/low (priority 0) is "
              "evicted whole so that it can be placed in example.com/rack=r1")
    preemptor = ("gang team-a/high of priority 1000 preempts 1 gang(s) of lower priority "
                 "(team-a/low; 16 GPUs) to be placed in example.com/rack=r1 once they are gone")
    events = [preemption_event("GangPreempted", "low-0", victim, "2026-11-23T11:00:00Z"),
              preemption_event("GangPreempted", "low-1", victim, "2026-11-23T11:00:01Z"),
              preemption_event("GangPreempting", "high-0", preemptor, "2026-11-23T11:00:00Z"),
              preemption_event("GangPreempting", "high-1", preemptor, "2026-11-23T11:00:00Z")]
    found = analyze(dataclasses.replace(healthy(), preemption_events=events), NOW)
    assert [(f.code, f.severity, f.object) for f in found] == [
        ("GangPreempted", "info", "Pod/team-a/low-0"),
        ("GangPreempting", "info", "Pod/team-a/high-0")]
    assert found[0].message == f"at 2026-11-23T11:00:00Z: {victim}"
    assert "PriorityClass" in found[0].fix and "PodDisruptionBudget" in found[0].fix
    waits = ("gang team-a/high cannot be placed: needs 16 GPUs within one example.com/rack "
             "domain; waiting for the gangs it preempted (team-a/low) to go")
    [told] = analyze(dataclasses.replace(healthy(), waiting_pods=[waiting_pod(900, waits)]), NOW)
    assert "waits for their pods to go" in told.fix
