"""What `muster demo` prints: readable at a glance, every figure taken from what really happened."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from webhook.binder.evict import PREEMPTED, PREEMPTING
from webhook.demo import scenario
from webhook.demo.outcome import DemoResult, JobOutcome, PodOutcome, PreemptionOutcome
from webhook.topology.simulate import REFERENCE, reference_scenario


def _scalar(value: Any) -> str:
    """A value as YAML reads it: a string single-quoted, so that a JSON annotation's quotes
    stay as they are (a quote doubled), or JSON-escaped when it holds a character single
    quotes cannot carry (a newline)."""
    if isinstance(value, str) and value.isprintable():
        return "'" + value.replace("'", "''") + "'"
    return json.dumps(value, separators=(",", ":"))


def _op(op: dict[str, Any], indent: str) -> list[str]:
    """One JSON Patch operation; an object value (a new annotations map) one key per line."""
    head = f"{indent}{op['op']:<7} {op['path']}"  # RFC 6901 escaping shown as sent
    if op["op"] == "remove":
        return [head]
    value = op.get("value")
    if isinstance(value, dict) and value:
        return [head + ":"] + [f"{indent}          {k}: {_scalar(v)}" for k, v in value.items()]
    return [f"{head} = {_scalar(value)}"]


def _patch_lines(pod: PodOutcome, indent: str) -> list[str]:
    if not pod.patch:
        return [f"{indent}(no patch)"]
    return [line for op in pod.patch for line in _op(op, indent)]


def _pod_row(pod: PodOutcome) -> str:
    where = pod.node or "pending"
    gpus = f"GPUs {','.join(map(str, pod.gpus))}" if pod.gpus else ""
    plugin = ""
    if pod.uuids:  # what this pod's container was given, against what the binder wrote on it
        if pod.visible_devices is None:
            plugin = "device plugin: not started"
        elif pod.handed_exactly:
            plugin = "device plugin: exactly these GPUs"
        else:
            plugin = f"device plugin: MISMATCH (got {','.join(pod.visible_devices)})"
    return (f"    {pod.name:<28} {pod.role:<8} {len(pod.patch):>2} patch ops  {where:<8} "
            f"{gpus:<10} {plugin}")


def _job(job: JobOutcome) -> list[str]:
    lines = [f"  {job.namespace}/{job.name} ({job.kind}): policies "
             f"{', '.join(job.policies) or '(none)'}"]
    lines += _said(job, lambda pod: pod.overridden, "")
    lines += _said(job, lambda pod: pod.warnings, "warning: ")
    lines += [_pod_row(p) for p in job.pods]
    first: dict[str, PodOutcome] = {}
    for pod in job.pods:
        first.setdefault(pod.role, pod)
    for pod in first.values():
        lines.append(f"    patch received by {pod.name}:")
        lines += _patch_lines(pod, "      ")
    if job.gang:
        lines.append("    gang (pod annotations, binder): " + ", ".join(
            f"{k.removeprefix('muster.io/gang-')}={v}" for k, v in sorted(job.gang.items())))
    if job.pod_group is not None:
        lines += _pod_group(job.pod_group, job.scheduler_name)
    if job.bus_gbps is not None:
        node = next(p.node for p in job.pods if p.gpus)
        gpus = sorted(g for p in job.pods for g in p.gpus)
        lines.append(f"    placed: all {len(job.pods)} pods bound together, GPU pods on {node}"
                     f" GPUs {','.join(map(str, gpus))} (NVLink allreduce {job.bus_gbps:g} GB/s)")
    return lines


def _said(job: JobOutcome, what: Callable[[PodOutcome], list[str]], prefix: str) -> list[str]:
    """Each override or warning the webhook gave the job's pods, once, with the roles it was
    given to when not every pod got it."""
    roles: dict[str, set[str]] = {}
    for pod in job.pods:
        for line in what(pod):
            roles.setdefault(line, set()).add(pod.role)
    every = {p.role for p in job.pods}
    return [f"    {prefix}{line}" + ("" if got == every else f" [{', '.join(sorted(got))} only]")
            for line, got in roles.items()]


def _pod_group(pg: dict[str, Any], scheduler: str) -> list[str]:
    """The PodGroup's fields its scheduler reads (Volcano's queue and priority class,
    coscheduling's timeout)."""
    spec = pg.get("spec", {})
    volcano = pg["apiVersion"].startswith("scheduling.volcano.sh/")
    fields = ["minMember", "queue", "priorityClassName"] if volcano else [
        "minMember", "scheduleTimeoutSeconds"]
    res = ", ".join(f"{k} {v}" for k, v in sorted((spec.get("minResources") or {}).items()))
    return [f"    PodGroup {pg['apiVersion']} {pg['metadata']['name']}, created before the first"
            " pod was admitted:",
            *(f"      {name}: {spec.get(name, '-')}" for name in fields),
            f"      minResources: {res or '-'}",
            f"    (the pods' scheduler, {scheduler}, is not part of the demo: they stay pending)"]


