"""Analyze test setup: make the shared object builders importable (pytest runs importlib mode)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
