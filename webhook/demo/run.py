"""`muster demo`: the whole flow on one machine, no cluster needed.

Real parts only, wired as in a cluster: the API server emulator (real HTTP, watches), the
admission webhook over HTTPS called by the emulator the way kube-apiserver calls it, the binder
and one node agent per node (fake NVML, device plugin over gRPC to a fake kubelet). The demo plays
the MPI operator and the Job controller: it creates the pods they would create.

The steps run in order (`STEPS`); a step that the policies give nothing to do (no gang for the
binder, no GPU pod bound) is skipped, and says why.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes_asyncio.client import ApiClient

from webhook import keys
from webhook.admission import ServeOptions, WebhookServer
from webhook.agent.deviceplugin.plugin import PluginConfig
from webhook.agent.runner import Agent, AgentConfig, nvml_discoverer
from webhook.binder.controller import BinderConfig
from webhook.binder.evict import PREEMPTED, PREEMPTING
from webhook.binder.service import BinderService, ServiceConfig
from webhook.certs import generate_ca, issue_serving_cert, write_pair
from webhook.demo import scenario
from webhook.doubles.emulator import ApiServerEmulator
from webhook.doubles.fakekubelet import FakeKubelet, node_io
from webhook.doubles.fakenvml import FakeNvml
from webhook.failures import CommandFailed
from webhook.kube import (
    COSCHEDULING_PODGROUPS,
    EVENTS,
    JOBS,
    MPIJOBS,
    MUTATING_WEBHOOKS,
    PODS,
    VOLCANO_PODGROUPS,
    ApiError,
    KubeApi,
    make_api_client,
)
from webhook.podresources import pod_gpus
from webhook.policy import operators
from webhook.topology import builtin, set_score
from webhook.topology.simulate import images_per_second, predict, reference_scenario

WEBHOOK_CONFIGURATION = "0-muster-demo"
TOPOLOGY = builtin("dgx1-v100")
#: the webhook's gang annotations (backend muster), shown per job
_GANG_KEYS = (keys.ANN_GANG_NAME, keys.ANN_GANG_MIN_MEMBER, keys.ANN_GANG_TIMEOUT)
#: the binder, as the chart runs it but that a gang whose policy does not say may preempt
_BINDER = BinderConfig(preemption="LowerPriority")


@dataclass
class PodOutcome:
    name: str
    role: str
    patch: list[dict[str, Any]]
    warnings: list[str]
    #: the fields a matched policy lost to another (the webhook's audit annotation)
    overridden: list[str] = field(default_factory=list)
    node: str | None = None
    gpus: tuple[int, ...] = ()
    uuids: tuple[str, ...] = ()
    visible_devices: tuple[str, ...] | None = None  # what the device plugin gave the container


@dataclass
class JobOutcome:
    name: str
    namespace: str
    kind: str
    policies: list[str]
    pods: list[PodOutcome]
    scheduler_name: str = ""
    pod_group: dict[str, Any] | None = None  # the PodGroup object, for Volcano/coscheduling
    gang: dict[str, str] = field(default_factory=dict)  # muster gang annotations
    bus_gbps: float | None = None
    images_per_s: dict[str, float] = field(default_factory=dict)


@dataclass
class PreemptionOutcome:
    """The preemption scene: where the filler ran, what the binder evicted for the urgent job,
    where that went, and the Events that said so."""

    filler_node: str
    urgent_node: str
    urgent_gpus: tuple[int, ...]
    evicted: list[str]
    #: the binder's Events: GangPreempted on a victim's pod, GangPreempting on the urgent's
    preempted: str
    preempting: str
    #: each urgent worker's container was handed exactly its assigned GPUs, some of them the
    #: evicted gang's a moment before
    exact: bool = False


@dataclass
class DemoResult:
    jobs: list[JobOutcome]
    regular_images_per_s: dict[str, float]
    regular_placement: str
    seconds: float
    #: the steps skipped, each with why
    skipped: list[str] = field(default_factory=list)
    preemption: PreemptionOutcome | None = None


class Progress:
    """One line per step on stderr; a spinner while a step runs when stderr is a terminal."""

    def __init__(self, write: Callable[[str], None], tty: bool) -> None:
        self.write, self.tty, self.n = write, tty, 0
        self.skipped: list[str] = []
        #: a step's line said "interrupted" (Ctrl-C): the one line the interruption needs
        self.interrupted = False

    @contextlib.asynccontextmanager
    async def step(self, title: str) -> AsyncIterator[None]:
        self.n += 1
        start = time.monotonic()
        spinner = asyncio.create_task(self._spin(title)) if self.tty else None
        mark = "FAILED"
        try:
            yield
            mark = "ok"
        except asyncio.CancelledError:
            mark = "interrupted"  # Ctrl-C: asyncio.run cancels the demo, nothing failed
            self.interrupted = True
            raise
        finally:
            if spinner is not None:
                spinner.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await spinner
            self.write(f"\r  [{self.n}] {title} ... {mark} ({time.monotonic() - start:.2f} s)\n")

    def skip(self, component: str, why: str) -> None:
        self.n += 1
        self.skipped.append(f"{component}: {why}")
        self.write(f"  [{self.n}] {component}: skipped — {why}\n")

    async def _spin(self, title: str) -> None:
        frames = "|/-\\"
        i = 0
        while True:
            self.write(f"\r  [{self.n}] {title} {frames[i % 4]}")
            i += 1
            await asyncio.sleep(0.1)


@dataclass(frozen=True, slots=True)
class _Submitted:
    """A pod the demo created for a job: its name, role, and the name or generateName its
    admission request carried."""

    name: str
    role: str
    requested_as: str


@dataclass
class _Demo:
    """The running system, and what the steps learn on the way."""

    tmp: Path
    policies: list[Path]
    api: ApiServerEmulator
    kube: KubeApi
    background: list[asyncio.Task[Any]] = field(default_factory=list)
    kubelets: dict[str, FakeKubelet] = field(default_factory=dict)
    server: WebhookServer | None = None
    submitted: dict[str, list[_Submitted]] = field(default_factory=dict)
    #: what the device plugin handed each started pod's containers, by pod name
    handed: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        self.background.append(asyncio.create_task(work))

    async def pods(self) -> list[dict[str, Any]]:
        return [pod for ns in {job.namespace for job in scenario.JOBS}
                for pod in (await self.kube.list(PODS, namespace=ns))["items"]]


def _emulator() -> ApiServerEmulator:
    api = ApiServerEmulator(crds=list(scenario.CRDS))
    for obj in [*scenario.namespaces(), *map(scenario.node, scenario.NODES),
                *map(scenario.volcano_queue, scenario.QUEUES), *scenario.priority_classes(),
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "muster-system"}}]:
        api.seed(obj)
    return api


@contextlib.asynccontextmanager
async def _running(api: ApiServerEmulator, tmp: Path, policies: list[Path]
                   ) -> AsyncIterator[_Demo]:
    """The demo's system on the started emulator; whatever the steps started stops after."""
    client = await make_api_client(str(api.write_kubeconfig(tmp / "kubeconfig")))
    demo = _Demo(tmp, policies, api, KubeApi(client))
    try:
        yield demo
    finally:
        await _to_the_end(_stop(demo, client))


