"""The job operators themselves on the real node: each test runs the released controller (built
from the Go module proxy, `e2e.node.operators`) beside the cluster, and the pods are the ones that
controller makes. Runs before test_lifecycle (file order), which uninstalls Muster.

mpi-operator v2 (`--namespace` scopes each run to one namespace):
- gang scheduling off, in a topology namespace: Muster's binder places the gang the operator's
  pods join, and the job runs to completion on the node (the launcher's `mpirun` is a stand-in
  that prints the hostfile the operator wrote);
- gang scheduling off, in team-a (policy mpi-volcano): Muster's PodGroup, then the same job under
  the operator's own `--gang-scheduling=volcano`: the operator's PodGroup is the only one (Muster
  stands aside: its pods carry the group key) and has the fields Muster wrote for the same job;
  restarted without the flag, a worker it makes again joins that PodGroup unchanged.
JobSet, LeaderWorkerSet, the training operator (PyTorchJob, elastic too) and Trainer v2 (with
JobSet): every pod of a job in one gang of the right size, gone with the job; the training
operator's and Trainer's own gang options get no second PodGroup.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from jobs import ensure_namespace
from operator_runs import (
    condition,
    delete_all,
    delete_and_wait,
    install_crds,
    module_controller,
    operator,
    training_operator_running,
)
from real_helpers import kubectl

from e2e import jobkind_scenarios as scenarios
from e2e import jobkinds
from e2e.jobkinds import Replicated
from e2e.node import image, operators
from e2e.node.cluster import NODE_NAME, NodeCluster
from e2e.probes import eventually, pods_of
from webhook import keys
from webhook.kube import (
    COSCHEDULING_PODGROUPS,
    MPIJOBS,
    PODS,
    PRIORITY_CLASSES,
    VOLCANO_PODGROUPS,
    ApiError,
    KubeApi,
    Resource,
)
from webhook.policy.operators import JOB_ROLE_LABEL, JOBSET_NAME_LABEL, LWS_NAME_LABEL
from webhook.policy.workload import JOB_NAME_LABEL, JOBSET_REPLICATED_JOB_LABEL
from webhook.quantity import parse_quantity

IMAGE = f"{image.IMAGE_REPOSITORY}:{image.IMAGE_TAG}"
CONTAINER = {"name": "main", "image": IMAGE, "imagePullPolicy": "Never",
             "command": ["python", "-c", "import time; time.sleep(3600)"],
             "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}}}
#: the launcher's stand-in for mpirun: it prints the hostfile the operator mounted
STAND_IN_MPIRUN = "print(open('/etc/mpi/hostfile').read(), flush=True)"
MPI_READY = ("Started workers",)


@pytest.fixture(scope="module")
def mpi_operator(node_cluster: NodeCluster, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """mpi-operator's binary (built once) and its CRD at that release, installed."""
    binary = operators.build(operators.MPI_OPERATOR)
    with node_cluster.netns():  # module fixtures run before the tests' own entry
        install_crds(node_cluster, operators.MPI_OPERATOR, tmp_path_factory.mktemp("mpi"))
    return binary


@pytest.fixture
def mpi_run(node_cluster: NodeCluster, mpi_operator: Path) -> Iterator[Any]:
    """Starts mpi-operator on one namespace, `*flags` added; the run stops with the test."""
    with ExitStack() as runs:
        def start(ns: str, *flags: str) -> None:
            runs.close()  # its health server takes :8080: one run at a time
            runs.enter_context(operator(
                node_cluster, mpi_operator, f"mpi-operator-{ns}",
                ["--namespace", ns, "--lock-namespace", ns, *flags], ready=MPI_READY))
        yield start


