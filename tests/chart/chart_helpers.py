"""Helpers for the chart tests: the real `helm` binary (PATH first, then .cache/bin) and lookups."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from webhook.cli import main

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "muster"
NAMESPACE = "muster-system"

Obj = dict[str, Any]


def helm_binary() -> str:
    found = shutil.which("helm") or str(REPO / ".cache" / "bin" / "helm")
    if not os.access(found, os.X_OK):
        pytest.fail("helm binary not found on PATH or in .cache/bin: run scripts/install-helm")
    return found


def run_helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm_binary(), *args], capture_output=True, text=True, timeout=60,
                          check=False)


def values_args(tmp: Path, values: Obj | None) -> list[str]:
    if not values:
        return []
    path = tmp / f"values-{len(list(tmp.iterdir()))}.yaml"
    path.write_text(yaml.safe_dump(values))
    return ["-f", str(path)]


def hook(obj: Obj) -> str | None:
    value = (obj.get("metadata", {}).get("annotations") or {}).get("helm.sh/hook")
    return str(value) if value is not None else None


def find(objs: list[Obj], kind: str, name: str | None = None) -> list[Obj]:
    return [o for o in objs
            if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def one(objs: list[Obj], kind: str, name: str | None = None) -> Obj:
    found = find(objs, kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {len(found)}"
    return found[0]


def pod_specs(objs: list[Obj]) -> Iterator[tuple[Obj, Obj]]:
    """(owner object, pod spec) for every workload, hook Job and test Pod."""
    for o in objs:
        if o["kind"] in ("Deployment", "DaemonSet", "Job"):
            yield o, o["spec"]["template"]["spec"]
        elif o["kind"] == "Pod":
            yield o, o["spec"]


async def run_cert_hook(objs: list[Obj], kubeconfig: Path) -> None:
    """The chart's certificate hook Job (`muster certs ensure`), run as its own command with its
    own arguments against the API server in `kubeconfig`."""
    job = one(objs, "Job", "muster-webhook-certs")
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level  # main() sets up process logging
    try:
        rc = await asyncio.to_thread(main, [*args, "--kubeconfig", str(kubeconfig)])
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    assert rc == 0