async def _stop(demo: _Demo, client: ApiClient) -> None:
    for task in demo.background:
        task.cancel()
    await asyncio.gather(*demo.background, return_exceptions=True)
    if demo.server is not None:
        await demo.server.stop()
    for kubelet in demo.kubelets.values():
        await kubelet.stop()
    await client.close()


async def _to_the_end(work: Coroutine[Any, Any, None]) -> None:
    """`work` run to its end even when Ctrl-C cancels the demo meanwhile, then the cancellation
    goes on: a teardown cut short leaves the gRPC servers of the agents and kubelets running,
    and the emulator gone under the webhook (which then cannot release its Lease); they die
    with the interpreter, printing "Error in sys.excepthook" once per server."""
    task = asyncio.ensure_future(work)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        await task
        raise


async def _until(what: str, check: Callable[[], Awaitable[bool]], within: float = 30.0) -> None:
    try:
        async with asyncio.timeout(within):
            while True:  # polled through the API, as a user would with kubectl get
                if await check():
                    return
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise CommandFailed(f"timed out after {within:g} s waiting for {what}") from None


async def _start_emulator(demo: _Demo, progress: Progress) -> None:
    async with progress.step("API server emulator: 2 x DGX-1 V100 nodes, Volcano's queues"):
        pass  # started by run_demo: this line reports it


async def _start_agents(demo: _Demo, progress: Progress) -> None:
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


async def _start_webhook(demo: _Demo, progress: Progress) -> None:
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


