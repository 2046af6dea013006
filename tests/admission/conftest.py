"""Admission test fixtures; helpers live in admission_helpers (pytest runs importlib mode)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from admission_helpers import POLICIES, Tls, make_tls


@pytest.fixture
def tls(tmp_path: Path) -> Tls:
    return make_tls(tmp_path)


@pytest.fixture
def policy_dir(tmp_path: Path) -> Path:
    d = tmp_path / "policies"
    d.mkdir()
    (d / "mpi.yaml").write_text(POLICIES)
    return d


# TEMPORARY until tests/conftest.py provides them
from collections.abc import AsyncIterator  # noqa: E402

from webhook.emulator.server import ApiServerEmulator  # noqa: E402

SHARED = Path(__file__).resolve().parents[3] / "shared"


@pytest.fixture
async def apiserver() -> AsyncIterator[ApiServerEmulator]:
    api = ApiServerEmulator()
    for f in sorted((SHARED / "crds").glob("*.yaml")):
        api.load_yaml(f)
    api.seed({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}})
    async with api:
        yield api


@pytest.fixture
def kubeconfig(apiserver: ApiServerEmulator, tmp_path: Path) -> Path:
    return apiserver.write_kubeconfig(tmp_path / "kubeconfig")
