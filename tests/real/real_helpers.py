"""Helpers of the real tier: kubectl and helm on the test cluster, the release's values."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

from e2e.cluster import chart_values, helm
from e2e.node import image
from e2e.node.assets import REPO
from e2e.node.cluster import NodeCluster

SHARED_CRDS = REPO.parent / "shared" / "crds"
#: the upstream CRDs Muster's policies and the scenarios use
CRD_FILES = ("volcano", "scheduler-plugins", "mpi")


def kubectl(cluster: NodeCluster, *args: str, check: bool = True,
            timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """kubectl on the cluster; call it with the thread inside the cluster's network."""
    tool = Path(helm()).with_name("kubectl")
    out = subprocess.run([str(tool), "--kubeconfig", str(cluster.kubeconfig), *args],
                         capture_output=True, text=True, timeout=timeout, check=False)
    if check and out.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed:\n{out.stderr}")
    return out


def run_helm(cluster: NodeCluster, *args: str, timeout: float = 420
             ) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([helm(), "--kubeconfig", str(cluster.kubeconfig), *args],
                         capture_output=True, text=True, timeout=timeout, check=False)
    if out.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{out.stdout}\n{out.stderr}")
    return out


def release_values(cluster: NodeCluster) -> dict[str, Any]:
    """The values an admin of this node would set: the shipped policies, the locally imported
    image and the fake NVML (no GPU here)."""
    values = chart_values(REPO / "policies")
    values["image"] = {"repository": image.IMAGE_REPOSITORY, "tag": image.IMAGE_TAG,
                       "pullPolicy": "Never"}
    values["agent"] = {"extraArgs": ["--fake-nvml=dgx1-v100"]}
    return values


def crd_documents() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(SHARED_CRDS.glob("*.yaml")):
        if any(part in path.name for part in CRD_FILES):
            docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def diagnostics(cluster: NodeCluster) -> str:
    """What a person debugging a red run needs first: every pod, the warnings, and the logs of
    each container that is not ready (call it inside the cluster's network)."""
    out = [kubectl(cluster, "get", "pods", "-A", "-o", "wide", check=False).stdout,
           kubectl(cluster, "get", "events", "-A", "--field-selector", "type=Warning",
                   check=False).stdout]
    pods = kubectl(cluster, "get", "pods", "-A", "-o", "json", check=False).stdout
    for pod in json.loads(pods or '{"items": []}')["items"]:
        statuses = pod.get("status", {}).get("containerStatuses", [])
        if all(s.get("ready") for s in statuses) and statuses:
            continue
        meta = pod["metadata"]
        for c in statuses:
            logs = kubectl(cluster, "logs", "-n", meta["namespace"], meta["name"], "-c",
                           c["name"], "--tail=30", check=False)
            out.append(f"--- logs {meta['namespace']}/{meta['name']} {c['name']}\n"
                       f"{logs.stdout}{logs.stderr}")
    return "\n".join(out)


def wait_established(cluster: NodeCluster, within: float = 60.0) -> None:
    """Every CRD served (`kubectl wait` fails on a CRD whose status is not written yet)."""
    deadline = time.monotonic() + within
    while True:
        crds = json.loads(kubectl(cluster, "get", "crd", "-o", "json").stdout)["items"]
        if all(any(c["type"] == "Established" and c["status"] == "True"
                   for c in crd.get("status", {}).get("conditions") or []) for crd in crds):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"CRDs not Established within {within:.0f}s")
        time.sleep(0.5)