def mpijob(name: str, ns: str, workers: int, worker_priority: str | None = None,
           **scheduling: Any) -> dict[str, Any]:
    def template(command: str, prio: str | None) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": IMAGE, "imagePullPolicy": "Never",
                            "command": ["python", "-c", command],
                            "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}}}]}
        if prio:
            spec["priorityClassName"] = prio
        return {"spec": spec}
    job: dict[str, Any] = {
        "apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"slotsPerWorker": 1, "runPolicy": {"cleanPodPolicy": "None"},
                 "mpiReplicaSpecs": {
                     "Launcher": {"replicas": 1, "template": template(STAND_IN_MPIRUN, None)},
                     "Worker": {"replicas": workers, "template": template(
                         "import time; time.sleep(3600)", worker_priority)}}}}
    if scheduling:
        job["spec"]["runPolicy"]["schedulingPolicy"] = scheduling
    return job


async def _all_pods(kube: KubeApi, ns: str, name: str, count: int) -> list[dict[str, Any]]:
    async def made() -> list[dict[str, Any]] | None:
        pods = await pods_of(kube, ns, name)
        return pods if len(pods) == count else None
    found: list[dict[str, Any]] = await eventually(
        made, within=120, interval=0.5, what=f"the operator's {count} pods of {ns}/{name}")
    return found


async def test_mpijob_runs_to_completion_as_one_muster_gang(
        kube: KubeApi, node_cluster: NodeCluster, mpi_run: Any) -> None:
    ns = await ensure_namespace(kube, "ops-mpi", {
        keys.LABEL_GPU_TOPOLOGY: keys.LABEL_GPU_TOPOLOGY_ENABLED})  # policy mpi-topology
    mpi_run(ns)
    await kube.create(MPIJOBS, mpijob("runs", ns, workers=2), namespace=ns)
    job = await condition(kube, MPIJOBS, "runs", ns, "Succeeded")
    pods = await pods_of(kube, ns, "runs")
    assert len(pods) == 3  # the launcher (done) and both workers (cleanPodPolicy None)
    for pod in pods:
        ann = pod["metadata"]["annotations"]
        # the gang mpi-operator itself would make: the job's name, workers + launcher
        assert ann[keys.ANN_GANG_NAME] == "runs", pod["metadata"]["name"]
        assert ann[keys.ANN_GANG_MIN_MEMBER] == "3"
        assert pod["spec"]["schedulerName"] == keys.DEFAULT_BINDER_SCHEDULER_NAME
        assert pod["spec"]["nodeName"] == NODE_NAME
    (launcher,) = [p for p in pods if p["metadata"]["labels"][JOB_ROLE_LABEL] == "launcher"]
    assert launcher["status"]["phase"] == "Succeeded"
    printed = kubectl(node_cluster, "logs", "-n", ns, launcher["metadata"]["name"]).stdout
    hosts = [line.split()[0].split(".svc")[0] for line in printed.splitlines() if line.strip()]
    assert hosts == [f"runs-worker-{i}.runs.{ns}" for i in range(2)]  # the operator's hostfile
    assert job["status"]["replicaStatuses"]["Launcher"]["succeeded"] == 1
    await delete_and_wait(kube, MPIJOBS, "runs", ns)

    async def no_pods() -> bool:  # the garbage collector takes the job's pods
        return not await pods_of(kube, ns, "runs")
    await eventually(no_pods, within=120, what="the MPIJob's pods deleted with it")


def _quantities(resources: dict[str, str]) -> dict[str, tuple[int, bool]]:
    return {k: (parse_quantity(v)[0], False) for k, v in resources.items()}


def _fields(group: dict[str, Any]) -> dict[str, Any]:
    spec = group["spec"]
    return {"minMember": spec.get("minMember"), "queue": spec.get("queue"),
            "priorityClassName": spec.get("priorityClassName"),
            "minResources": _quantities(spec.get("minResources") or {})}


