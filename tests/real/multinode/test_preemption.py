"""Preemption of real training jobs on four real nodes, as users meet it.

Two low-priority PyTorchJobs fill the two racks, training (DDP with gloo across two nodes, a
step a second, for as long as they are let run):
- `saver`, started first, saves its model every 2 steps and says so on its master pod
  (muster.io/last-checkpoint-time, written as its own ServiceAccount through the chart's
  annotation guard);
- `runner`, started after, saves nothing.

An urgent PyTorchJob arrives (a PriorityClass of 100000; the admin's training policy lets its
gangs preempt lower priority) that needs a whole rack. The binder evicts the job that loses the
least work: `saver`, whose last checkpoint is seconds old, though `runner` is the younger.
Then, through the real Eviction API, kubelets and training operator:
- saver's pods are evicted whole, runner's are untouched (the same pods, running);
- urgent is bound whole in saver's rack, trains to Succeeded, each rank on exactly the GPUs the
  binder assigned;
- both sides get their Events, saver's naming the checkpoint it resumes from, and
  `muster explain job` shows them to saver's owner;
- the operator makes saver's pods again: they wait, whole, while urgent holds the rack, and
  run whole in it once urgent has ended.
"""

from __future__ import annotations

import calendar
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from jobruns import TRAINER, ensure_trainer, finished, live, running
from jobs import ensure_namespace
from layout import GPUS_PER_NODE, RACKS, TRAINING_LABEL
from operator_runs import delete_all, delete_and_wait, training_operator_running
from ranks import check_assignments, check_sums, printed, visible
from real_helpers import delete_now, muster_json, pod_events

from e2e import training
from e2e.jobkind_scenarios import PYTORCHJOBS
from e2e.node.cluster import NodeCluster
from e2e.probes import eventually, pods_of
from webhook import keys
from webhook.binder.evict import PREEMPTED, PREEMPTING
from webhook.kube import KubeApi, Resource
from webhook.policy.workload import JOB_NAME_LABEL

NS = "train-preempt"
PRIORITY_CLASSES = Resource("scheduling.k8s.io", "v1", "priorityclasses", False, "PriorityClass")
LOW, URGENT = "muster-test-train-low", "muster-test-train-urgent"
JOBS = ("saver", "runner", "urgent")


def rack(pods: list[dict[str, Any]]) -> str:
    (found,) = {RACKS[p["spec"]["nodeName"]] for p in pods}
    return found


def epoch(stamp: str) -> int:
    return calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ"))


async def running_whole(kube: KubeApi, name: str) -> list[dict[str, Any]]:
    """The job's 2 live pods once both run, on two nodes."""
    found = await running(kube, NS, f"{JOB_NAME_LABEL}={name}", 2)
    assert len({p["spec"]["nodeName"] for p in found}) == 2, "two nodes"
    return found


@pytest.fixture
async def trainers(kube: KubeApi, node_cluster: NodeCluster, pytorch_operator: Path
                   ) -> AsyncIterator[None]:
    """The namespace (the admin's training policy), its ServiceAccount that may say when it
    checkpointed, the two PriorityClasses and the training operator; the jobs and classes gone
    after."""
    await ensure_namespace(kube, NS, TRAINING_LABEL)
    await ensure_trainer(kube, NS)
    for name, value in ((LOW, 100), (URGENT, 100000)):
        await delete_now(kube, PRIORITY_CLASSES.path(None, name))
        await kube.create(PRIORITY_CLASSES, {"apiVersion": "scheduling.k8s.io/v1",
                                             "kind": "PriorityClass", "metadata": {"name": name},
                                             "value": value})
    template = pytorch_operator / "init-container.yaml"
    template.write_text(training.PYTORCH_INIT_TEMPLATE)
    try:
        with training_operator_running(node_cluster, pytorch_operator, f"--namespace={NS}",
                                       *training.pytorch_operator_flags(template)):
            await delete_all(kube, PYTORCHJOBS, NS)
            try:
                yield
            finally:
                for name in JOBS:
                    await delete_and_wait(kube, PYTORCHJOBS, name, NS)
    finally:
        for name in (LOW, URGENT):
            await delete_now(kube, PRIORITY_CLASSES.path(None, name))


