"""values.schema.json: unknown keys and wrong types are refused by the real helm binary."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from chart_helpers import CHART, run_helm

Obj = dict[str, Any]


@pytest.mark.parametrize(("values", "where", "why"), [
    ({"replicas": 3}, "at ''", "additional properties 'replicas' not allowed"),
    ({"webhook": {"replicaz": 3}}, "at '/webhook'", "'replicaz' not allowed"),
    ({"certs": {"self": {"caDays": 10, "certDays": 5, "rotateBeforeDays": 1,
                         "checkIntervalSeconds": 60, "rotateAfter": 1}}},
     "at '/certs/self'", "'rotateAfter' not allowed"),
    ({"metrics": {"serviceMonitor": {"enabled": True, "scrapeEvery": "1m"}}},
     "at '/metrics/serviceMonitor'", "'scrapeEvery' not allowed"),
    ({"webhook": {"timeoutSeconds": "5"}}, "at '/webhook/timeoutSeconds'", "want integer"),
    ({"webhook": {"timeoutSeconds": 31}}, "at '/webhook/timeoutSeconds'", "maximum"),
    ({"webhook": {"replicas": 0}}, "at '/webhook/replicas'", "minimum"),
    ({"webhook": {"failurePolicy": "Sometimes"}}, "at '/webhook/failurePolicy'", "Ignore"),
    ({"webhook": {"excludeNamespaces": "kube-system"}}, "at '/webhook/excludeNamespaces'",
     "want array"),
    ({"webhook": {"excludeNamespaces": ["Not_A_Name"]}}, "at '/webhook/excludeNamespaces/0'",
     "pattern"),
    ({"binder": {"enabled": "yes"}}, "at '/binder/enabled'", "want boolean"),
    # one label, a label's key and value: else no namespace could carry it
    ({"webhook": {"failClosedNamespaceLabel": {"a": "b", "c": "d"}}},
     "at '/webhook/failClosedNamespaceLabel'", "maxProperties"),
    ({"webhook": {"failClosedNamespaceLabel": {"muster.io/admission": "not ok!"}}},
     "at '/webhook/failClosedNamespaceLabel/muster.io~1admission'", "pattern"),
    ({"webhook": {"failClosedNamespaceLabel": {"-bad": "x"}}}, "invalid propertyName", "-bad"),
    # a misspelt NetworkPolicy peer would admit or block the wrong sources
    ({"webhook": {"networkPolicy": {"enabled": True, "from": [{"ipblock": {"cidr": "x"}}]}}},
     "at '/webhook/networkPolicy/from/0'", "'ipblock' not allowed"),
    ({"binder": {"networkPolicy": {"enabled": True, "metricsFrom": [{}]}}},
     "at '/binder/networkPolicy/metricsFrom/0'", "minProperties"),
    ({"certs": {"mode": "magic"}}, "at '/certs/mode'", "self"),
    ({"policies": {"bad name!.yaml": "x"}}, "invalid propertyName", "bad name!.yaml"),
    ({"policies": {"a.yaml": {"kind": "SchedulingPolicy"}}}, "at '/policies/a.yaml'",
     "want string"),
    ({"podSecurityContext": {"runAsNonRoot": False}}, "at '/podSecurityContext/runAsNonRoot'",
     "true"),
    ({"image": {"repository": "r", "tag": 1, "digest": "", "pullPolicy": "Always"}},
     "at '/image/tag'", "want string"),
])
def test_schema_rejects(helm_template_error: Callable[..., str], values: Obj, where: str,
                        why: str) -> None:
    err = helm_template_error(values)
    assert "values don't meet the specifications of the schema" in err
    assert where in err and why in err, err


def test_schema_forbids_unknown_keys_in_every_object() -> None:
    """additionalProperties: false on every object the chart defines (free-form Kubernetes
    fragments such as affinity, selectors and resource maps are listed and typed `object`)."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    free_form = {"objectSelector", "affinity", "podSecurityContext", "nodeSelector",
                 "podAnnotations", "labels", "podLabels", "requests", "limits", "policies"}
    open_objects: list[str] = []

    def walk(node: Obj, path: str) -> None:
        if node.get("type") == "object" and "properties" in node:
            name = path.rsplit("/", 1)[-1]
            if node.get("additionalProperties") is not False and name not in free_form:
                open_objects.append(path or "/")
        for key, sub in node.get("properties", {}).items():
            walk(sub, f"{path}/{key}")
        if isinstance(node.get("items"), dict):
            walk(node["items"], f"{path}/items")

    walk(schema, "")
    for name, definition in schema["definitions"].items():
        walk(definition, f"#/definitions/{name}")
    assert open_objects == []
    assert schema["additionalProperties"] is False


def test_every_default_value_is_in_the_schema_and_valid() -> None:
    proc = run_helm("lint", str(CHART), "--strict")
    assert proc.returncode == 0, proc.stdout
    import yaml  # noqa: PLC0415

    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert set(values) == set(schema["properties"])
