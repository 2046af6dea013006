"""Rendered PodGroups validate against the upstream CRDs' OpenAPI v3 schemas (../shared/crds)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from webhook.policy import OwnerRef, PodGroupSpec, podgroup_manifest


def validate(value: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """The structural-schema subset CRDs use; unknown fields are errors here (the API server
    would silently prune them, which is how a PodGroup loses its settings)."""
    errors: list[str] = []
    if schema.get("x-kubernetes-int-or-string"):
        if not isinstance(value, int | str) or isinstance(value, bool):
            return [f"{path}: int-or-string expected"]
    elif "type" in schema:
        kinds = {"object": dict, "array": list, "string": str, "integer": int, "boolean": bool,
                 "number": int | float}
        if not isinstance(value, kinds[schema["type"]]) or (
                schema["type"] in ("integer", "number") and isinstance(value, bool)):
            return [f"{path}: {schema['type']} expected, got {type(value).__name__}"]
    if isinstance(value, str):
        if "pattern" in schema and not re.search(schema["pattern"], value):
            errors.append(f"{path}: {value!r} does not match {schema['pattern']}")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            errors.append(f"{path}: longer than {schema['maxLength']}")
        if "enum" in schema and value not in schema["enum"]:
            errors.append(f"{path}: not one of {schema['enum']}")
    if isinstance(value, int) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append(f"{path}: below minimum {schema['minimum']}")
        if schema.get("format") == "int32" and not -(2**31) <= value < 2**31:
            errors.append(f"{path}: not an int32")
    if isinstance(value, dict) and schema.get("type") == "object":
        props = schema.get("properties")
        for name in schema.get("required", []):
            if name not in value:
                errors.append(f"{path}.{name}: required")
        for key, item in value.items():
            if props is not None and key in props:
                errors += validate(item, props[key], f"{path}.{key}")
            elif isinstance(schema.get("additionalProperties"), dict):
                errors += validate(item, schema["additionalProperties"], f"{path}.{key}")
            elif props is not None and not schema.get("x-kubernetes-preserve-unknown-fields"):
                errors.append(f"{path}.{key}: unknown field")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            errors += validate(item, schema["items"], f"{path}[{i}]")
    return errors


def crd_schema(shared: Path, file: str, version: str) -> dict[str, Any]:
    crd = yaml.safe_load((shared / "crds" / file).read_text())
    [v] = [v for v in crd["spec"]["versions"] if v["name"] == version]
    return dict(v["schema"]["openAPIV3Schema"])


OWNER = OwnerRef("kubeflow.org/v2beta1", "MPIJob", "tensorflow-topo-4-vgg16", "uid-1")


@pytest.mark.parametrize(("spec", "file", "version"), [
    (PodGroupSpec("volcano", "tensorflow-topo-4-vgg16", "team-a", 5,
                  {"cpu": "16500m", "memory": "65Gi", "nvidia.com/gpu": "4"}, "research", "high",
                  None, OWNER), "volcano-podgroups.yaml", "v1beta1"),
    (PodGroupSpec("volcano", "solo", "team-a", 1), "volcano-podgroups.yaml", "v1beta1"),
    (PodGroupSpec("coscheduling", "tensorflow-topo-4-vgg16", "team-b", 3,
                  {"cpu": "8500m", "memory": "33Gi"}, None, None, 300, OWNER),
     "scheduler-plugins-podgroups.yaml", "v1alpha1"),
])
def test_podgroups_validate_against_upstream_crds(spec: PodGroupSpec, file: str, version: str,
                                                  shared_dir: Path) -> None:
    manifest = podgroup_manifest(spec)
    assert manifest is not None
    assert manifest["apiVersion"].endswith("/" + version)
    assert validate(manifest, crd_schema(shared_dir, file, version)) == []
    assert manifest["spec"]["minMember"] == spec.min_member
    assert manifest["metadata"]["ownerReferences" if spec.owner else "name"]


def test_validator_catches_bad_podgroups(shared_dir: Path) -> None:
    schema = crd_schema(shared_dir, "volcano-podgroups.yaml", "v1beta1")
    bad = {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup", "metadata": {},
           "spec": {"minMember": "5", "queue": "Not_Valid", "minResources": {"cpu": "lots"},
                    "scheduleTimeoutSeconds": 5}}
    errors = validate(bad, schema)
    assert any("minMember: integer expected" in e for e in errors)
    assert any("queue" in e and "does not match" in e for e in errors)
    assert any("minResources.cpu" in e for e in errors)
    assert any("scheduleTimeoutSeconds: unknown field" in e for e in errors)


def test_backend_muster_has_no_podgroup_object() -> None:
    assert podgroup_manifest(PodGroupSpec("muster", "g", "ns", 2)) is None