async def submit(kube: KubeApi, name: str, priority_class: str, **steps: Any) -> None:
    await kube.create(PYTORCHJOBS, training.pytorchjob(
        name, NS, workers=1, gpus_per_worker=GPUS_PER_NODE, service_account=TRAINER,
        priority_class=priority_class, **steps), namespace=NS)


async def test_the_job_that_saved_last_is_preempted_whole_and_comes_back_whole(
        kube: KubeApi, node_cluster: NodeCluster, trainers: None) -> None:
    # paced: a step a second, for longer than the test runs
    await submit(kube, "saver", LOW, steps=100_000, step_seconds=1, save_every=2)
    saver = await running_whole(kube, "saver")
    await submit(kube, "runner", LOW, steps=100_000, step_seconds=1)
    runner = await running_whole(kube, "runner")
    assert rack(saver) != rack(runner), "each fills a rack"
    assert {p["spec"]["priority"] for p in saver + runner} == {100}
    runner_started = max(epoch(p["status"]["startTime"]) for p in runner)

    async def saved_since_runner_started() -> str | None:
        for pod in live(await pods_of(kube, NS, "saver")):
            said = (pod["metadata"].get("annotations") or {}).get(keys.ANN_LAST_CHECKPOINT)
            if said and epoch(said) > runner_started + 2:
                return str(said)
        return None
    # saver's unsaved work is now seconds, runner's all it did since it started
    await eventually(saved_since_runner_started, within=120, interval=1,
                     what="saver to say a checkpoint after runner started")

    await submit(kube, "urgent", URGENT)
    assert await finished(kube, PYTORCHJOBS, "urgent", NS) == "Succeeded"
    urgent = await pods_of(kube, NS, "urgent")
    lines = {p["metadata"]["name"]: await printed(node_cluster, p) for p in urgent}
    check_sums([ln for got in lines.values() for ln in got], 2)
    check_assignments(urgent, {n: visible(got[0]) for n, got in lines.items()})
    assert rack(urgent) == rack(saver), "the freed rack"

    # runner was never touched; saver's pods all went, whole
    assert {p["metadata"]["uid"] for p in live(await pods_of(kube, NS, "runner"))} == {
        p["metadata"]["uid"] for p in runner}
    assert not {p["metadata"]["uid"] for p in saver} & {
        p["metadata"]["uid"] for p in await pods_of(kube, NS, "saver")}
    preempted = await pod_events(kube, NS, PREEMPTED)
    assert set(preempted) == {p["metadata"]["name"] for p in saver}, preempted
    told = preempted[saver[0]["metadata"]["name"]]
    assert told.startswith(f"preempted by gang {NS}/urgent of priority 100000: gang {NS}/saver "
                           "(priority 100) is evicted whole"), told
    assert f"its job's last checkpoint ({keys.ANN_LAST_CHECKPOINT}) was at " in told, told
    preempting = await pod_events(kube, NS, PREEMPTING)
    assert set(preempting) == {p["metadata"]["name"] for p in urgent}, preempting
    assert f"({NS}/saver; 16 GPUs)" in next(iter(preempting.values())), preempting

    # its owner asks the cluster what happened to saver: `muster explain` says it
    found = await muster_json(node_cluster.kubeconfig, "explain", "job", f"{NS}/saver")
    said = {(e["reason"], e["object"]) for e in found["events"]}
    assert {(PREEMPTED, f"pod/{p['metadata']['name']}") for p in saver} <= said, found["events"]

    # urgent has ended (its pods hold nothing): saver's new pods run whole in its rack again,
    # started no sooner than urgent's ranks ended (they waited while urgent held the rack)
    back = await running_whole(kube, "saver")
    assert rack(back) == rack(saver)
    ended = max(epoch(c["state"]["terminated"]["finishedAt"]) for p in urgent
                for c in p["status"]["containerStatuses"])
    assert all(epoch(p["status"]["startTime"]) >= ended for p in back), (ended, back)
    assert {p["metadata"]["uid"] for p in live(await pods_of(kube, NS, "runner"))} == {
        p["metadata"]["uid"] for p in runner}
