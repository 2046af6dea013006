"""Fixtures of the policy tests: the real captured admission requests and the reference MPIJob."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from webhook.policy import PolicySet, load_policy_texts

REPO = Path(__file__).resolve().parents[2]
MPIJOB_UID = "1c5b470f-a297-11e9-964d-88d7f67c6e6d"  # the workers' ownerReference uid


def _request(shared: Path, name: str) -> dict[str, Any]:
    review = json.loads((shared / "fixtures" / "admission" / name).read_text())
    return dict(review["request"])


@pytest.fixture
def worker_pod(shared_dir: Path) -> dict[str, Any]:
    return dict(_request(shared_dir, "pod-create-worker.json")["object"])


@pytest.fixture
def launcher_pod(shared_dir: Path) -> dict[str, Any]:
    return dict(_request(shared_dir, "pod-create-launcher-generatename.json")["object"])


@pytest.fixture
def mpijob(shared_dir: Path) -> dict[str, Any]:
    """The reference MPIJob as the API server returns it (the fixture file has no uid yet)."""
    job = yaml.safe_load((shared_dir / "fixtures" / "jobs" / "mpijob-vgg16-4workers.yaml")
                         .read_text())
    job["metadata"]["uid"] = MPIJOB_UID
    return dict(job)


@pytest.fixture
def launcher_job(launcher_pod: dict[str, Any]) -> dict[str, Any]:
    ref = launcher_pod["metadata"]["ownerReferences"][0]
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": ref["name"], "namespace": "team-a", "uid": ref["uid"],
                         "ownerReferences": [{"apiVersion": "kubeflow.org/v2beta1",
                                              "kind": "MPIJob", "name": "tensorflow-topo-4-vgg16",
                                              "uid": MPIJOB_UID, "controller": True}]},
            "spec": {"template": {"spec": {"containers": [{"name": "mpi-launcher"}]}}}}


Policies = Callable[..., PolicySet]


@pytest.fixture
def policies() -> Policies:
    """policies("yaml text", ...) → PolicySet, each text one ConfigMap key."""
    def load(*texts: str) -> PolicySet:
        return load_policy_texts({f"p{i}.yaml": t for i, t in enumerate(texts)})
    return load


def policy(name: str, spec: str, *, indent: str = "  ") -> str:
    """A policy document; `spec` is YAML indented by two spaces under `spec:`."""
    body = "\n".join(indent + line if line else line for line in spec.strip("\n").split("\n"))
    return (f"apiVersion: muster.io/v1alpha1\nkind: SchedulingPolicy\nmetadata:\n  name: {name}\n"
            f"spec:\n{body}\n")


def deep(obj: Any) -> Any:
    return copy.deepcopy(obj)
