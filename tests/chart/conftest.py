"""Fixtures rendering charts/muster with the real helm binary."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent))

from chart_helpers import CHART, NAMESPACE, Obj, hook, run_helm, values_args


@pytest.fixture
def helm_template(tmp_path: Path) -> Callable[..., list[Obj]]:
    """helm template with values (a dict written to a file); returns the rendered objects."""

    def render(values: Obj | None = None, release: str = "muster",
               namespace: str = NAMESPACE, show_tests: bool = True) -> list[Obj]:
        args = ["template", release, str(CHART), "--namespace", namespace,
                *values_args(tmp_path, values)]
        proc = run_helm(*args)
        assert proc.returncode == 0, proc.stderr
        docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
        if not show_tests:
            docs = [d for d in docs if hook(d) != "test"]
        return docs

    return render


@pytest.fixture
def helm_template_error(tmp_path: Path) -> Callable[..., str]:
    """helm template expected to fail; returns its stderr."""

    def render(values: Obj | None = None, release: str = "muster") -> str:
        proc = run_helm("template", release, str(CHART), "--namespace", NAMESPACE,
                        *values_args(tmp_path, values))
        assert proc.returncode != 0, f"rendered although it should not:\n{proc.stdout[:2000]}"
        return proc.stderr

    return render
