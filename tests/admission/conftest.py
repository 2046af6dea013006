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

