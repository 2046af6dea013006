"""pyproject.toml's floors stay above releases with known advisories, and constraints.txt pins a
tested version of every dependency inside those floors (scripts/test, CI and the image install
it with `pip install -c constraints.txt`)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]

#: the oldest release with none of the advisories we know of, per package; a floor below it
#: lets pip resolve to a vulnerable release beside other packages
SAFE = {
    # GHSA-2fqr-mr3j-6wp8, GHSA-4fvr-rgm6-gqmc (3.14.1); CVE-2026-22815, CVE-2026-34513..34525
    # (3.13.4); CVE-2025-69223..69230 (3.13.3); CVE-2025-53643 (3.12.14); CVE-2024-52304
    "aiohttp": "3.14.1",
    # CVE-2026-69247 (50.0.0), CVE-2026-69248/69249 (49.0.0), the OpenSSL in the wheels
    # (GHSA-537c-gmf6-5ccf 48.0.1; OpenSSL 4.0.2 in 50.0.1), CVE-2026-39892 (46.0.7)
    "cryptography": "50.0.1",
    "protobuf": "6.33.5",  # CVE-2026-0994 (json_format recursion), CVE-2025-4565
    "grpcio": "1.68.1",  # CVE-2024-7246 (HPACK), CVE-2024-11407
    "pyyaml": "5.4",  # CVE-2020-14343
    "pydantic": "2.4.0",  # CVE-2024-3772
    "pytest": "9.0.3",  # CVE-2025-71176
    "setuptools": "78.1.1",  # CVE-2025-47273, CVE-2024-6345 (the build backend)
}
#: transitive dependencies the pins must keep above theirs
SAFE_PINNED = {"urllib3": "2.6.3", "idna": "3.7", "certifi": "2024.7.4"}


def _pyproject() -> dict[str, list[Requirement]]:
    doc = tomllib.loads((REPO / "pyproject.toml").read_text())
    return {"runtime": [Requirement(r) for r in doc["project"]["dependencies"]],
            "dev": [Requirement(r) for r in doc["project"]["optional-dependencies"]["dev"]],
            "build": [Requirement(r) for r in doc["build-system"]["requires"]]}


def _pins() -> dict[str, Version]:
    pins = {}
    for raw in (REPO / "constraints.txt").read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            (spec,) = req.specifier
            assert spec.operator == "==", raw
            pins[canonicalize_name(req.name)] = Version(spec.version)
    return pins


def _floor(req: Requirement) -> Version | None:
    floors = [Version(s.version) for s in req.specifier if s.operator in (">=", "==", "~=")]
    return max(floors) if floors else None


@pytest.mark.parametrize("package", sorted(SAFE))
def test_floors_admit_no_release_with_a_known_advisory(package: str) -> None:
    reqs = [r for group in _pyproject().values() for r in group
            if canonicalize_name(r.name) == canonicalize_name(package)]
    assert reqs, f"{package} is no dependency any more: drop it from SAFE"
    for req in reqs:
        floor = _floor(req)
        assert floor is not None and floor >= Version(SAFE[package]), (
            f"{req}: the floor must be at least {SAFE[package]}")


def test_every_dependency_is_pinned_inside_its_floor() -> None:
    pins = _pins()
    groups = _pyproject()
    for req in groups["runtime"] + groups["dev"]:
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} has no pin in constraints.txt"
        assert pins[name] in req.specifier, f"pin {req.name}=={pins[name]} is outside {req}"
    for package, safe in {**SAFE, **SAFE_PINNED}.items():
        pinned = pins.get(canonicalize_name(package))
        if pinned is not None:
            assert pinned >= Version(safe), f"{package}=={pinned} is below {safe}"
