"""Shared pytest configuration. Area-specific fixtures live in tests/<area>/conftest.py."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """../shared beside the checkout: DESIGN.md, real admission fixtures, upstream CRDs."""
    if not SHARED.is_dir():
        pytest.fail(f"{SHARED} is missing: CI clones the repo with ../shared beside it")
    return SHARED
