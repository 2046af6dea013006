"""The Dockerfile agrees with the chart: non-root uid, entrypoint, nothing secret in the context.
(The real tier, tests/real, builds this Dockerfile with buildah and runs Muster from it.)"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).parent))

from chart_helpers import CHART, REPO


def _final_stage() -> list[str]:
    text = (REPO / "Dockerfile").read_text()
    lines = [ln.strip() for ln in re.sub(r"\\\n", " ", text).splitlines()]
    instructions = [ln for ln in lines if ln and not ln.startswith("#")]
    last_from = max(i for i, ln in enumerate(instructions) if ln.upper().startswith("FROM "))
    return instructions[last_from:]


def test_image_runs_muster_as_the_chart_uid() -> None:
    stage = _final_stage()
    (user,) = [ln.split()[1] for ln in stage if ln.upper().startswith("USER ")]
    uid, gid = (int(x) for x in user.split(":"))
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert (uid, gid) == (values["podSecurityContext"]["runAsUser"],
                          values["podSecurityContext"]["runAsGroup"])
    assert uid != 0
    (entry,) = [ln.split(None, 1)[1] for ln in stage if ln.upper().startswith("ENTRYPOINT ")]
    assert json.loads(entry) == ["muster"]
    assert "slim" in (REPO / "Dockerfile").read_text().split("ARG PYTHON=", 1)[1].split()[0]
    # the image is for a read-only root filesystem: no bytecode written at run time
    assert any("PYTHONDONTWRITEBYTECODE=1" in ln for ln in stage)


def test_build_context_is_only_the_package() -> None:
    rules = [ln.strip() for ln in (REPO / ".dockerignore").read_text().splitlines()
             if ln.strip() and not ln.startswith("#")]
    assert rules[0] == "*"  # deny everything (certs/, .venv, .git), then allow
    assert {r for r in rules if r.startswith("!")} == {"!pyproject.toml", "!README.md",
                                                       "!constraints.txt", "!webhook/"}


def test_image_installs_the_pinned_set() -> None:
    """The image's dependencies are the versions CI tested (constraints.txt), from wheels."""
    text = re.sub(r"\\\n", " ", (REPO / "Dockerfile").read_text())
    (install,) = [ln for ln in text.splitlines() if "pip install" in ln]
    assert "-c constraints.txt" in install and "--only-binary=:all:" in install
    assert re.search(r"^COPY .*\bconstraints\.txt\b", text, re.MULTILINE)
