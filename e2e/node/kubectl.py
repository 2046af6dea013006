"""kubectl and the upstream CRDs on a NodeCluster, for the real tier and bench_apiserver."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

from e2e.cluster import helm
from e2e.node.assets import REPO
from e2e.node.cluster import NodeCluster
from e2e.node.yamldocs import documents

SHARED_CRDS = REPO.parent / "shared" / "crds"
#: the upstream CRDs Muster's policies, the binder's network levels and the scenarios use
CRD_FILES = ("volcano", "scheduler-plugins", "mpijobs", "pytorchjobs", "jobsets", "trainjobs",
             "leaderworkersets", "kai-topologies")


def kubectl(cluster: NodeCluster, *args: str, check: bool = True,
            timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """kubectl on the cluster; call it with the thread inside the cluster's network."""
    tool = Path(helm()).with_name("kubectl")
    out = subprocess.run([str(tool), "--kubeconfig", str(cluster.kubeconfig), *args],
                         capture_output=True, text=True, timeout=timeout, check=False)
    if check and out.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed:\n{out.stderr}")
    return out


def crd_documents() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(SHARED_CRDS.glob("*.yaml")):
        if any(part in path.name for part in CRD_FILES):
            docs += documents(path.read_text())
    return docs


def write_list(path: Path, docs: list[dict[str, Any]]) -> Path:
    """`docs` as one v1 List in JSON, for `kubectl apply -f path`: megabytes of CRDs are
    written in 0.1 s, where YAML takes seconds."""
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}))
    return path


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