async def _start_binder(demo: _Demo, progress: Progress) -> None:
    async with progress.step("binder: waiting for gangs"):
        demo.spawn(BinderService(demo.kube, ServiceConfig(_BINDER)).run())


async def _submit_jobs(demo: _Demo, progress: Progress) -> None:
    async with progress.step(f"MPI operator and Job controller: {scenario.SUBMITTED} created"):
        for job in scenario.JOBS:
            demo.submitted[job.name] = await _submit(demo.kube, job)


async def _bind_gangs(demo: _Demo, progress: Progress) -> None:
    """The gangs the webhook gave the binder (backend muster), bound whole."""
    pods = [p for p in await demo.pods()
            if p["spec"].get("schedulerName") == _BINDER.scheduler_name]
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
        await _unless_waiting(demo, f"the binder to bind {len(pods)} pods", all_bound)


async def _start_gpu_pods(demo: _Demo, progress: Progress) -> None:
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
        await _until(f"the kubelets to start {len(bound)} pods", all_running, within=60)


async def _preempt(demo: _Demo, progress: Progress) -> PreemptionOutcome | None:
    """Priority and preemption, after the reference scenario: the filler takes the free node,
    then the urgent job, which only a whole node holds, arrives; the binder evicts the gang
    that loses the least work, whole, and binds the urgent one on what it freed."""
    filler, urgent = scenario.FILLER, scenario.URGENT
    if not any(p["spec"].get("schedulerName") == _BINDER.scheduler_name
               for p in await demo.pods()):
        progress.skip("preemption", "no gang is the binder's (no policy asks for GPU topology)")
        return None
    async with progress.step(f"an MPIJob of {filler.workers} workers x 1 GPU takes the free "
                             "node"):
        made = demo.submitted[filler.name] = await _submit(demo.kube, filler)
        await _unless_waiting(demo, f"{filler.name} to run", lambda: _all_running(demo, made))
        filler_node = (await _pod(demo, filler, made[0].name))["spec"]["nodeName"]
    async with progress.step(f"an urgent MPIJob of {urgent.workers} workers (priority "
                             f"{scenario.URGENT_PRIORITY}): the binder evicts a gang whole and "
                             "binds it in its place"):
        made = demo.submitted[urgent.name] = await _submit(demo.kube, urgent)
        said: dict[str, str] = {}

        async def started() -> bool:
            said.update({e["reason"]: e["message"] for e in (await demo.kube.list(
                EVENTS, namespace=urgent.namespace))["items"]
                if e.get("reason") in (PREEMPTED, PREEMPTING)})
            return len(said) == 2 and await _all_running(demo, made)
        await _unless_waiting(demo, f"{urgent.name} to run", started)
        gone = [job.name for job in (*scenario.JOBS, filler) if job.name in demo.submitted
                and not await _exists(demo, job, demo.submitted[job.name][0].name)]
        workers = [(m, await _pod(demo, urgent, m.name)) for m in made if m.role == "worker"]
    outcomes = [_pod_outcome(m, pod, _Answer([], [], []), demo.handed) for m, pod in workers]
    return PreemptionOutcome(
        filler_node, workers[0][1]["spec"]["nodeName"],
        tuple(sorted(g for o in outcomes for g in o.gpus)), gone, said[PREEMPTED],
        said[PREEMPTING], all(o.visible_devices == o.uuids for o in outcomes))


async def _all_running(demo: _Demo, made: list[_Submitted]) -> bool:
    names = {m.name for m in made}
    running = {p["metadata"]["name"] for p in await demo.pods()
               if (p.get("status") or {}).get("phase") == "Running"}
    return names <= running


async def _unless_waiting(demo: _Demo, what: str, check: Callable[[], Awaitable[bool]]) -> None:
    """`_until`, and where it times out, what the binder said of the pods that wait."""
    try:
        await _until(what, check)
    except CommandFailed as exc:
        why = next((c.get("message") for p in await demo.pods()
                    for c in (p.get("status") or {}).get("conditions") or ()
                    if c.get("type") == "PodScheduled" and c.get("status") == "False"), None)
        raise CommandFailed(f"{exc}" + (f"; the binder says: {why}" if why else "")) from None


async def _pod(demo: _Demo, job: scenario.Job, name: str) -> dict[str, Any]:
    return await demo.kube.get(PODS, name, namespace=job.namespace)


