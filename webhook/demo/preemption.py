"""The demo's last scene: priority and preemption on the binder, after the reference scenario."""

from __future__ import annotations

from typing import Any

from webhook.binder.evict import PREEMPTED, PREEMPTING
from webhook.demo import scenario
from webhook.demo.outcome import PreemptionOutcome
from webhook.demo.progress import Progress
from webhook.demo.system import BINDER, Answer, Demo, Submitted, pod_outcome, submit, unless_waiting
from webhook.kube import EVENTS, PODS, ApiError


async def preempt(demo: Demo, progress: Progress) -> PreemptionOutcome | None:
    """Priority and preemption, after the reference scenario: the filler takes the free node,
    then the urgent job, which only a whole node holds, arrives; the binder evicts the gang
    that loses the least work, whole, and binds the urgent one on what it freed."""
    filler, urgent = scenario.FILLER, scenario.URGENT
    if not any(p["spec"].get("schedulerName") == BINDER.scheduler_name
               for p in await demo.pods()):
        progress.skip("preemption", "no gang is the binder's (no policy asks for GPU topology)")
        return None
    async with progress.step(f"an MPIJob of {filler.workers} workers x 1 GPU takes the free "
                             "node"):
        made = demo.submitted[filler.name] = await submit(demo.kube, filler)
        await unless_waiting(demo, f"{filler.name} to run", lambda: _all_running(demo, made))
        filler_node = (await _pod(demo, filler, made[0].name))["spec"]["nodeName"]
    async with progress.step(f"an urgent MPIJob of {urgent.workers} workers (priority "
                             f"{scenario.URGENT_PRIORITY}): the binder evicts a gang whole and "
                             "binds it in its place"):
        made = demo.submitted[urgent.name] = await submit(demo.kube, urgent)
        said: dict[str, str] = {}

        async def started() -> bool:
            said.update({e["reason"]: e["message"] for e in (await demo.kube.list(
                EVENTS, namespace=urgent.namespace))["items"]
                if e.get("reason") in (PREEMPTED, PREEMPTING)})
            return len(said) == 2 and await _all_running(demo, made)
        await unless_waiting(demo, f"{urgent.name} to run", started)
        gone = [job.name for job in (*scenario.JOBS, filler) if job.name in demo.submitted
                and not await _exists(demo, job, demo.submitted[job.name][0].name)]
        workers = [(m, await _pod(demo, urgent, m.name)) for m in made if m.role == "worker"]
    outcomes = [pod_outcome(m, pod, Answer([], [], []), demo.handed) for m, pod in workers]
    return PreemptionOutcome(
        filler_node, workers[0][1]["spec"]["nodeName"],
        tuple(sorted(g for o in outcomes for g in o.gpus)), gone, said[PREEMPTED],
        said[PREEMPTING], all(o.handed_exactly for o in outcomes))


async def _all_running(demo: Demo, made: list[Submitted]) -> bool:
    names = {m.name for m in made}
    running = {p["metadata"]["name"] for p in await demo.pods()
               if (p.get("status") or {}).get("phase") == "Running"}
    return names <= running


async def _pod(demo: Demo, job: scenario.Job, name: str) -> dict[str, Any]:
    return await demo.kube.get(PODS, name, namespace=job.namespace)


async def _exists(demo: Demo, job: scenario.Job, name: str) -> bool:
    try:
        await _pod(demo, job, name)
    except ApiError as exc:
        if exc.not_found:
            return False
        raise
    return True
