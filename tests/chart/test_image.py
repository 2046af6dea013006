"""The Dockerfile agrees with the chart: non-root uid, entrypoint, nothing secret in the context;
its base, frontend and every file pip fetches are pinned (digests, hashes).
(The real tier, tests/real, builds this Dockerfile with buildah and runs Muster from it.)"""

from __future__ import annotations

import json
import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

sys.path.insert(0, str(Path(__file__).parent))

from chart_helpers import CHART, REPO

from e2e.node.image_requirements import normalise, pins, platforms, render


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
                                                       "!requirements-image.txt", "!webhook/"}


def test_base_image_and_frontend_are_pinned_by_digest() -> None:
    """A tag can be rebuilt upstream; a digest cannot. Every stage is the pinned base."""
    text = (REPO / "Dockerfile").read_text()
    assert re.match(r"# syntax=docker/dockerfile:\d+\.\d+\.\d+@sha256:[0-9a-f]{64}\n", text)
    (base,) = re.findall(r"^ARG PYTHON=(\S+)$", text, re.MULTILINE)
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm@sha256:[0-9a-f]{64}", base), base
    stages = re.findall(r"^FROM (\S+)", text, re.MULTILINE)
    assert stages == ["${PYTHON}", "${PYTHON}"]


def _pip_installs() -> list[str]:
    text = re.sub(r"\\\n\s*", " ", (REPO / "Dockerfile").read_text())
    return [" ".join(cmd.split()) for ln in text.splitlines() if "pip install" in ln
            for cmd in ln.split("&&") if "pip install" in cmd]


def test_image_installs_the_hashed_set_and_nothing_else() -> None:
    """Every file pip fetches is checked against a hash (requirements-image.txt), nothing
    outside that list is resolved (--no-deps), and Muster is built offline with the pinned
    backend, not an unpinned one fetched into an isolated build environment."""
    deps, project = _pip_installs()
    assert all(flag in deps.split() for flag in (
        "--require-hashes", "--no-deps", "--only-binary=:all:", "-r", "requirements-image.txt"))
    assert project.endswith("pip install --no-deps --no-build-isolation --no-index .")
    text = (REPO / "Dockerfile").read_text()
    assert re.search(r"^COPY .*\brequirements-image\.txt\b", text, re.MULTILINE)


def _image_requirements() -> dict[str, tuple[str, list[str]]]:
    """requirements-image.txt as {normalised name: (version, sha256 hashes)}."""
    text = re.sub(r"\\\n\s*", " ", (REPO / "requirements-image.txt").read_text())
    out = {}
    for line in text.splitlines():
        if line.strip() and not line.startswith("#"):
            spec, *options = line.split()
            name, version = spec.split("==")
            assert all(o.startswith("--hash=sha256:") for o in options), line
            out[normalise(name)] = (version, [o.removeprefix("--hash=sha256:") for o in options])
    return out


def _runtime_closure() -> set[str]:
    """pyproject's dependencies and theirs, as installed (scripts/test installs the pins), for
    CPython 3.11 on Linux."""
    env = {"python_version": "3.11", "sys_platform": "linux", "platform_system": "Linux",
           "implementation_name": "cpython", "platform_python_implementation": "CPython",
           "os_name": "posix", "extra": ""}
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    todo = [Requirement(r) for r in project["dependencies"]]
    found: set[str] = set()
    while todo:
        req = todo.pop()
        if (req.marker and not req.marker.evaluate(env)) or normalise(req.name) in found:
            continue
        found.add(normalise(req.name))
        todo += [Requirement(r) for r in metadata.distribution(req.name).requires or []]
    return found


def test_image_requirements_cover_the_runtime_at_the_tested_versions() -> None:
    """requirements-image.txt (generated: e2e/node/image_requirements.py) holds every runtime
    dependency and the build backend, each at constraints.txt's version with a sha256."""
    listed = _image_requirements()
    build = tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]["requires"]
    assert set(listed) == _runtime_closure() | {normalise(Requirement(r).name) for r in build}
    tested = pins((REPO / "constraints.txt").read_text())
    for name, (version, hashes) in listed.items():
        assert version == tested[name], name
        assert hashes and all(re.fullmatch(r"[0-9a-f]{64}", h) for h in hashes), name


def test_image_requirements_generator_ranks_tags_and_refuses_unpinned() -> None:
    """The tags in pip's order on glibc 2.36 (best first, legacy aliases beside their glibc
    version, none older than the architecture has); a resolved package constraints.txt does
    not pin stops the generator rather than enter the image unpinned."""
    x86, arm = platforms("x86_64"), platforms("aarch64")
    assert x86[:2] == ["manylinux_2_36_x86_64", "manylinux_2_35_x86_64"]
    assert x86[x86.index("manylinux_2_17_x86_64") + 1] == "manylinux2014_x86_64"
    assert x86[-2:] == ["manylinux_2_5_x86_64", "manylinux1_x86_64"]
    assert arm[-2:] == ["manylinux_2_17_aarch64", "manylinux2014_aarch64"]
    resolved = [{"six": ("1.17.0", "a" * 64)}, {"six": ("1.17.0", "b" * 64)}]
    assert render(resolved, {"six": "1.17.0"}).endswith(
        f"six==1.17.0 \\\n    --hash=sha256:{'a' * 64} \\\n    --hash=sha256:{'b' * 64}\n")
    with pytest.raises(SystemExit, match=r"not pinned in constraints\.txt: six"):
        render(resolved, {})