async def _exists(demo: _Demo, job: scenario.Job, name: str) -> bool:
    try:
        await _pod(demo, job, name)
    except ApiError as exc:
        if exc.not_found:
            return False
        raise
    return True


STEPS: tuple[Callable[[_Demo, Progress], Awaitable[None]], ...] = (
    _start_emulator, _start_agents, _start_webhook, _start_binder, _submit_jobs, _bind_gangs,
    _start_gpu_pods)


async def run_demo(policies: list[Path], progress: Progress) -> DemoResult:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="muster-demo-") as tmp:
        api = _emulator()
        async with api, _running(api, Path(tmp), policies) as demo:
            for step in STEPS:
                await step(demo, progress)
            jobs = [await _collect(demo, job) for job in scenario.JOBS]
            preemption = await _preempt(demo, progress)
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


@dataclass(frozen=True, slots=True)
class _Answer:
    """What our webhook answered a pod's CREATE."""

    patch: list[dict[str, Any]]
    warnings: list[str]
    overridden: list[str]


def _answer(api: ApiServerEmulator, namespace: str, requested_as: str) -> _Answer:
    """The first answer of our webhook for the pod (not a reinvocation)."""
    for call in api.webhook_calls:
        req = call.request.get("request", {})
        meta = (req.get("object") or {}).get("metadata", {})
        if (call.configuration != WEBHOOK_CONFIGURATION or req.get("namespace") != namespace
                or call.reinvocation):
            continue
        if requested_as in (meta.get("name"), meta.get("generateName")):
            resp = (call.response or {}).get("response", {})
            patch = json.loads(base64.b64decode(resp["patch"])) if resp.get("patch") else []
            audit = (resp.get("auditAnnotations") or {}).get("overridden")
            return _Answer(patch, list(resp.get("warnings") or []),
                           audit.split("; ") if audit else [])
    return _Answer([], [], [])


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


async def _submit(kube: KubeApi, job: scenario.Job) -> list[_Submitted]:
    """Create the job and the pods its controllers create for it, in their order."""
    if job.kind == "Indexed Job":
        made = await kube.create(JOBS, scenario.indexed_job(job.name, job.namespace),
                                 namespace=job.namespace)
        return [await _create_pod(kube, pod, "rank") for pod in operators.job_pods(made)]
    mpijob = await kube.create(MPIJOBS, scenario.mpijob(job),
                               namespace=job.namespace)
    launcher_job = await kube.create(JOBS, operators.mpi_launcher_job(mpijob),
                                     namespace=job.namespace)
    workers = [await _create_pod(kube, pod, "worker")
               for pod in operators.mpi_worker_pods(mpijob)]
    launcher = operators.mpi_launcher_pod(launcher_job)
    return [*workers, await _create_pod(kube, launcher, "launcher")]


async def _create_pod(kube: KubeApi, pod: dict[str, Any], role: str) -> _Submitted:
    meta = pod["metadata"]
    made = await kube.create(PODS, pod, namespace=meta["namespace"])
    return _Submitted(made["metadata"]["name"], role, meta.get("name") or meta["generateName"])


async def _collect(demo: _Demo, spec: scenario.Job) -> JobOutcome:
    job = JobOutcome(name=spec.name, namespace=spec.namespace, kind=spec.kind, policies=[],
                     pods=[])
    for submitted in demo.submitted[spec.name]:
        answer = _answer(demo.api, spec.namespace, submitted.requested_as)
        pod = await demo.kube.get(PODS, submitted.name, namespace=spec.namespace)
        job.pods.append(_pod_outcome(submitted, pod, answer, demo.handed))
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


def _pod_outcome(submitted: _Submitted, pod: dict[str, Any], answer: _Answer,
                 handed: dict[str, tuple[str, ...]]) -> PodOutcome:
    outcome = PodOutcome(name=submitted.name, role=submitted.role, patch=answer.patch,
                         warnings=answer.warnings, overridden=answer.overridden,
                         node=pod["spec"].get("nodeName"))
    assignment = (pod["metadata"].get("annotations") or {}).get(keys.ANN_GPU_ASSIGNMENT)
    if assignment:
        containers = json.loads(assignment)["containers"]
        outcome.gpus = tuple(i for c in containers.values() for i in c["indices"])
        outcome.uuids = tuple(u for c in containers.values() for u in c["uuids"])
        outcome.visible_devices = handed.get(submitted.name)
    return outcome
