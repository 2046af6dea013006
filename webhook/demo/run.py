"""`muster demo`: the whole flow on one machine, no cluster needed.

Real parts only, wired as in a cluster: the API server emulator (real HTTP, watches), the
admission webhook over HTTPS called by the emulator the way kube-apiserver calls it, the binder
and one node agent per node (fake NVML, device plugin over gRPC to a fake kubelet). The demo plays
the MPI operator and the Job controller: it creates the pods they would create.

The steps run in order (`STEPS`); a step that the policies give nothing to do (no gang for the
binder, no GPU pod bound) is skipped, and says why. The last scene, priority and preemption,
is webhook.demo.preemption's.
"""

from __future__ import annotations

import base64
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from webhook import keys
from webhook.admission import ServeOptions, WebhookServer
from webhook.agent.deviceplugin.plugin import PluginConfig
from webhook.agent.runner import Agent, AgentConfig, nvml_discoverer
from webhook.binder.service import BinderService, ServiceConfig
from webhook.certs import generate_ca, issue_serving_cert, write_pair
from webhook.demo import scenario
from webhook.demo.outcome import DemoResult, JobOutcome
from webhook.demo.preemption import preempt
from webhook.demo.progress import Progress
from webhook.demo.system import (
    BINDER,
    TOPOLOGY,
    WEBHOOK_CONFIGURATION,
    Demo,
    answer,
    emulator,
    pod_outcome,
    running,
    submit,
    unless_waiting,
    until,
)
from webhook.doubles.fakekubelet import FakeKubelet, node_io
from webhook.doubles.fakenvml import FakeNvml
from webhook.kube import (
    COSCHEDULING_PODGROUPS,
    MUTATING_WEBHOOKS,
    PODS,
    VOLCANO_PODGROUPS,
    KubeApi,
)
from webhook.podresources import pod_gpus
from webhook.topology import set_score
from webhook.topology.simulate import images_per_second, predict, reference_scenario

#: the webhook's gang annotations (backend muster), shown per job
_GANG_KEYS = (keys.ANN_GANG_NAME, keys.ANN_GANG_MIN_MEMBER, keys.ANN_GANG_TIMEOUT)


async def _start_emulator(demo: Demo, progress: Progress) -> None:
    async with progress.step("API server emulator: 2 x DGX-1 V100 nodes, Volcano's queues"):
        pass  # started by run_demo: this line reports it


async def _start_agents(demo: Demo, progress: Progress) -> None:
    async with progress.step("node agents: NVML discovery, device plugins registered"):
        for node in scenario.NODES:
            kubelet = demo.kubelets[node] = FakeKubelet(demo.tmp / node)
            await kubelet.start()
            demo.spawn(Agent(
                AgentConfig(node=node, rediscover_s=3600, plugin=PluginConfig(
                    node=node, kubelet_dir=demo.tmp / node, assignment_wait_s=5.0)),
                nvml_discoverer(FakeNvml.profile("dgx1-v100")), demo.kube).run())
        for node, kubelet in demo.kubelets.items():
            await kubelet.wait_for(keys.GPU_RESOURCE, count=TOPOLOGY.size, within=30)
            # the kubelet starts the GPU pods bound to its node, one by one, as the binder binds
            # them (it binds a node's next GPU pod once the agent served this one)
            demo.spawn(_kubelet(demo.kube, node, kubelet, demo.handed))


async def _start_webhook(demo: Demo, progress: Progress) -> None:
    async with progress.step("admission webhook over HTTPS (self-signed CA)"):
        ca = generate_ca("muster-demo-ca", days=1)
        write_pair(issue_serving_cert(ca, ["localhost"], ["127.0.0.1"], days=1),
                   demo.tmp / "tls.crt", demo.tmp / "tls.key")
        demo.server = WebhookServer(ServeOptions(
            policies=demo.policies, host="127.0.0.1", port=0,
            tls_cert_file=demo.tmp / "tls.crt", tls_key_file=demo.tmp / "tls.key",
            kubeconfig=str(demo.tmp / "kubeconfig"), namespace="muster-system"))
        await demo.server.start()
        await demo.kube.create(MUTATING_WEBHOOKS,
                               _webhook_configuration(demo.server.url, ca.cert_pem))


async def _start_binder(demo: Demo, progress: Progress) -> None:
    async with progress.step("binder: waiting for gangs"):
        demo.spawn(BinderService(demo.kube, ServiceConfig(BINDER)).run())


async def _submit_jobs(demo: Demo, progress: Progress) -> None:
    async with progress.step(f"MPI operator and Job controller: {scenario.SUBMITTED} created"):
        for job in scenario.JOBS:
            demo.submitted[job.name] = await submit(demo.kube, job)


async def _bind_gangs(demo: Demo, progress: Progress) -> None:
    """The gangs the webhook gave the binder (backend muster), bound whole."""
    pods = [p for p in await demo.pods()
            if p["spec"].get("schedulerName") == BINDER.scheduler_name]
    if not pods:
        progress.skip("binder", "no policy asks for GPU topology (gang backend muster)")
        return
    gangs = {(p["metadata"]["namespace"], (p["metadata"].get("annotations") or {}).get(
        keys.ANN_GANG_NAME)) for p in pods}
    names = {(p["metadata"]["namespace"], p["metadata"]["name"]) for p in pods}

    async def all_bound() -> bool:
        return all(p["spec"].get("nodeName") for p in await demo.pods()
                   if (p["metadata"]["namespace"], p["metadata"]["name"]) in names)

    async with progress.step(f"binder: {len(gangs)} gang{'s' * (len(gangs) > 1)} "
                             f"placed and bound ({len(pods)} pods)"):
        # a gang the policies make unplaceable fails with the binder's why
        await unless_waiting(demo, f"the binder to bind {len(pods)} pods", all_bound)