def _error(modelled: float, published: float) -> str:
    return f"{100 * (modelled / published - 1):+.1f} %"


def format_result(result: DemoResult) -> str:
    lines = ["", "Muster demo: the reference scenario on 2 x DGX-1 V100: an MPIJob of 4 workers x"
             " 1 GPU + launcher, three times, and an Indexed Job of 4 ranks x 1 GPU", ""]
    for job in result.jobs:
        lines += [*_job(job), ""]
    placed = [j for j in result.jobs if j.images_per_s]
    if not placed:
        lines.append("  Modelled training throughput: none, no job was placed by Muster's binder"
                     " (no policy asks for GPU topology)")
    else:
        names = [m.name for m in reference_scenario().models]
        lines.append("  Modelled training throughput (img/s), from the GPUs each job got: published"
                     " single-GPU")
        lines.append("  figures, link speeds and a 10 GbE network (docs/topology.md); not fitted"
                     " to the reference:")
        lines.append("    " + f"{'':<40}" + "".join(f"{n:>10}" for n in names))
        rows = [(f"Muster, {j.name} (one node, best GPUs)", j.images_per_s) for j in placed]
        rows.append(("regular scheduling (2+2 over the network)", result.regular_images_per_s))
        for label, ips in rows:
            lines.append("    " + f"{label:<40}" + "".join(f"{ips[n]:>10.1f}" for n in names))
        best = placed[0].images_per_s
        regular = result.regular_images_per_s
        lines.append("    " + f"{'speed-up (modelled)':<40}" + "".join(
            f"{best[n] / regular[n]:>9.2f}x" for n in names))
        lines.append(f"    regular placement: {result.regular_placement}")
        lines.append("    published by Alibaba ACK: " + "; ".join(
            f"{n} {REFERENCE[n][0]} vs {REFERENCE[n][1]} ({REFERENCE[n][0] / REFERENCE[n][1]:.2f}x)"
            for n in names if n in REFERENCE))
        lines.append("    the model's error against it: " + "; ".join(
            f"{n} Muster {_error(best[n], REFERENCE[n][0])}, regular "
            f"{_error(regular[n], REFERENCE[n][1])}" for n in names if n in REFERENCE))
    if result.preemption is not None:
        lines += ["", *_preemption(result.preemption)]
    lines.append(f"\n  done in {result.seconds:.1f} s")
    return "\n".join(lines)


def _preemption(pe: PreemptionOutcome) -> list[str]:
    filler, urgent = scenario.FILLER, scenario.URGENT
    gpus = ",".join(map(str, pe.urgent_gpus))
    return [
        "  Priority and preemption (the binder's --preemption LowerPriority):",
        f"    {filler.namespace}/{filler.name} ({filler.workers} workers x 1 GPU) ran on "
        f"{pe.filler_node}; {urgent.namespace}/{urgent.name} ({urgent.workers} workers, priority "
        f"{scenario.URGENT_PRIORITY}) then found no node with {urgent.workers} free GPUs",
        "    evicted whole: " + (", ".join(f"{urgent.namespace}/{n}" for n in pe.evicted)
                                 or "nothing"),
        f"    {urgent.namespace}/{urgent.name} placed on {pe.urgent_node}, GPUs {gpus}; device "
        "plugin: " + ("exactly these GPUs" if pe.exact else "NOT the GPUs assigned"),
        f"    Event {PREEMPTING}: {pe.preempting}",
        f"    Event {PREEMPTED}: {pe.preempted}",
        "    (the MPI operator would create the evicted job's pods again: they wait for room)"]


def as_json(result: DemoResult) -> str:
    def pod(p: PodOutcome) -> dict[str, Any]:
        return {"name": p.name, "role": p.role, "patch": p.patch, "warnings": p.warnings,
                "overridden": p.overridden,
                "node": p.node, "gpus": list(p.gpus), "uuids": list(p.uuids),
                "visibleDevices": list(p.visible_devices) if p.visible_devices else None}

    return json.dumps({
        "jobs": [{"name": j.name, "namespace": j.namespace, "kind": j.kind,
                  "policies": j.policies, "gang": j.gang, "podGroup": j.pod_group,
                  "busGBps": j.bus_gbps, "modelledImagesPerSecond": j.images_per_s,
                  "pods": [pod(p) for p in j.pods]}
                 for j in result.jobs],
        "regular": {"placement": result.regular_placement,
                    "modelledImagesPerSecond": result.regular_images_per_s},
        "preemption": None if result.preemption is None else {
            "fillerNode": result.preemption.filler_node,
            "urgentNode": result.preemption.urgent_node,
            "urgentGpus": list(result.preemption.urgent_gpus),
            "evicted": result.preemption.evicted,
            "devicePluginExact": result.preemption.exact,
            "events": {PREEMPTING: result.preemption.preempting,
                       PREEMPTED: result.preemption.preempted}},
        "skipped": result.skipped,
        "seconds": result.seconds,
    }, indent=2)
