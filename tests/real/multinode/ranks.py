"""What the ranks of a job printed, read back through the kubelets, and checked against what
Muster's binder assigned: every rank sees exactly its pod's GPUs, and no GPU is held twice."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

from real_helpers import assigned_uuids, kubectl

from e2e.node.cluster import NodeCluster


async def printed(cluster: NodeCluster, pod: dict[str, Any], container: str | None = None
                  ) -> list[dict[str, Any]]:
    """The JSON lines (objects with a "rank") the pod's container printed, from its log."""
    meta = pod["metadata"]
    args = ["logs", "-n", meta["namespace"], meta["name"]]
    out = await asyncio.to_thread(kubectl, cluster, *args, *(["-c", container] if container
                                                             else []), check=False)
    lines = []
    for line in out.stdout.splitlines():
        if line.startswith("{"):
            try:
                found = json.loads(line)
            except ValueError:
                continue
            if isinstance(found, dict) and "rank" in found:
                lines.append(found)
    return lines


def visible(line: dict[str, Any]) -> list[str]:
    """The GPU UUIDs a rank saw (NVIDIA_VISIBLE_DEVICES, as Muster's device plugin sets it)."""
    return [u for u in str(line.get("visible", "")).split(",") if u]


def check_assignments(pods: list[dict[str, Any]], seen: dict[str, list[str]]) -> None:
    """Each pod saw exactly the GPUs the binder assigned it (pod name -> UUIDs seen), and no
    GPU of the cluster went to two pods."""
    for pod in pods:
        name = pod["metadata"]["name"]
        want = sorted(assigned_uuids(pod))
        # (whose scheduler, and whether the webhook made it a gang member, say why not)
        assert want, (f"{name} has no assignment of the binder: schedulerName "
                      f"{pod['spec'].get('schedulerName')}, annotations "
                      f"{sorted((pod['metadata'].get('annotations') or {}).items())}")
        assert sorted(seen[name]) == want, f"{name} saw {seen[name]}, the binder assigned {want}"
    held = Counter(u for uuids in seen.values() for u in uuids)
    assert not [u for u, n in held.items() if n > 1], f"GPUs held twice: {held}"


def check_sums(lines: list[dict[str, Any]], world: int) -> None:
    """One line per rank 0..world-1 of `e2e/train/rank.py`, each with the right allreduce sum."""
    assert sorted(ln["rank"] for ln in lines) == list(range(world)), lines
    for ln in lines:
        assert ln["world"] == world and ln["ok"], ln
        assert ln["sum"] == ln["expected"] == world * (world + 1) / 2, ln