async def _start_gpu_pods(demo: Demo, progress: Progress) -> None:
    bound = {p["metadata"]["name"]: pod_gpus(p["spec"]) for p in await demo.pods()
             if p["spec"].get("nodeName")}
    gpus = sum(1 for n in bound.values() if n)
    if not gpus:
        progress.skip("kubelets", "no GPU pod was bound: only Muster's binder places pods here "
                                  "(Volcano, coscheduling and the default scheduler are not part "
                                  "of the demo)")
        return

    async def all_running() -> bool:
        # as the API server has it: the kubelets' status, not only their device plugin calls
        running = {p["metadata"]["name"] for p in await demo.pods()
                   if (p.get("status") or {}).get("phase") == "Running"}
        return len(demo.handed) >= gpus and running >= bound.keys()

    async with progress.step(f"kubelets start the {gpus} bound GPU pods: device plugin "
                             f"Allocate; all {len(bound)} bound pods Running"):
        await until(f"the kubelets to start {len(bound)} pods", all_running, within=60)


STEPS: tuple[Callable[[Demo, Progress], Awaitable[None]], ...] = (
    _start_emulator, _start_agents, _start_webhook, _start_binder, _submit_jobs, _bind_gangs,
    _start_gpu_pods)


async def run_demo(policies: list[Path], progress: Progress) -> DemoResult:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="muster-demo-") as tmp:
        api = emulator()
        async with api, running(api, Path(tmp), policies) as demo:
            for step in STEPS:
                await step(demo, progress)
            jobs = [await _collect(demo, job) for job in scenario.JOBS]
            preemption = await preempt(demo, progress)
    for job in jobs:
        _model(job)
    regular = predict(reference_scenario()).regular
    where = " + ".join(f"{node}:{','.join(map(str, g))}" for node, g in regular.gpus.items())
    return DemoResult(jobs, dict(regular.images_per_s), where, time.monotonic() - started,
                      progress.skipped, preemption)


def _model(job: JobOutcome) -> None:
    """The job's throughput modelled from the GPUs the binder really gave it, when they are on
    one node (webhook.topology.simulate)."""
    if len({p.node for p in job.pods if p.gpus}) != 1:
        return
    reference = reference_scenario()
    node_gpus = sorted(g for p in job.pods for g in p.gpus)
    job.bus_gbps = set_score(TOPOLOGY, node_gpus).allreduce_gbps
    job.images_per_s = {m.name: images_per_second(m, len(node_gpus), job.bus_gbps,
                                                  reference.links)
                        for m in reference.models}


def _webhook_configuration(url: str, ca_pem: bytes) -> dict[str, Any]:
    """What the Helm chart installs (charts/muster), pointed at the local server."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": WEBHOOK_CONFIGURATION},
        "webhooks": [{
            "name": "pods.muster.io",
            "clientConfig": {"url": f"{url}/mutate/pods",
                             "caBundle": base64.b64encode(ca_pem).decode()},
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                       "resources": ["pods"], "scope": "Namespaced"}],
            "namespaceSelector": {"matchExpressions": [{
                "key": "kubernetes.io/metadata.name", "operator": "NotIn",
                "values": ["kube-system", "muster-system"]}]},
            "failurePolicy": "Ignore", "sideEffects": "NoneOnDryRun", "timeoutSeconds": 5,
            "reinvocationPolicy": "IfNeeded", "admissionReviewVersions": ["v1"],
        }],
    }


async def _kubelet(kube: KubeApi, node: str, kubelet: FakeKubelet,
                   handed: dict[str, tuple[str, ...]]) -> None:
    """The node's kubelet starts each pod bound to it and reports it Running; what every GPU
    pod's containers were given is kept per pod name."""
    pods, write = node_io(kube, node)
    async for event in kubelet.start_pods(pods, keys.GPU_RESOURCE, write_status=write):
        if event["event"] == "started":
            name = event["pod"].split("/", 1)[1]
            handed[name] = tuple(u for envs in event["envs"]
                                 for u in envs["NVIDIA_VISIBLE_DEVICES"].split(","))


async def _collect(demo: Demo, spec: scenario.Job) -> JobOutcome:
    job = JobOutcome(name=spec.name, namespace=spec.namespace, kind=spec.kind, policies=[],
                     pods=[])
    for submitted in demo.submitted[spec.name]:
        said = answer(demo.api, spec.namespace, submitted.requested_as)
        pod = await demo.kube.get(PODS, submitted.name, namespace=spec.namespace)
        job.pods.append(pod_outcome(submitted, pod, said, demo.handed))
        ann = pod["metadata"].get("annotations") or {}
        job.scheduler_name = pod["spec"].get("schedulerName", "")
        job.policies = sorted(set(job.policies) | set(filter(None, ann.get(keys.ANN_POLICY,
                                                                          "").split(","))))
        job.gang = {k: ann[k] for k in _GANG_KEYS if k in ann} or job.gang
    # backend muster carries its gang on the pods; Volcano and coscheduling have a PodGroup
    for resource in (VOLCANO_PODGROUPS, COSCHEDULING_PODGROUPS):
        found = await demo.kube.list(resource, namespace=spec.namespace,
                                     field_selector=f"metadata.name={spec.name}")
        job.pod_group = next(iter(found["items"]), job.pod_group)
    return job
