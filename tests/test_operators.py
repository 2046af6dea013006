"""What `e2e.node.operators` makes of an operator's module (its CRDs, webhook configurations and
kustomize patches, its Configuration), checked on a module laid out as upstream's, without
building or running anything."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.node import operators

_HOOKS = [
    {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
     "metadata": {"name": "mutating-webhook-configuration"},
     "webhooks": [
         {"name": "mjobset.kb.io", "clientConfig": {"service": {
             "name": "webhook-service", "namespace": "system", "path": "/mutate-jobset"}}},
         {"name": "mpod.kb.io", "clientConfig": {"service": {
             "name": "webhook-service", "namespace": "system", "path": "/mutate--v1-pod"}}}]},
    {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
     "metadata": {"name": "validating-webhook-configuration"},
     "webhooks": [
         {"name": "vjob.kb.io", "clientConfig": {"service": {
             "name": "webhook-service", "namespace": "system", "path": "/validate-job"}}},
         {"name": "vpytorchjob.kb.io", "clientConfig": {"service": {
             "name": "webhook-service", "namespace": "system", "path": "/validate-pt"}}}]}]
_POD_SELECTOR = {"matchExpressions": [{"key": "jobset.sigs.k8s.io/jobset-name",
                                       "operator": "Exists"}]}
_PATCH: list[dict[str, Any]] = [{"op": "replace", "path": "/webhooks/1", "value": {
    "name": "mpod.kb.io", "objectSelector": _POD_SELECTOR,
    "clientConfig": {"service": {"name": "webhook-service", "namespace": "system",
                                 "path": "/mutate--v1-pod"}}}}]
_OP = operators.Operator("js", "js", "example.com/js", "v1.0.0", "example.com/js", "crd",
                         "webhook/manifests.yaml", ("webhook/patch.yaml",),
                         "config.js.example.com/v1alpha1", crd_skip=("old.yaml",))


@pytest.fixture
def module(tmp_path: Path) -> Path:
    (tmp_path / "webhook").mkdir()
    (tmp_path / "webhook" / "manifests.yaml").write_text(yaml.safe_dump_all(_HOOKS))
    (tmp_path / "webhook" / "patch.yaml").write_text(yaml.safe_dump(_PATCH))
    (tmp_path / "crd").mkdir()
    crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition"}
    for name in ("jobs.yaml", "old.yaml"):
        (tmp_path / "crd" / name).write_text(yaml.safe_dump({**crd, "metadata": {"name": name}}))
    (tmp_path / "crd" / "kustomization.yaml").write_text("resources: [jobs.yaml]\n")
    return tmp_path


def test_the_operators_crds_less_the_skipped_ones(module: Path) -> None:
    assert [d["metadata"]["name"] for d in operators.crds(_OP, module)] == ["jobs.yaml"]


def test_webhooks_go_to_loopback_with_the_patches_applied(module: Path) -> None:
    docs = operators.webhook_configurations(_OP, module, "https://127.0.0.1:19443", b"CA",
                                            prefix="t-")
    assert [d["metadata"] for d in docs] == [{"name": "t-mutating-webhook-configuration"},
                                             {"name": "t-validating-webhook-configuration"}]
    pod = docs[0]["webhooks"][1]
    assert pod["objectSelector"] == _POD_SELECTOR  # the overlay's selector, not every pod
    assert pod["clientConfig"] == {"url": "https://127.0.0.1:19443/mutate--v1-pod",
                                   "caBundle": base64.b64encode(b"CA").decode()}


def test_a_patch_that_names_no_webhook_is_refused(module: Path) -> None:
    bad = [{**_PATCH[0], "value": {**_PATCH[0]["value"], "name": "gone.kb.io"}}]
    (module / "webhook" / "patch.yaml").write_text(yaml.safe_dump(bad))
    with pytest.raises(RuntimeError, match=r"'gone\.kb\.io' does not replace one of its"):
        operators.webhook_configurations(_OP, module, "https://127.0.0.1:1", b"CA", prefix="t-")


def test_a_service_webhook_keeps_only_the_kinds_run(module: Path) -> None:
    one = {**_OP.__dict__, "webhooks": "one.yaml"}
    (module / "one.yaml").write_text(yaml.safe_dump(_HOOKS[1]))
    doc = operators.service_webhook_configuration(
        operators.Operator(**one), module, "validator.x", ("ns", "svc", 443), keep="pytorchjob")
    assert doc["metadata"] == {"name": "validator.x"}
    assert [h["name"] for h in doc["webhooks"]] == ["vpytorchjob.kb.io"]
    assert doc["webhooks"][0]["clientConfig"] == {"service": {
        "namespace": "ns", "name": "svc", "port": 443, "path": "/validate-pt"}}


def test_configuration_serves_webhooks_on_loopback_without_rotation(tmp_path: Path) -> None:
    where = operators.serving(tmp_path, 19443)
    assert (where.cert_dir / "tls.crt").exists() and (where.cert_dir / "tls.key").exists()
    cfg = operators.manager_config(_OP, where)
    assert cfg["internalCertManagement"] == {"enable": False}
    assert cfg["webhook"] == {"port": 19443, "host": "127.0.0.1", "certDir": str(where.cert_dir)}
    trainer = operators.manager_config(operators.TRAINER, where)
    assert trainer["certManagement"] == {"enable": False}
    assert "certDir" not in trainer["webhook"]  # it reads $TMPDIR/k8s-webhook-server/...
    assert where.cert_dir == tmp_path / "k8s-webhook-server" / "serving-certs"
