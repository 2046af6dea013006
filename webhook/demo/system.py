"""The demo's running system: the emulator, the components the steps start, the pods the demo
creates as the job operators would, and what it reads back (the webhook's answers, the pods)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes_asyncio.client import ApiClient

from webhook import keys
from webhook.admission import WebhookServer
from webhook.binder.controller import BinderConfig
from webhook.demo import scenario
from webhook.demo.outcome import PodOutcome
from webhook.doubles.emulator import ApiServerEmulator
from webhook.doubles.fakekubelet import FakeKubelet
from webhook.failures import CommandFailed
from webhook.kube import JOBS, MPIJOBS, PODS, KubeApi, make_api_client
from webhook.policy import operators
from webhook.topology import builtin

WEBHOOK_CONFIGURATION = "0-muster-demo"
TOPOLOGY = builtin("dgx1-v100")
#: the binder, as the chart runs it but that a gang whose policy does not say may preempt
BINDER = BinderConfig(preemption="LowerPriority")


@dataclass(frozen=True, slots=True)
class Submitted:
    """A pod the demo created for a job: its name, role, and the name or generateName its
    admission request carried."""

    name: str
    role: str
    requested_as: str


@dataclass
class Demo:
    """The running system, and what the steps learn on the way."""

    tmp: Path
    policies: list[Path]
    api: ApiServerEmulator
    kube: KubeApi
    background: list[asyncio.Task[Any]] = field(default_factory=list)
    kubelets: dict[str, FakeKubelet] = field(default_factory=dict)
    server: WebhookServer | None = None
    submitted: dict[str, list[Submitted]] = field(default_factory=dict)
    #: what the device plugin handed each started pod's containers, by pod name
    handed: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        self.background.append(asyncio.create_task(work))

    async def pods(self) -> list[dict[str, Any]]:
        return [pod for ns in {job.namespace for job in scenario.JOBS}
                for pod in (await self.kube.list(PODS, namespace=ns))["items"]]


def emulator() -> ApiServerEmulator:
    api = ApiServerEmulator(crds=list(scenario.CRDS))
    for obj in [*scenario.namespaces(), *map(scenario.node, scenario.NODES),
                *map(scenario.volcano_queue, scenario.QUEUES), *scenario.priority_classes(),
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "muster-system"}}]:
        api.seed(obj)
    return api


@contextlib.asynccontextmanager
async def running(api: ApiServerEmulator, tmp: Path, policies: list[Path]
                  ) -> AsyncIterator[Demo]:
    """The demo's system on the started emulator; whatever the steps started stops after."""
    client = await make_api_client(str(api.write_kubeconfig(tmp / "kubeconfig")))
    demo = Demo(tmp, policies, api, KubeApi(client))
    try:
        yield demo
    finally:
        await _to_the_end(_stop(demo, client))


async def _stop(demo: Demo, client: ApiClient) -> None:
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


async def until(what: str, check: Callable[[], Awaitable[bool]], within: float = 30.0) -> None:
    try:
        async with asyncio.timeout(within):
            while True:  # polled through the API, as a user would with kubectl get
                if await check():
                    return
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise CommandFailed(f"timed out after {within:g} s waiting for {what}") from None


async def unless_waiting(demo: Demo, what: str, check: Callable[[], Awaitable[bool]]) -> None:
    """`until`, and where it times out, what the binder said of the pods that wait."""
    try:
        await until(what, check)
    except CommandFailed as exc:
        why = next((c.get("message") for p in await demo.pods()
                    for c in (p.get("status") or {}).get("conditions") or ()
                    if c.get("type") == "PodScheduled" and c.get("status") == "False"), None)
        raise CommandFailed(f"{exc}" + (f"; the binder says: {why}" if why else "")) from None


@dataclass(frozen=True, slots=True)
class Answer:
    """What our webhook answered a pod's CREATE."""

    patch: list[dict[str, Any]]
    warnings: list[str]
    overridden: list[str]


def answer(api: ApiServerEmulator, namespace: str, requested_as: str) -> Answer:
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
            return Answer(patch, list(resp.get("warnings") or []),
                          audit.split("; ") if audit else [])
    return Answer([], [], [])


async def submit(kube: KubeApi, job: scenario.Job) -> list[Submitted]:
    """Create the job and the pods its controllers create for it, in their order."""
    if job.kind == "Indexed Job":
        made = await kube.create(JOBS, scenario.indexed_job(job.name, job.namespace),
                                 namespace=job.namespace)
        return [await _create_pod(kube, pod, "rank") for pod in operators.job_pods(made)]
    mpijob = await kube.create(MPIJOBS, scenario.mpijob(job), namespace=job.namespace)
    launcher_job = await kube.create(JOBS, operators.mpi_launcher_job(mpijob),
                                     namespace=job.namespace)
    workers = [await _create_pod(kube, pod, "worker")
               for pod in operators.mpi_worker_pods(mpijob)]
    launcher = operators.mpi_launcher_pod(launcher_job)
    return [*workers, await _create_pod(kube, launcher, "launcher")]


async def _create_pod(kube: KubeApi, pod: dict[str, Any], role: str) -> Submitted:
    meta = pod["metadata"]
    made = await kube.create(PODS, pod, namespace=meta["namespace"])
    return Submitted(made["metadata"]["name"], role, meta.get("name") or meta["generateName"])


def pod_outcome(submitted: Submitted, pod: dict[str, Any], said: Answer,
                handed: dict[str, tuple[str, ...]]) -> PodOutcome:
    outcome = PodOutcome(name=submitted.name, role=submitted.role, patch=said.patch,
                         warnings=said.warnings, overridden=said.overridden,
                         node=pod["spec"].get("nodeName"))
    assignment = (pod["metadata"].get("annotations") or {}).get(keys.ANN_GPU_ASSIGNMENT)
    if assignment:
        containers = json.loads(assignment)["containers"]
        outcome.gpus = tuple(i for c in containers.values() for i in c["indices"])
        outcome.uuids = tuple(u for c in containers.values() for u in c["uuids"])
        outcome.visible_devices = handed.get(submitted.name)
    return outcome