async def test_podgroup_is_the_one_mpi_operator_writes_and_muster_stands_aside_for_its_own(
        kube: KubeApi, mpi_run: Any) -> None:
    ns = await ensure_namespace(kube, "team-a")  # policy mpi-volcano
    await delete_all(kube, MPIJOBS, ns)
    try:
        await kube.create(PRIORITY_CLASSES, {"apiVersion": "scheduling.k8s.io/v1",
                                             "kind": "PriorityClass",
                                             "metadata": {"name": "ops-workers"}, "value": 500})
    except ApiError as exc:
        if not exc.conflict:
            raise
    spec = mpijob("same", ns, workers=2, worker_priority="ops-workers", queue="training")

    # gang scheduling off: Muster's PodGroup, then the job deleted takes it away
    mpi_run(ns)
    made = await kube.create(MPIJOBS, copy.deepcopy(spec), namespace=ns)
    pods = await _all_pods(kube, ns, "same", 3)
    muster = await kube.get(VOLCANO_PODGROUPS, "same", namespace=ns)
    assert muster["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "muster"
    assert muster["metadata"]["ownerReferences"][0]["uid"] == made["metadata"]["uid"]
    assert all(p["metadata"]["annotations"][keys.VOLCANO_GROUP_ANNOTATION] == "same"
               for p in pods)
    await delete_and_wait(kube, MPIJOBS, "same", ns, (VOLCANO_PODGROUPS, "same"))

    # the operator's own --gang-scheduling=volcano: its PodGroup, and no second one
    mpi_run(ns, "--gang-scheduling=volcano")
    made = await kube.create(MPIJOBS, copy.deepcopy(spec), namespace=ns)
    pods = await _all_pods(kube, ns, "same", 3)
    own = await kube.get(VOLCANO_PODGROUPS, "same", namespace=ns)
    assert "app.kubernetes.io/managed-by" not in (own["metadata"].get("labels") or {})
    assert own["metadata"]["ownerReferences"][0]["uid"] == made["metadata"]["uid"]
    groups = (await kube.list(VOLCANO_PODGROUPS, namespace=ns))["items"]
    assert [g["metadata"]["name"] for g in groups
            if g["metadata"]["ownerReferences"][0]["uid"] == made["metadata"]["uid"]] == ["same"]
    with pytest.raises(ApiError) as none:
        await kube.get(COSCHEDULING_PODGROUPS, "same", namespace=ns)
    assert none.value.not_found
    for pod in pods:  # Muster saw each pod (its policy annotation) and left the gang alone
        ann = pod["metadata"]["annotations"]
        assert ann[keys.VOLCANO_GROUP_ANNOTATION] == "same"
        assert keys.ANN_POLICY in ann
        assert pod["spec"]["schedulerName"] == "volcano"
    # what mpi-operator writes is what Muster wrote for the same job
    assert _fields(own) == _fields(muster)
    assert _fields(own)["priorityClassName"] == "ops-workers"

    # migration (docs/migration.md): the operator restarted without gang scheduling, the job in
    # flight; a worker it makes again joins the same PodGroup through Muster, left as it was
    mpi_run(ns)
    await kube.delete(PODS, "same-worker-0", ns)

    async def remade() -> dict[str, Any] | None:
        try:
            pod = await kube.get(PODS, "same-worker-0", namespace=ns)
        except ApiError as exc:
            if exc.not_found:
                return None
            raise
        return pod if pod["metadata"]["uid"] != _uid(pods, "same-worker-0") else None
    again: dict[str, Any] = await eventually(remade, within=120, interval=0.5,
                                             what="the operator to make same-worker-0 again")
    assert again["metadata"]["annotations"][keys.VOLCANO_GROUP_ANNOTATION] == "same"
    after = await kube.get(VOLCANO_PODGROUPS, "same", namespace=ns)
    assert after["metadata"]["uid"] == own["metadata"]["uid"]
    assert after["spec"] == own["spec"]
    await delete_and_wait(kube, MPIJOBS, "same", ns, (VOLCANO_PODGROUPS, "same"))


def _uid(pods: list[dict[str, Any]], name: str) -> str:
    return next(str(p["metadata"]["uid"]) for p in pods if p["metadata"]["name"] == name)


# --- JobSet and LeaderWorkerSet: their controllers and webhooks, cluster-wide ------------------

@pytest.fixture(scope="module")
def lws_controller(node_cluster: NodeCluster, tmp_path_factory: pytest.TempPathFactory
                   ) -> Iterator[None]:
    yield from module_controller(node_cluster, operators.LWS, tmp_path_factory.mktemp("lws"),
                                 19453)


async def test_jobset_controller_pods_join_one_gang_and_it_goes_with_the_jobset(
        kube: KubeApi, jobset_controller: None) -> None:
    ns = await ensure_namespace(kube, scenarios.VOLCANO_NS)  # policy jobset-volcano
    await delete_all(kube, scenarios.JOBSETS, ns)
    js = jobkinds.jobset("js-real", ns, [Replicated("driver"),
                                         Replicated("workers", replicas=2, parallelism=2)],
                         container=CONTAINER)
    await kube.create(scenarios.JOBSETS, js, namespace=ns)
    # the JobSet controller made 3 Jobs, the Job controller 5 pods: one gang of 5
    await scenarios.check(kube, ns, scenarios.Gang(
        VOLCANO_PODGROUPS, "js-real", 5, 5, f"{JOBSET_NAME_LABEL}=js-real"))
    await delete_and_wait(kube, scenarios.JOBSETS, "js-real", ns, (VOLCANO_PODGROUPS, "js-real"))


async def test_lws_controller_each_group_is_one_gang_and_they_go_with_it(
        kube: KubeApi, lws_controller: None) -> None:
    ns = await ensure_namespace(kube, scenarios.VOLCANO_NS)  # policy leaderworkerset-volcano
    await delete_all(kube, scenarios.LEADERWORKERSETS, ns)
    lws = jobkinds.leaderworkerset("lws-real", ns, groups=2, size=3, container=CONTAINER)
    await kube.create(scenarios.LEADERWORKERSETS, lws, namespace=ns)
    for g in range(2):  # the LWS controller's leader StatefulSet, each leader's worker one
        await scenarios.check(kube, ns, scenarios.Gang(
            VOLCANO_PODGROUPS, f"lws-real-{g}", 3, 3, f"{LWS_NAME_LABEL}=lws-real,"
            f"leaderworkerset.sigs.k8s.io/group-index={g}"))
    await delete_and_wait(kube, scenarios.LEADERWORKERSETS, "lws-real", ns,
                          (VOLCANO_PODGROUPS, "lws-real-0"), (VOLCANO_PODGROUPS, "lws-real-1"))


# --- the training operator (v1): PyTorchJob, elastic too ---------------------------------------

@pytest.fixture(scope="module")
def training_operator(node_cluster: NodeCluster, tmp_path_factory: pytest.TempPathFactory
                      ) -> Path:
    """Its CRDs (PyTorchJob...; not its v1 MPIJob) and a folder for each run's files."""
    tmp = tmp_path_factory.mktemp("training-operator")
    operators.build(operators.TRAINING_OPERATOR)
    with node_cluster.netns():
        install_crds(node_cluster, operators.TRAINING_OPERATOR, tmp)
    return tmp


def pytorchjob(name: str, ns: str, *, master: bool, workers: int, min_replicas: int | None = None,
               **scheduling: Any) -> dict[str, Any]:
    if min_replicas is not None:
        job = jobkinds.elastic_pytorchjob(name, ns, workers=workers, min_replicas=min_replicas,
                                          container=CONTAINER)
    else:
        job = jobkinds.elastic_pytorchjob(name, ns, workers=workers, min_replicas=None,
                                          container=CONTAINER)
        del job["spec"]["elasticPolicy"]
    specs = job["spec"]["pytorchReplicaSpecs"]
    if master:
        specs["Master"] = copy.deepcopy({**specs["Worker"], "replicas": 1})
    if scheduling:
        job["spec"]["runPolicy"] = {"schedulingPolicy": scheduling}
    return job


async def test_training_operator_pytorchjobs_are_one_gang_each_and_go_with_them(
        kube: KubeApi, node_cluster: NodeCluster, training_operator: Path) -> None:
    ns = await ensure_namespace(kube, scenarios.VOLCANO_NS)  # policy pytorchjob-volcano
    await delete_all(kube, scenarios.PYTORCHJOBS, ns)
    with training_operator_running(node_cluster, training_operator):
        await kube.create(scenarios.PYTORCHJOBS, pytorchjob("pt-real", ns, master=True,
                                                            workers=2), namespace=ns)
        await kube.create(scenarios.PYTORCHJOBS, pytorchjob("pt-elastic", ns, master=False,
                                                            workers=4, min_replicas=2),
                          namespace=ns)
        # the operator's pods: Master + 2 Workers, one gang of 3; 4 elastic Workers, a gang of 2
        await scenarios.check(kube, ns, scenarios.Gang(
            VOLCANO_PODGROUPS, "pt-real", 3, 3, f"{JOB_NAME_LABEL}=pt-real"))
        await scenarios.check(kube, ns, scenarios.Gang(
            VOLCANO_PODGROUPS, "pt-elastic", 2, 4, f"{JOB_NAME_LABEL}=pt-elastic"))
        for name in ("pt-real", "pt-elastic"):
            await delete_and_wait(kube, scenarios.PYTORCHJOBS, name, ns,
                                  (VOLCANO_PODGROUPS, name))


async def test_training_operator_own_gang_scheduling_gets_no_second_podgroup(
        kube: KubeApi, node_cluster: NodeCluster, training_operator: Path) -> None:
    ns = await ensure_namespace(kube, scenarios.VOLCANO_NS)
    await delete_all(kube, scenarios.PYTORCHJOBS, ns)
    spec = pytorchjob("pt-same", ns, master=True, workers=2, queue="training")
    with training_operator_running(node_cluster, training_operator):  # Muster's gang
        await kube.create(scenarios.PYTORCHJOBS, copy.deepcopy(spec), namespace=ns)
        muster = await scenarios.check(kube, ns, scenarios.Gang(
            VOLCANO_PODGROUPS, "pt-same", 3, 3, f"{JOB_NAME_LABEL}=pt-same"))
        assert muster["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "muster"
        await delete_and_wait(kube, scenarios.PYTORCHJOBS, "pt-same", ns,
                              (VOLCANO_PODGROUPS, "pt-same"))
    # its own coscheduling gang (with volcano it creates no pod until Volcano, which the proxy
    # does not serve, moves the PodGroup to Inqueue)
    with training_operator_running(node_cluster, training_operator,
                                   "--gang-scheduler-name=scheduler-plugins"):
        made = await kube.create(scenarios.PYTORCHJOBS, copy.deepcopy(spec), namespace=ns)
        own = await scenarios.check(kube, ns, scenarios.Gang(
            COSCHEDULING_PODGROUPS, "pt-same", 3, 3, f"{JOB_NAME_LABEL}=pt-same"))
        assert "app.kubernetes.io/managed-by" not in (own["metadata"].get("labels") or {})
        assert own["metadata"]["ownerReferences"][0]["uid"] == made["metadata"]["uid"]
        with pytest.raises(ApiError) as none:  # Muster stood aside: no Volcano one
            await kube.get(VOLCANO_PODGROUPS, "pt-same", namespace=ns)
        assert none.value.not_found
        pods = (await kube.list(PODS, namespace=ns,
                                label_selector=f"{JOB_NAME_LABEL}=pt-same"))["items"]
        assert all(keys.ANN_POLICY in p["metadata"]["annotations"]
                   and keys.VOLCANO_GROUP_ANNOTATION not in p["metadata"]["annotations"]
                   for p in pods)
        # what the operator asks of its gang is what Muster asked of its own
        fields = ("minMember", "minResources")  # coscheduling has no queue or priority
        assert {f: _fields(own)[f] for f in fields} == {f: _fields(muster)[f] for f in fields}
        await delete_and_wait(kube, scenarios.PYTORCHJOBS, "pt-same", ns,
                              (COSCHEDULING_PODGROUPS, "pt-same"))


# --- Kubeflow Trainer v2: TrainJob -> JobSet (JobSet's controller runs too) -------------------

@pytest.fixture(scope="module")
def trainer_controller(node_cluster: NodeCluster, jobset_controller: None,
                       tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Trainer's controller and webhooks, and its torch-distributed ClusterTrainingRuntime."""
    tmp = tmp_path_factory.mktemp("trainer")
    runtime = operators.module_dir(operators.TRAINER) / TORCH_RUNTIME
    for step in module_controller(node_cluster, operators.TRAINER, tmp, 19463):
        with node_cluster.netns():
            kubectl(node_cluster, "apply", "--server-side", "-f", str(runtime))
        yield step


TORCH_RUNTIME = "manifests/base/runtimes/torch_distributed.yaml"
CLUSTER_RUNTIMES = Resource("trainer.kubeflow.org", "v1alpha1", "clustertrainingruntimes", False,
                            "ClusterTrainingRuntime")


async def test_trainer_trainjob_is_one_gang_and_goes_with_it(
        kube: KubeApi, trainer_controller: None) -> None:
    ns = await ensure_namespace(kube, scenarios.COSCHEDULING_NS)  # policy trainjob-coscheduling
    await delete_all(kube, scenarios.TRAINJOBS, ns)
    await delete_all(kube, scenarios.JOBSETS, ns)
    await kube.create(scenarios.TRAINJOBS, jobkinds.trainjob("tj-real", ns, 3), namespace=ns)
    # Trainer made the JobSet, JobSet the Job, the Job controller 3 pods: one gang of 3
    group = await scenarios.check(kube, ns, scenarios.Gang(
        COSCHEDULING_PODGROUPS, "tj-real", 3, 3,
        f"{JOBSET_NAME_LABEL}=tj-real,{JOBSET_REPLICATED_JOB_LABEL}=node"))
    assert group["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "muster"
    await delete_and_wait(kube, scenarios.TRAINJOBS, "tj-real", ns,
                          (COSCHEDULING_PODGROUPS, "tj-real"))


async def test_trainer_podgrouppolicy_gets_no_second_podgroup(
        kube: KubeApi, trainer_controller: None) -> None:
    ns = await ensure_namespace(kube, scenarios.COSCHEDULING_NS)
    await delete_all(kube, scenarios.TRAINJOBS, ns)
    runtime = await kube.get(CLUSTER_RUNTIMES, "torch-distributed")
    gang = {"apiVersion": runtime["apiVersion"], "kind": runtime["kind"],
            "metadata": {"name": "torch-gang"},
            "spec": {**runtime["spec"],
                     "podGroupPolicy": {"coscheduling": {"scheduleTimeoutSeconds": 120}}}}
    try:
        await kube.create(CLUSTER_RUNTIMES, gang)
    except ApiError as exc:
        if not exc.conflict:
            raise
    made = await kube.create(scenarios.TRAINJOBS, jobkinds.trainjob(
        "tj-own", ns, 3, runtime="torch-gang"), namespace=ns)
    own = await scenarios.check(kube, ns, scenarios.Gang(
        COSCHEDULING_PODGROUPS, "tj-own", 3, 3,
        f"{JOBSET_NAME_LABEL}=tj-own,{JOBSET_REPLICATED_JOB_LABEL}=node"))
    # Trainer's own PodGroup, the only one; Muster left the pods in it
    assert "app.kubernetes.io/managed-by" not in (own["metadata"].get("labels") or {})
    assert own["metadata"]["ownerReferences"][0]["uid"] == made["metadata"]["uid"]
    # the policy's 300 is not written over it: JobSet's pod webhook made the API server call
    # Muster again on each pod, which then carried muster.io/policy beside Trainer's label
    assert own["spec"]["scheduleTimeoutSeconds"] == 120
    pods = (await kube.list(PODS, namespace=ns,
                            label_selector=f"{JOBSET_NAME_LABEL}=tj-own"))["items"]
    assert pods
    for pod in pods:
        ann = pod["metadata"]["annotations"]
        assert keys.ANN_POLICY in ann and keys.ANN_JOINED_GANG not in ann
        assert pod["metadata"]["labels"][keys.COSCHEDULING_GROUP_LABEL] == "tj-own"
    with pytest.raises(ApiError) as none:
        await kube.get(VOLCANO_PODGROUPS, "tj-own", namespace=ns)
    assert none.value.not_found
    await delete_and_wait(kube, scenarios.TRAINJOBS, "tj-own", ns,
                          (COSCHEDULING_PODGROUPS, "tj-own"))
