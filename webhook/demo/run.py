"""`muster demo`: the whole flow on one machine, no cluster needed.

Real parts only, wired as in a cluster: the API server emulator (real HTTP, watches), the
admission webhook over HTTPS called by the emulator the way kube-apiserver calls it, the binder
and one node agent per node (fake NVML, device plugin over gRPC to a fake kubelet). The demo plays
the MPI operator and the Job controller: it creates the pods they would create.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from webhook import keys
from webhook.admission import ServeOptions, WebhookServer
from webhook.agent.deviceplugin.plugin import PluginConfig
from webhook.agent.runner import Agent, AgentConfig, nvml_discoverer
from webhook.binder.controller import BinderConfig
from webhook.binder.service import BinderService, ServiceConfig
from webhook.certs import generate_ca, issue_serving_cert, write_pair
from webhook.demo import scenario
from webhook.doubles.emulator import ApiServerEmulator
from webhook.doubles.fakekubelet import FakeKubelet
from webhook.doubles.fakenvml import FakeNvml
from webhook.kube import (
    COSCHEDULING_PODGROUPS,
    JOBS,
    MPIJOBS,
    MUTATING_WEBHOOKS,
    PODS,
    VOLCANO_PODGROUPS,
    KubeApi,
    make_api_client,
)
from webhook.policy import operators
from webhook.topology import builtin, set_score
from webhook.topology.simulate import images_per_second, predict, reference_scenario

WEBHOOK_CONFIGURATION = "0-muster-demo"
#: the webhook's gang annotations (backend muster), shown per job
_GANG_KEYS = (keys.ANN_GANG_NAME, keys.ANN_GANG_MIN_MEMBER, keys.ANN_GANG_TIMEOUT)


@dataclass
class PodOutcome:
    name: str
    role: str
    patch: list[dict[str, Any]]
    warnings: list[str]
    node: str | None = None
    gpus: tuple[int, ...] = ()
    uuids: tuple[str, ...] = ()
    visible_devices: tuple[str, ...] | None = None  # what the device plugin gave the container


@dataclass
class JobOutcome:
    name: str
    namespace: str
    policies: list[str]
    pods: list[PodOutcome]
    scheduler_name: str = ""
    pod_group: dict[str, Any] | None = None  # the PodGroup object, for Volcano/coscheduling
    gang: dict[str, str] = field(default_factory=dict)  # muster gang annotations
    bus_gbps: float | None = None
    images_per_s: dict[str, float] = field(default_factory=dict)


@dataclass
class DemoResult:
    jobs: list[JobOutcome]
    regular_images_per_s: dict[str, float]
    regular_placement: str
    seconds: float


class Progress:
    """One line per step on stderr; a spinner while a step runs when stderr is a terminal."""

    def __init__(self, write: Callable[[str], None], tty: bool) -> None:
        self.write, self.tty, self.n = write, tty, 0

    @contextlib.asynccontextmanager
    async def step(self, title: str) -> AsyncIterator[None]:
        self.n += 1
        start = time.monotonic()
        spinner = asyncio.create_task(self._spin(title)) if self.tty else None
        ok = False
        try:
            yield
            ok = True
        finally:
            if spinner is not None:
                spinner.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await spinner
            mark = "ok" if ok else "FAILED"
            self.write(f"\r  [{self.n}] {title} ... {mark} ({time.monotonic() - start:.2f} s)\n")

    async def _spin(self, title: str) -> None:
        frames = "|/-\\"
        i = 0
        while True:
            self.write(f"\r  [{self.n}] {title} {frames[i % 4]}")
            i += 1
            await asyncio.sleep(0.1)


async def _until(what: str, check: Callable[[], Coroutine[Any, Any, bool]],
                 within: float = 30.0) -> None:
    try:
        async with asyncio.timeout(within):
            while True:  # polled through the API, as a user would with kubectl get
                if await check():
                    return
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise TimeoutError(f"timed out after {within:g} s waiting for {what}") from None


def _patch_of(api: ApiServerEmulator, namespace: str, name_or_prefix: str
              ) -> tuple[list[dict[str, Any]], list[str]]:
    """The JSON Patch and warnings our webhook answered for a pod CREATE (first call)."""
    for call in api.webhook_calls:
        req = call.request.get("request", {})
        obj = req.get("object") or {}
        meta = obj.get("metadata", {})
        if (call.configuration != WEBHOOK_CONFIGURATION or req.get("namespace") != namespace
                or call.reinvocation):
            continue
        if name_or_prefix in (meta.get("name"), meta.get("generateName")):
            resp = (call.response or {}).get("response", {})
            patch = json.loads(base64.b64decode(resp["patch"])) if resp.get("patch") else []
            return patch, list(resp.get("warnings") or [])
    return [], []


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
    """The node's kubelet starts each GPU pod bound to it; what every pod's containers were
    given is kept per pod name."""
    async def pods() -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = (await kube.list(
            PODS, field_selector=f"spec.nodeName={node}"))["items"]
        return items
    async for event in kubelet.start_pods(pods, keys.GPU_RESOURCE):
        if event["event"] == "started":
            name = event["pod"].split("/", 1)[1]
            handed[name] = tuple(u for envs in event["envs"]
                                 for u in envs["NVIDIA_VISIBLE_DEVICES"].split(","))


def _started(handed: dict[str, tuple[str, ...]], count: int
             ) -> Callable[[], Coroutine[Any, Any, bool]]:
    async def check() -> bool:
        return len(handed) >= count
    return check


async def _submit(kube: KubeApi, name: str, namespace: str) -> list[tuple[str, str]]:
    """Create the MPIJob and what the MPI operator and Job controller create for it; return
    (pod name or generateName, role) in creation order."""
    job = await kube.create(MPIJOBS, scenario.mpijob(name, namespace), namespace=namespace)
    launcher_job = await kube.create(JOBS, operators.mpi_launcher_job(job), namespace=namespace)
    created: list[tuple[str, str]] = []
    for pod in operators.mpi_worker_pods(job):
        await kube.create(PODS, pod, namespace=namespace)
        created.append((pod["metadata"]["name"], "worker"))
    launcher = operators.mpi_launcher_pod(launcher_job)
    made = await kube.create(PODS, launcher, namespace=namespace)
    created.append((made["metadata"]["name"], "launcher"))
    return created


async def run_demo(policies: list[Path], progress: Progress) -> DemoResult:
    started = time.monotonic()
    topology = builtin("dgx1-v100")
    background: list[asyncio.Task[Any]] = []
    kubelets: dict[str, FakeKubelet] = {}
    server: WebhookServer | None = None
    with tempfile.TemporaryDirectory(prefix="muster-demo-") as tmp_dir:
        tmp = Path(tmp_dir)
        api = ApiServerEmulator(crds=list(scenario.CRDS))
        for obj in [*scenario.namespaces(), *map(scenario.node, scenario.NODES)]:
            api.seed(obj)
        api.seed({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "muster-system"}})
        async with api:
            client = await make_api_client(str(api.write_kubeconfig(tmp / "kubeconfig")))
            kube = KubeApi(client)
            try:
                async with progress.step("API server emulator: 2 x DGX-1 V100 nodes"):
                    pass
                async with progress.step("node agents: NVML discovery, device plugins registered"):
                    for node in scenario.NODES:
                        kubelet = kubelets[node] = FakeKubelet(tmp / node)
                        await kubelet.start()
                        agent = Agent(
                            AgentConfig(node=node, rediscover_s=3600, plugin=PluginConfig(
                                node=node, kubelet_dir=tmp / node, assignment_wait_s=5.0)),
                            nvml_discoverer(FakeNvml.profile("dgx1-v100")), kube)
                        background.append(asyncio.create_task(agent.run()))
                    for kubelet in kubelets.values():
                        await kubelet.wait_for(keys.GPU_RESOURCE, count=topology.size, within=30)

                async with progress.step("admission webhook over HTTPS (self-signed CA)"):
                    ca = generate_ca("muster-demo-ca", days=1)
                    write_pair(issue_serving_cert(ca, ["localhost"], ["127.0.0.1"], days=1),
                               tmp / "tls.crt", tmp / "tls.key")
                    server = WebhookServer(ServeOptions(
                        policies=policies, host="127.0.0.1", port=0,
                        tls_cert_file=tmp / "tls.crt", tls_key_file=tmp / "tls.key",
                        kubeconfig=str(tmp / "kubeconfig"), namespace="muster-system"))
                    await server.start()
                    await kube.create(MUTATING_WEBHOOKS,
                                      _webhook_configuration(server.url, ca.cert_pem))

                async with progress.step("binder: waiting for gangs"):
                    service = BinderService(kube, ServiceConfig(BinderConfig()))
                    background.append(asyncio.create_task(service.run()))

                jobs = [("vgg16-a", scenario.TOPOLOGY_NAMESPACE),
                        ("vgg16-b", scenario.TOPOLOGY_NAMESPACE),
                        ("vgg16-c", scenario.GANG_NAMESPACE)]
                submitted: dict[str, list[tuple[str, str]]] = {}
                async with progress.step("MPI operator: 3 MPIJobs, 15 pods created"):
                    for name, ns in jobs:
                        submitted[name] = await _submit(kube, name, ns)

                async def all_bound() -> bool:
                    pods = (await kube.list(PODS, namespace=scenario.TOPOLOGY_NAMESPACE))["items"]
                    return len(pods) == 10 and all(p["spec"].get("nodeName") for p in pods)

                # each node's kubelet starts the GPU pods bound to it, one by one, as the binder
                # binds them (it binds a node's next GPU pod once the agent served this one)
                handed: dict[str, tuple[str, ...]] = {}
                starting = [asyncio.create_task(_kubelet(kube, node, kubelet, handed))
                            for node, kubelet in kubelets.items()]
                background += starting
                async with progress.step("binder: both topology gangs placed and bound"):
                    await _until("the binder to bind both gangs", all_bound)

                async with progress.step("kubelets start the workers: device plugin Allocate"):
                    await _until("the kubelets to start the 8 workers",
                                 _started(handed, 8), within=60)

                outcomes = [await _collect(api, kube, name=name, namespace=ns,
                                           submitted=submitted[name], handed=handed)
                            for name, ns in jobs]
            finally:
                for task in background:
                    task.cancel()
                await asyncio.gather(*background, return_exceptions=True)
                if server is not None:
                    await server.stop()
                for kubelet in kubelets.values():
                    await kubelet.stop()
                await client.close()

    # modelled from the GPUs the binder really gave each job (webhook.topology.simulate)
    reference = reference_scenario()
    for job in outcomes:
        if len({p.node for p in job.pods if p.gpus}) == 1:
            node_gpus = sorted(g for p in job.pods for g in p.gpus)
            job.bus_gbps = set_score(topology, node_gpus).allreduce_gbps
            job.images_per_s = {m.name: images_per_second(m, len(node_gpus), job.bus_gbps,
                                                          reference.links)
                                for m in reference.models}
    regular = predict(reference).regular
    where = " + ".join(f"{node}:{','.join(map(str, g))}" for node, g in regular.gpus.items())
    return DemoResult(outcomes, dict(regular.images_per_s), where, time.monotonic() - started)


async def _collect(api: ApiServerEmulator, kube: KubeApi, *, name: str, namespace: str,
                   submitted: list[tuple[str, str]], handed: dict[str, tuple[str, ...]]
                   ) -> JobOutcome:
    job = JobOutcome(name=name, namespace=namespace, policies=[], pods=[])
    for pod_name, role in submitted:
        key = pod_name if role == "worker" else f"{name}-launcher-"
        patch, warnings = _patch_of(api, namespace, key)
        pod = await kube.get(PODS, pod_name, namespace=namespace)
        ann = pod["metadata"].get("annotations") or {}
        job.scheduler_name = pod["spec"].get("schedulerName", "")
        outcome = PodOutcome(name=pod_name, role=role, patch=patch, warnings=warnings,
                             node=pod["spec"].get("nodeName"))
        if keys.ANN_GPU_ASSIGNMENT in ann:
            containers = json.loads(ann[keys.ANN_GPU_ASSIGNMENT])["containers"]
            outcome.gpus = tuple(i for c in containers.values() for i in c["indices"])
            outcome.uuids = tuple(u for c in containers.values() for u in c["uuids"])
            outcome.visible_devices = handed.get(pod_name)
        job.policies = sorted(set(job.policies) | set(filter(None, ann.get(keys.ANN_POLICY,
                                                                          "").split(","))))
        job.gang = {k: ann[k] for k in _GANG_KEYS if k in ann} or job.gang
        job.pods.append(outcome)
    # backend muster carries its gang on the pods; Volcano and coscheduling have a PodGroup
    for resource in (VOLCANO_PODGROUPS, COSCHEDULING_PODGROUPS):
        found = await kube.list(resource, namespace=namespace,
                                field_selector=f"metadata.name={name}")
        job.pod_group = next(iter(found["items"]), job.pod_group)
    return job

