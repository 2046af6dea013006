"""charts/muster rendered by the real helm binary: lint, every certificate mode, object checks."""

from __future__ import annotations

import argparse
import ast
import base64
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from webhook.demo import EXAMPLE_POLICIES

sys.path.insert(0, str(Path(__file__).parent))

from chart_helpers import CHART, NAMESPACE, Obj, find, hook, one, pod_specs, run_helm

from webhook import keys
from webhook.analyze.collect import serving_secret
from webhook.cli import main
from webhook.policy.errors import PolicyError
from webhook.policy.loader import load_policies

Render = Callable[..., list[Obj]]

CA_B64 = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
CA_B64 = CA_B64.decode()
EXTERNAL = {"certs": {"mode": "external",
                      "external": {"secretName": "admin-tls", "caBundle": CA_B64}}}
CERT_MODES: dict[str, Obj] = {
    "self": {},
    "certManager": {"certs": {"mode": "certManager"}},
    "certManager-issuer": {"certs": {"mode": "certManager", "certManager": {
        "issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}}}},
    "external": EXTERNAL,
}
COMBOS: dict[str, Obj] = {
    **CERT_MODES,
    "fail-closed+conditions": {"webhook": {
        "failurePolicy": "Fail", "excludeNamespaces": ["monitoring"],
        "objectSelector": {"matchExpressions": [
            {"key": "training.kubeflow.org/job-name", "operator": "Exists"}]},
        "matchConditions": [{"name": "gpu", "expression": "object.spec.containers.size() > 0"}]}},
    "webhook-only": {"binder": {"enabled": False}, "agent": {"enabled": False}},
    "dra-and-device-plugin": {"agent": {"gpuServing": "both"}},
    "no-leader-election": {"binder": {"leaderElection": {"enabled": False, "leaseName": "x"}}},
    "monitoring": {"metrics": {"serviceMonitor": {"enabled": True},
                               "prometheusRule": {"enabled": True}}},
    "no-pdb-no-uninstall-hook": {"webhook": {"podDisruptionBudget": {
        "enabled": False, "minAvailable": 1}}, "uninstall": {"removeWebhooksFirst": False}},
    "network-policy+local-metrics": {"webhook": {
        "networkPolicy": {"enabled": True, "from": [{"ipBlock": {"cidr": "10.0.0.0/8"}}]},
        "metricsLocalhostOnly": True, "priorityClassName": ""}},
}
ISTIO_INJECTOR = "istio-sidecar-injector"


def test_lint_is_clean_also_strict() -> None:
    for extra in ([], ["--strict"]):
        proc = run_helm("lint", str(CHART), *extra)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "[WARNING]" not in proc.stdout and "[ERROR]" not in proc.stdout, proc.stdout
        assert "0 chart(s) failed" in proc.stdout


@pytest.mark.parametrize("mode", ["certManager", "external"])
def test_lint_strict_in_each_cert_mode(tmp_path: Path, mode: str) -> None:
    import yaml  # noqa: PLC0415

    values = tmp_path / "v.yaml"
    values.write_text(yaml.safe_dump(EXTERNAL if mode == "external" else CERT_MODES[mode]))
    proc = run_helm("lint", str(CHART), "--strict", "-f", str(values))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[WARNING]" not in proc.stdout and "[ERROR]" not in proc.stdout


# --- invariants that hold for every combination ------------------------------------------------


def _rules(objs: list[Obj]) -> list[tuple[Obj, Obj]]:
    return [(o, r) for o in objs if o["kind"] in ("Role", "ClusterRole") for r in o["rules"]]


@pytest.mark.parametrize("combo", list(COMBOS))
def test_invariants(helm_template: Render, combo: str) -> None:
    objs = helm_template(COMBOS[combo])
    assert objs, "nothing rendered"
    cluster_scoped = {"ClusterRole", "ClusterRoleBinding", "MutatingWebhookConfiguration",
                      "ValidatingWebhookConfiguration", "ValidatingAdmissionPolicy",
                      "ValidatingAdmissionPolicyBinding", "DeviceClass"}
    for o in objs:
        assert o["apiVersion"] and o["metadata"]["name"], o
        if o["kind"] in cluster_scoped:
            assert "namespace" not in o["metadata"]
        elif o["kind"] not in ("Role", "RoleBinding"):  # the test Role lives in tests.namespace
            assert o["metadata"]["namespace"] == NAMESPACE, o["metadata"]

    # no empty keys left by a template (`annotations:` with nothing under it renders null)
    def nulls(node: object, path: str) -> list[str]:
        if isinstance(node, dict):
            return [p for k, v in node.items() for p in nulls(v, f"{path}.{k}")]
        if isinstance(node, list):
            return [p for i, v in enumerate(node) for p in nulls(v, f"{path}[{i}]")]
        return [path] if node is None else []

    assert [p for o in objs for p in nulls(o, o["kind"])] == []

    # least privilege: never a wildcard
    for role, rule in _rules(objs):
        for field in ("verbs", "resources", "apiGroups", "resourceNames"):
            assert "*" not in rule.get(field, []), (role["metadata"]["name"], rule)
            assert not any("*" in str(v) for v in rule.get(field, [])), (role["metadata"], rule)

    # security contexts on every pod the chart creates
    for owner, spec in pod_specs(objs):
        where = f"{owner['kind']}/{owner['metadata']['name']}"
        psc = spec["securityContext"]
        assert psc["seccompProfile"]["type"] == "RuntimeDefault", where
        is_agent = owner["kind"] == "DaemonSet"
        if not is_agent:
            assert psc["runAsNonRoot"] is True and psc["runAsUser"] != 0, where
        assert not spec.get("hostNetwork") and not spec.get("hostPID"), where
        for c in spec["containers"] + spec.get("initContainers", []):
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False, where
            assert sc["readOnlyRootFilesystem"] is True, where
            assert sc["privileged"] is False, where
            assert sc["capabilities"] == {"drop": ["ALL"]}, where
            assert c["resources"]["limits"]["memory"], where

    # the webhook configurations: ordering, fail-open, exclusions
    mwc = one(objs, "MutatingWebhookConfiguration")
    name = mwc["metadata"]["name"]
    assert name < ISTIO_INJECTOR
    assert sorted([ISTIO_INJECTOR, "istio-revision-tag-default", name])[0] == name
    (wh,) = mwc["webhooks"]
    assert wh["rules"] == [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                            "resources": ["pods"], "scope": "Namespaced"}]
    assert wh["sideEffects"] == "NoneOnDryRun"
    assert wh["reinvocationPolicy"] == "IfNeeded"
    assert wh["admissionReviewVersions"] == ["v1"]
    assert 1 <= wh["timeoutSeconds"] <= 10
    assert wh["clientConfig"]["service"]["path"] == "/mutate/pods"
    (expr, *_) = wh["namespaceSelector"]["matchExpressions"]
    assert expr["key"] == "kubernetes.io/metadata.name" and expr["operator"] == "NotIn"
    assert {"kube-system", NAMESPACE} <= set(expr["values"])
    vwc = one(objs, "ValidatingWebhookConfiguration")
    assert vwc["metadata"]["name"] == name
    (vwh,) = vwc["webhooks"]
    assert vwh["clientConfig"]["service"]["path"] == "/validate/policies"
    assert vwh["sideEffects"] == "None"
    policies_cm = one(objs, "ConfigMap", "muster-policies")
    for key, value in vwh["objectSelector"]["matchLabels"].items():
        assert policies_cm["metadata"]["labels"][key] == value
    assert vwh["rules"][0]["resources"] == ["configmaps"]


def test_default_webhook_is_fail_open_and_excludes_system_namespaces(helm_template: Render) -> None:
    objs = helm_template()
    (wh,) = one(objs, "MutatingWebhookConfiguration")["webhooks"]
    assert wh["failurePolicy"] == "Ignore"
    (vwh,) = one(objs, "ValidatingWebhookConfiguration")["webhooks"]
    assert vwh["failurePolicy"] == "Ignore"
    values = wh["namespaceSelector"]["matchExpressions"][0]["values"]
    assert values == ["kube-system", NAMESPACE, "kube-public", "kube-node-lease"]


def test_admin_listed_exclusions_and_selectors(helm_template: Render) -> None:
    objs = helm_template(COMBOS["fail-closed+conditions"])
    (wh,) = one(objs, "MutatingWebhookConfiguration")["webhooks"]
    assert wh["failurePolicy"] == "Fail"
    assert wh["namespaceSelector"]["matchExpressions"][0]["values"] == [
        "kube-system", NAMESPACE, "monitoring"]
    assert wh["objectSelector"]["matchExpressions"][0]["operator"] == "Exists"
    assert wh["matchConditions"][0]["name"] == "gpu"
    args = one(objs, "Deployment", "muster-webhook")["spec"]["template"]["spec"]["containers"][0]
    assert "--exclude-namespace=monitoring" in args["args"]


def test_fail_closed_namespaces_get_an_entry_of_their_own(helm_template: Render) -> None:
    """The namespaces labelled fail-closed go to /mutate/pods/fail-closed with failurePolicy
    Fail, and only there: the two entries' selectors split every namespace between them, so no
    pod is sent twice, and the rest keep the fail-open default."""
    objs = helm_template({"webhook": {"failClosedNamespaceLabel": {"muster.io/admission":
                                                                   "required"}}})
    opened, closed = one(objs, "MutatingWebhookConfiguration")["webhooks"]
    assert (opened["name"], opened["failurePolicy"],
            opened["clientConfig"]["service"]["path"]) == ("pods.muster.io", "Ignore",
                                                           "/mutate/pods")
    assert (closed["name"], closed["failurePolicy"],
            closed["clientConfig"]["service"]["path"]) == ("pods-fail-closed.muster.io", "Fail",
                                                           keys.FAIL_CLOSED_PATH)
    label = {"key": "muster.io/admission", "values": ["required"]}
    assert opened["namespaceSelector"]["matchExpressions"][1] == {**label, "operator": "NotIn"}
    assert closed["namespaceSelector"]["matchExpressions"][1] == {**label, "operator": "In"}
    excluded = ["kube-system", NAMESPACE, "kube-public", "kube-node-lease"]
    for wh in (opened, closed):
        assert wh["namespaceSelector"]["matchExpressions"][0]["values"] == excluded
        assert {k: v for k, v in wh.items() if k not in (
            "name", "failurePolicy", "clientConfig", "namespaceSelector")} == {
            k: v for k, v in opened.items() if k not in (
                "name", "failurePolicy", "clientConfig", "namespaceSelector")}


def test_release_namespace_is_always_excluded(helm_template: Render) -> None:
    objs = helm_template({"webhook": {"excludeNamespaces": []}}, namespace="gpu-infra")
    (wh,) = one(objs, "MutatingWebhookConfiguration")["webhooks"]
    assert wh["namespaceSelector"]["matchExpressions"][0]["values"] == ["kube-system", "gpu-infra"]


def test_name_that_would_sort_after_istio_is_refused(
    helm_template_error: Callable[..., str],
) -> None:
    err = helm_template_error({"webhook": {"configurationNamePrefix": ""}})
    assert 'must sort before \\"istio-sidecar-injector\\"' in err or "must sort before" in err


# --- certificates ------------------------------------------------------------------------------


def _webhook_pod(objs: list[Obj]) -> Obj:
    return one(objs, "Deployment", "muster-webhook")["spec"]["template"]["spec"]


def _tls_volume_secret(objs: list[Obj]) -> str:
    vols = {v["name"]: v for v in _webhook_pod(objs)["volumes"]}
    return str(vols["tls"]["secret"]["secretName"])


def _arg(args: list[str], flag: str) -> str:
    values = [a.split("=", 1)[1] for a in args if a.startswith(flag + "=")]
    assert len(values) == 1, (flag, args)
    return values[0]


@pytest.mark.parametrize("lookup", [False, True])
def test_self_mode_never_templates_ca_bundle(helm_template: Render, lookup: bool) -> None:
    # with lookupCaBundle, only a live CA Secret (never `helm template`) fills it in
    objs = helm_template({"certs": {"self": {"caDays": 3650, "certDays": 365,
                                             "rotateBeforeDays": 30, "checkIntervalSeconds": 600,
                                             "lookupCaBundle": lookup}}})
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        cfg = one(objs, kind)
        for wh in cfg["webhooks"]:
            assert "caBundle" not in wh["clientConfig"], kind
        assert "cert-manager.io/inject-ca-from" not in (cfg["metadata"].get("annotations") or {})
    # the certificate manager (rotator and hook Job) owns exactly the objects the chart uses
    rotator = one(objs, "Deployment", "muster-cert-rotator")["spec"]["template"]["spec"]
    (rotator_container,) = rotator["containers"]
    job = one(objs, "Job", "muster-webhook-certs")
    job_args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    name = one(objs, "MutatingWebhookConfiguration")["metadata"]["name"]
    for args in (rotator_container["args"], job_args):
        assert _arg(args, "--tls-secret") == _tls_volume_secret(objs)
        assert _arg(args, "--service-name") == one(objs, "Service", "muster-webhook")[
            "metadata"]["name"]
        assert _arg(args, "--namespace") == NAMESPACE
        assert _arg(args, "--mutating-webhook-configuration") == name
        assert _arg(args, "--validating-webhook-configuration") == name
    assert hook(job) == "pre-install,pre-upgrade,post-install,post-upgrade"
    containers = {c["name"]: c for c in _webhook_pod(objs)["containers"]}
    assert list(containers) == ["webhook"]
    assert _arg(containers["webhook"]["args"], "--cert-mode") == "files"
    # the Secrets are not Helm objects: upgrade and uninstall cannot drop them
    assert not find(objs, "Secret")
    _assert_only_the_rotator_and_hook_write_certificates(objs, name)


def _writers(objs: list[Obj], rules_of: Callable[[Obj], list[Obj]], kind: str
             ) -> set[str]:
    """The ServiceAccounts bound to a role of `kind` with a rule that `rules_of` picks."""
    roles = {r["metadata"]["name"] for r in find(objs, kind) if rules_of(r)}
    return {s["name"] for b in find(objs, kind + "Binding") if b["roleRef"]["name"] in roles
            for s in b["subjects"]}


def _assert_only_the_rotator_and_hook_write_certificates(objs: list[Obj], config: str) -> None:
    """The webhook's pods (reachable by the API server and, on its admission port, by pods)
    hold no right to its Secrets or webhook configurations: a compromised webhook cannot
    widen its own rules or read the CA key. The rotator and the install hook do, by name."""
    def admreg(role: Obj) -> list[Obj]:
        return [r for r in role["rules"]
                if "admissionregistration.k8s.io" in r["apiGroups"]
                and {"update", "patch"} & set(r["verbs"])]

    def secrets(role: Obj) -> list[Obj]:  # read (the CA key) or write; uninstall's delete aside
        return [r for r in role["rules"] if "secrets" in r["resources"]
                and {"get", "list", "watch", "create", "update", "patch"} & set(r["verbs"])]

    assert _writers(objs, admreg, "ClusterRole") == {"muster-cert-rotator",
                                                     "muster-webhook-certs"}
    assert _writers(objs, secrets, "Role") == {"muster-cert-rotator", "muster-webhook-certs"}
    rotator = one(objs, "ClusterRole", "muster-cert-rotator")
    assert admreg(rotator) == rotator["rules"] == [{
        "apiGroups": ["admissionregistration.k8s.io"],
        "resources": ["mutatingwebhookconfigurations", "validatingwebhookconfigurations"],
        "resourceNames": [config], "verbs": ["get", "update", "patch"]}]
    assert one(objs, "Role", "muster-cert-rotator")["rules"] == [{
        "apiGroups": [""], "resources": ["secrets"],
        "resourceNames": ["muster-webhook-tls", "muster-webhook-ca"],
        "verbs": ["get", "update"]}]
    pod = one(objs, "Deployment", "muster-cert-rotator")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "muster-cert-rotator"
    assert "ports" not in pod["containers"][0]


@pytest.mark.parametrize("mode", ["certManager", "certManager-issuer"])
def test_cert_manager_mode(helm_template: Render, mode: str) -> None:
    objs = helm_template(CERT_MODES[mode])
    certs = {c["metadata"]["name"]: c for c in find(objs, "Certificate")}
    serving = certs["muster-webhook"]
    assert serving["spec"]["secretName"] == _tls_volume_secret(objs)
    assert "muster-webhook.muster-system.svc" in serving["spec"]["dnsNames"]
    assert "server auth" in serving["spec"]["usages"]
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        cfg = one(objs, kind)
        assert cfg["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == (
            f"{NAMESPACE}/muster-webhook")
        assert all("caBundle" not in wh["clientConfig"] for wh in cfg["webhooks"])
    assert not find(objs, "Job", "muster-webhook-certs")
    assert "certs" not in {c["name"] for c in _webhook_pod(objs)["containers"]}
    if mode == "certManager":  # bootstrap chain: self-signed Issuer -> CA Certificate -> CA Issuer
        assert certs["muster-webhook-ca"]["spec"]["isCA"] is True
        assert serving["spec"]["issuerRef"]["name"] == "muster-webhook-ca"
        assert {i["metadata"]["name"] for i in find(objs, "Issuer")} == {
            "muster-webhook-ca", "muster-webhook-ca-bootstrap"}
    else:
        assert serving["spec"]["issuerRef"] == {
            "name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}
        assert not find(objs, "Issuer") and len(certs) == 1


def test_external_mode_uses_admin_secret_and_bundle(helm_template: Render) -> None:
    objs = helm_template(EXTERNAL)
    assert _tls_volume_secret(objs) == "admin-tls"
    # `muster analyze` checks the certificate of the Secret the webhook mounts
    assert serving_secret(one(objs, "Deployment", "muster-webhook")) == "admin-tls"
    assert serving_secret(one(helm_template({}), "Deployment", "muster-webhook")) == \
        "muster-webhook-tls"
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for wh in one(objs, kind)["webhooks"]:
            assert wh["clientConfig"]["caBundle"] == CA_B64
    assert not find(objs, "Certificate") and not find(objs, "Job", "muster-webhook-certs")
    # no rights on webhook configurations or Secrets in this mode
    assert all("admissionregistration.k8s.io" not in r["apiGroups"]
               for r in one(objs, "ClusterRole", "muster-webhook")["rules"])
    assert [r["resources"] for r in one(objs, "Role", "muster-webhook")["rules"]] == [
        ["configmaps"], ["leases"], ["leases"]]


@pytest.mark.parametrize(("values", "message"), [
    ({"certs": {"mode": "external", "external": {"caBundle": CA_B64}}},
     "certs.external.secretName is required"),
    ({"certs": {"mode": "external", "external": {"secretName": "s"}}},
     "certs.external.caBundle (base64 PEM) is required"),
])
def test_external_mode_requires_its_values(
    helm_template_error: Callable[..., str], values: Obj, message: str
) -> None:
    assert message in helm_template_error(values)


# --- workloads ---------------------------------------------------------------------------------


def test_webhook_deployment_is_highly_available(helm_template: Render) -> None:
    objs = helm_template()
    dep = one(objs, "Deployment", "muster-webhook")
    spec = dep["spec"]
    assert spec["replicas"] >= 2
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    pod = spec["template"]["spec"]
    selector = spec["selector"]["matchLabels"]
    assert pod["topologySpreadConstraints"][0]["topologyKey"] == "kubernetes.io/hostname"
    assert pod["topologySpreadConstraints"][0]["labelSelector"]["matchLabels"] == selector
    anti = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert anti[0]["podAffinityTerm"]["labelSelector"]["matchLabels"] == selector
    pdb = one(objs, "PodDisruptionBudget", "muster-webhook")
    assert pdb["spec"]["selector"]["matchLabels"] == selector
    assert pdb["spec"]["minAvailable"] == 1 < spec["replicas"]
    c = next(c for c in pod["containers"] if c["name"] == "webhook")
    assert c["ports"] == [{"name": "https", "containerPort": 8443, "protocol": "TCP"},
                          {"name": "metrics", "containerPort": 8080, "protocol": "TCP"}]
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "https", "scheme": "HTTPS"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "https",
                                             "scheme": "HTTPS"}
    sleep = int(c["lifecycle"]["preStop"]["exec"]["command"][1])
    assert 0 < sleep < pod["terminationGracePeriodSeconds"]
    assert c["args"][c["args"].index("serve") + 1:][:5] == [
        "--port=8443", "--policies=/etc/muster/policies",
        "--tls-cert-file=/etc/muster/tls/tls.crt", "--tls-key-file=/etc/muster/tls/tls.key",
        "--on-user-assignment=strip"]
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert mounts["tls"] == "/etc/muster/tls" and mounts["policies"] == "/etc/muster/policies"
    svc = one(objs, "Service", "muster-webhook")
    assert svc["spec"]["selector"] == selector
    assert [(p["name"], p["port"], p["targetPort"]) for p in svc["spec"]["ports"]] == [
        ("https", 443, "https"), ("metrics", 8080, "metrics")]
    (wh,) = one(objs, "MutatingWebhookConfiguration")["webhooks"]
    assert wh["clientConfig"]["service"] == {"name": "muster-webhook", "namespace": NAMESPACE,
                                             "path": "/mutate/pods", "port": 443}


@pytest.mark.parametrize("component", ["webhook", "binder"])
def test_pdb_that_would_block_every_drain_is_refused(
    helm_template_error: Callable[..., str], component: str
) -> None:
    err = helm_template_error({component: {"replicas": 1, "podDisruptionBudget": {
        "enabled": True, "minAvailable": 1}}})
    assert f"{component}.podDisruptionBudget.minAvailable (1) must be below" in err


def test_binder_runs_leader_elected(helm_template: Render) -> None:
    objs = helm_template()
    dep = one(objs, "Deployment", "muster-binder")
    assert dep["spec"]["replicas"] == 2
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "bind" in args and "--leader-elect" in args
    assert _arg(args, "--lease-namespace") == NAMESPACE
    assert _arg(args, "--scheduler-name") == "muster-binder"
    lease_role = one(objs, "Role", "muster-binder-leader")
    named = [r for r in lease_role["rules"] if r.get("resourceNames")]
    assert named == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                      "resourceNames": [_arg(args, "--lease-name")], "verbs": ["get", "update"]}]
    env = {e["name"]: e for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert "--identity=$(POD_NAME)" in args


@pytest.mark.parametrize(("levels", "flag"), [
    (None, None),
    ("topograph", "topograph"),
    ("volcano", "volcano"),
    # a Topology object in the cluster, read as it changes
    ("kai:cluster-topology", "kai:cluster-topology"),
    ("kueue:tas.default", "kueue:tas.default"),
    (["example.com/block", "example.com/rack"], "example.com/block,example.com/rack"),
    # Kueue's Topology spec.levels, pasted as they are
    ([{"nodeLabel": "example.com/block"}, {"nodeLabel": "nvidia.com/gpu.clique"}],
     "example.com/block,nvidia.com/gpu.clique"),
    # KAI's, with an alias
    ([{"nodeLabel": "example.com/block", "alias": "block"}, "example.com/rack"],
     "block=example.com/block,example.com/rack"),
])
def test_binder_network_levels(helm_template: Render, levels: Any, flag: str | None) -> None:
    values = {"binder": {"networkLevels": levels}} if levels is not None else None
    dep = one(helm_template(values), "Deployment", "muster-binder")
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    if flag is None:
        assert not any(a.startswith("--network-levels") for a in args)
    else:
        assert _arg(args, "--network-levels") == flag
    # only HyperNode tiers need the binder to read HyperNodes, and a Topology object its API's
    grants = _grants(helm_template(values), "ClusterRole", "muster-binder")
    watched = {"get", "list", "watch"}
    for group, resource, needs in (("topology.volcano.sh", "hypernodes", flag == "volcano"),
                                   ("kai.scheduler", "topologies", f"{flag}".startswith("kai:")),
                                   ("kueue.x-k8s.io", "topologies",
                                    f"{flag}".startswith("kueue:"))):
        assert {v for g, r, v in grants if (g, r) == (group, resource)} == (
            watched if needs else set()), (group, resource)


@pytest.mark.parametrize("levels", ["kai:", "kai:Cluster", "slurm:x", "kueue:a_b"])
def test_binder_network_levels_naming_no_topology_are_refused(
        helm_template_error: Callable[..., str], levels: str) -> None:
    assert "/binder/networkLevels" in helm_template_error({"binder": {"networkLevels": levels}})


@pytest.mark.parametrize("serving", ["devicePlugin", "dra", "both"])
def test_agent_gpu_serving_modes(helm_template: Render, serving: str) -> None:
    objs = helm_template({"agent": {"gpuServing": serving}})
    pod = one(objs, "DaemonSet", "muster-agent")["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    hosts = {v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    dra, plugin = serving != "devicePlugin", serving != "dra"
    assert ("--dra" in c["args"]) == dra
    assert ("--no-device-plugin" in c["args"]) == (not plugin)
    assert ("/var/lib/kubelet/device-plugins" in mounts) == plugin
    dra_paths = {"/var/lib/kubelet/plugins_registry", "/var/lib/kubelet/plugins/gpu.muster.io",
                 "/var/run/cdi"}
    # the agent sees the host's paths as they are: the registration names the host's socket
    assert (dra_paths <= mounts and dra_paths <= hosts) == dra
    assert not (dra_paths & mounts) or dra
    if dra:
        assert "--dra-plugin-dir=/var/lib/kubelet/plugins/gpu.muster.io" in c["args"]
        assert "--cdi-dir=/var/run/cdi" in c["args"]
    grants = _grants(objs, "ClusterRole", "muster-agent")
    assert (("resource.k8s.io", "resourceslices", "create") in grants) == dra
    assert (("resource.k8s.io", "resourceclaims", "get") in grants) == dra
    classes = find(objs, "DeviceClass")
    assert len(classes) == int(dra)
    if dra:
        (sel,) = classes[0]["spec"]["selectors"]
        assert sel["cel"]["expression"] == 'device.driver == "gpu.muster.io"'
        assert classes[0]["metadata"]["name"] == "gpu.muster.io"
        assert classes[0]["apiVersion"] == "resource.k8s.io/v1"
        # plain nvidia.com/gpu requests map to the class (DRA-backed extended resources)
        assert classes[0]["spec"]["extendedResourceName"] == "nvidia.com/gpu"


def test_the_device_class_maps_the_agents_resource_name_or_none(helm_template: Render) -> None:
    def device_class(dra: dict[str, Any], name: str = "nvidia.com/gpu") -> dict[str, Any]:
        return one(helm_template({"agent": {"gpuServing": "dra", "resourceName": name,
                                            "dra": dra}}), "DeviceClass", "gpu.muster.io")
    assert device_class({}, "example.com/gpu")["spec"]["extendedResourceName"] == \
        "example.com/gpu"
    assert "extendedResourceName" not in device_class({"extendedResource": False})["spec"]


def test_agent_gpu_serving_is_checked(helm_template_error: Callable[..., str]) -> None:
    assert "gpuServing" in helm_template_error({"agent": {"gpuServing": "plugins"}})
    assert "gpuServingPools" in helm_template_error({"agent": {"gpuServingPools": ["drA"]}})
    assert "gpuServingPools" in helm_template_error({"agent": {"gpuServingPools": ["dra", "dra"]}})


def test_agent_node_pools_each_serve_their_labelled_mode(helm_template: Render) -> None:
    """A DRA pool in a device-plugin cluster: the pool's nodes (muster.io/gpu-serving=dra) get an
    agent of their own serving DRA, every other node the default agent; DRA's RBAC and
    DeviceClass come with the pool."""
    objs = helm_template({"agent": {"gpuServingPools": ["dra"]}})
    default = one(objs, "DaemonSet", "muster-agent")
    pool = one(objs, "DaemonSet", "muster-agent-dra")

    def affinity(ds: dict[str, Any]) -> Any:
        terms = ds["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        return terms[0]["matchExpressions"]

    assert affinity(default) == [{"key": "muster.io/gpu-serving", "operator": "NotIn",
                                  "values": ["dra"]}]
    assert affinity(pool) == [{"key": "muster.io/gpu-serving", "operator": "In",
                               "values": ["dra"]}]
    (dc,) = default["spec"]["template"]["spec"]["containers"]
    (pc,) = pool["spec"]["template"]["spec"]["containers"]
    assert "--dra" not in dc["args"] and "--no-device-plugin" not in dc["args"]
    assert "--dra" in pc["args"] and "--no-device-plugin" in pc["args"]
    # the default agent's selector is as it was (immutable); the pool's is narrower
    assert default["spec"]["selector"] == one(helm_template(), "DaemonSet", "muster-agent")[
        "spec"]["selector"]
    labels = pool["spec"]["template"]["metadata"]["labels"]
    assert pool["spec"]["selector"]["matchLabels"] == {
        **default["spec"]["selector"]["matchLabels"], "muster.io/gpu-serving-pool": "dra"}
    assert all(labels[k] == v for k, v in pool["spec"]["selector"]["matchLabels"].items())
    assert find(objs, "DeviceClass")
    grants = _grants(objs, "ClusterRole", "muster-agent")
    assert ("resource.k8s.io", "resourceslices", "create") in grants
    # without pools: one agent, no affinity
    plain = one(helm_template(), "DaemonSet", "muster-agent")["spec"]["template"]["spec"]
    assert "affinity" not in plain


def test_agent_daemonset(helm_template: Render) -> None:
    objs = helm_template()
    ds = one(objs, "DaemonSet", "muster-agent")
    pod = ds["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"muster.io/gpu-topology": "enabled"}
    assert {"key": "muster.io/gpu-topology", "operator": "Exists"} in pod["tolerations"]
    (c,) = pod["containers"]
    assert "agent" in c["args"] and "--node-name=$(NODE_NAME)" in c["args"]
    # assignments count only on the binder's pods: the agent knows the binder's name
    assert "--scheduler-name=muster-binder" in c["args"]
    renamed = helm_template({"binder": {"schedulerName": "gangs"}})
    (c2,) = one(renamed, "DaemonSet", "muster-agent")["spec"]["template"]["spec"]["containers"]
    assert "--scheduler-name=gangs" in c2["args"]
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    # the pod the agent records on its Node, and Ready only while its plugin is registered:
    # the binder places GPU pods on the node while the pod recorded there is Ready
    assert {n: env[n]["valueFrom"]["fieldRef"]["fieldPath"]
            for n in ("POD_NAMESPACE", "POD_NAME", "POD_UID")} == {
        "POD_NAMESPACE": "metadata.namespace", "POD_NAME": "metadata.name",
        "POD_UID": "metadata.uid"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    hps = {v["hostPath"]["path"]: v["name"] for v in pod["volumes"] if "hostPath" in v}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert set(hps) == {"/var/lib/kubelet/device-plugins", "/var/lib/kubelet/pod-resources"}
    assert mounts[hps["/var/lib/kubelet/device-plugins"]]["mountPath"] == (
        "/var/lib/kubelet/device-plugins")
    # the kubelet's PodResources API, read-only: what each pod holds, against its assignment
    pod_resources = mounts[hps["/var/lib/kubelet/pod-resources"]]
    assert pod_resources["mountPath"] == "/var/lib/kubelet/pod-resources"
    assert pod_resources["readOnly"] is True
    assert "--pod-resources-socket=/var/lib/kubelet/pod-resources/kubelet.sock" in c["args"]
    assert "--metrics-port=8080" in c["args"]
    assert c["ports"] == [{"name": "metrics", "containerPort": 8080}]
    # root for the root-owned kubelet socket directory, but no capability and not privileged
    assert pod["securityContext"]["runAsUser"] == 0
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_disabled_components_render_nothing(helm_template: Render) -> None:
    objs = helm_template(COMBOS["webhook-only"])
    names = {o["metadata"]["name"] for o in objs}
    assert not any("binder" in n or "agent" in n for n in names)
    assert one(objs, "Deployment", "muster-webhook")


# --- the annotation guard (ValidatingAdmissionPolicy) -------------------------------------------


def _guard(objs: list[Obj], name: str = "muster-annotation-guard") -> tuple[Obj, Obj, Obj, Obj]:
    """(pods policy, its binding, Bindings policy, its binding)."""
    return (one(objs, "ValidatingAdmissionPolicy", name),
            one(objs, "ValidatingAdmissionPolicyBinding", name),
            one(objs, "ValidatingAdmissionPolicy", f"{name}-bindings"),
            one(objs, "ValidatingAdmissionPolicyBinding", f"{name}-bindings"))


def _variables(policy: Obj) -> dict[str, str]:
    return {v["name"]: v["expression"] for v in policy["spec"].get("variables", [])}


@pytest.mark.parametrize(("values", "release", "prefix"), [
    ({}, "muster", "muster"),
    ({}, "gpu", "gpu-muster"),
    ({"fullnameOverride": "sched"}, "muster", "sched"),
])
def test_annotation_guard_names_muster_s_own_service_accounts(
        helm_template: Render, values: Obj, release: str, prefix: str) -> None:
    """The policy exempts the binder and lets the agent add only its mark: each by the user
    name the API server gives the service account its pods run as, in the release namespace."""
    objs = helm_template(values, release=release)
    pods, pods_binding, bindings, bindings_binding = _guard(objs, f"{prefix}-annotation-guard")
    sa = {o["metadata"]["name"]: f"system:serviceaccount:{o['metadata']['namespace']}:"
          f"{o['metadata']['name']}" for o in find(objs, "ServiceAccount")}
    binder = one(objs, "Deployment", f"{prefix}-binder")["spec"]["template"]["spec"]
    agent = one(objs, "DaemonSet", f"{prefix}-agent")["spec"]["template"]["spec"]
    binder_user, agent_user = sa[binder["serviceAccountName"]], sa[agent["serviceAccountName"]]
    assert binder_user == f"system:serviceaccount:{NAMESPACE}:{prefix}-binder"
    for policy in (pods, bindings):
        assert policy["spec"]["failurePolicy"] == "Fail"
        assert policy["spec"]["matchConditions"] == [{
            "name": "not-the-binder",
            "expression": f"request.userInfo.username != '{binder_user}'"}]
    assert _variables(pods)["isAgent"] == f"request.userInfo.username == '{agent_user}'"
    for policy, binding in ((pods, pods_binding), (bindings, bindings_binding)):
        assert binding["spec"] == {"policyName": policy["metadata"]["name"],
                                   "validationActions": ["Deny"]}
    # what is guarded: pods (CREATE, UPDATE) and their status; Bindings, whose annotations the
    # API server copies onto the pod with no pod UPDATE to check
    assert pods["spec"]["matchConstraints"]["resourceRules"] == [{
        "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
        "resources": ["pods", "pods/status"]}]
    assert bindings["spec"]["matchConstraints"]["resourceRules"] == [{
        "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
        "resources": ["pods/binding", "bindings"]}]  # the legacy POST .../bindings too


def test_annotation_guard_lets_a_pod_be_created_with_exactly_the_webhooks_keys(
        helm_template: Render) -> None:
    pods, _, bindings, _ = _guard(helm_template())
    listed = ast.literal_eval(_variables(pods)["webhookKeys"])
    assert tuple(listed) == keys.WEBHOOK_ANNOTATIONS
    # a Binding may carry them too: Volcano's scheduler copies the pod's annotations onto it
    assert ast.literal_eval(_variables(bindings)["webhookKeys"]) == listed
    (rule,) = bindings["spec"]["validations"]
    assert "k in variables.webhookKeys" in rule["expression"]
    assert not set(listed) & set(keys.PROTECTED_ANNOTATIONS)
    text = json.dumps(pods["spec"])
    assert f"'{keys.ANN_GPU_ALLOCATED}'" in text and f"'{keys.ANNOTATION_PREFIX}'" in text


def test_annotation_guard_lets_a_pods_owner_change_only_the_user_keys_after_create(
        helm_template: Render) -> None:
    pods, _, _, _ = _guard(helm_template())
    listed = ast.literal_eval(_variables(pods)["userKeys"])
    assert tuple(listed) == keys.USER_ANNOTATIONS == (keys.ANN_LAST_CHECKPOINT,)
    # never one Muster's own components or the webhook write
    assert not set(listed) & {*keys.PROTECTED_ANNOTATIONS, *keys.WEBHOOK_ANNOTATIONS}
    update = next(v["expression"] for v in pods["spec"]["validations"]
                  if "variables.isAgent ||" in v["expression"].replace("\n", " "))
    assert "variables.changed.all(k, k in variables.userKeys)" in update
    assert "variables.removed.all(k, k in variables.userKeys)" in update
    # not at CREATE: a pod is created with the webhook's keys only
    create = pods["spec"]["validations"][0]["expression"]
    assert "userKeys" not in create and "k in variables.webhookKeys" in create


def test_annotation_guard_can_be_turned_off_or_made_to_warn(
        helm_template: Render, helm_template_error: Callable[..., str]) -> None:
    off = helm_template({"annotationGuard": {"enabled": False}})
    for kind in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"):
        assert not [o for o in find(off, kind) if "annotation-guard" in o["metadata"]["name"]]
    warn = helm_template({"annotationGuard": {"validationActions": ["Warn", "Audit"]}})
    guards = [b for b in find(warn, "ValidatingAdmissionPolicyBinding")
              if "annotation-guard" in b["metadata"]["name"]]
    assert guards
    for binding in guards:
        assert binding["spec"]["validationActions"] == ["Warn", "Audit"]
    err = helm_template_error({"annotationGuard": {"validationActions": ["Deny", "Warn"]}})
    assert "Deny and Warn may not be used together" in err


# --- RBAC: exactly the verbs docs/operations.md lists -----------------------------------------


def _grants(objs: list[Obj], kind: str, name: str) -> set[tuple[str, str, str]]:
    out = set()
    for rule in one(objs, kind, name)["rules"]:
        for g in rule["apiGroups"]:
            for res in rule["resources"]:
                for verb in rule["verbs"]:
                    out.add((g, res, verb))
    return out


def _expand(spec: dict[tuple[str, ...], str]) -> set[tuple[str, str, str]]:
    """{(group..., "res1,res2"): "verb1,verb2"} as (group, resource, verb) triples."""
    out = set()
    for key, verbs in spec.items():
        *groups, resources = key
        for g in groups:
            for res in resources.split(","):
                for v in verbs.split(","):
                    out.add((g, res, v))
    return out


def test_rbac_is_exactly_what_each_component_needs(helm_template: Render) -> None:
    objs = helm_template()
    assert _grants(objs, "ClusterRole", "muster-webhook") == _expand({
        ("", "namespaces"): "get,list,watch",
        ("batch", "jobs"): "get,list",
        ("batch", "cronjobs"): "get",
        ("jobset.x-k8s.io", "jobsets"): "get,list",
        ("trainer.kubeflow.org", "trainjobs"): "get,list",
        ("leaderworkerset.x-k8s.io", "leaderworkersets"): "get,list",
        ("", "pods"): "get,list",
        ("apps", "replicasets,deployments,statefulsets,daemonsets"): "get",
        ("kubeflow.org", "mpijobs,pytorchjobs,tfjobs,xgboostjobs,paddlejobs"): "get,list",
        ("scheduling.volcano.sh", "scheduling.x-k8s.io", "podgroups"):
            "get,list,watch,create,patch,delete",
        ("scheduling.k8s.io", "workloads,podgroups"): "get,list,watch,create,patch,delete",
        ("scheduling.volcano.sh", "queues"): "get,list,watch",
        ("scheduling.k8s.io", "priorityclasses"): "get,list,watch",
        ("", "events.k8s.io", "events"): "create,patch",
    })
    assert one(objs, "Role", "muster-webhook")["rules"][:3] == [
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["muster-policies"],
         "verbs": ["get"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
         "resourceNames": ["muster-webhook-podgroup-cleanup"], "verbs": ["get", "update"]}]
    extra = helm_template({"webhook": {"ownerResources": [
        {"apiGroup": "ray.io", "resources": ["rayjobs"]}]}})
    assert ("ray.io", "rayjobs", "get") in _grants(extra, "ClusterRole", "muster-webhook")
    assert _grants(objs, "ClusterRole", "muster-binder") == _expand({
        ("", "pods"): "get,list,watch,patch",
        ("", "pods/binding"): "create",
        ("", "pods/status"): "patch",
        # preemption: evicting a victim gang's pods, which keeps PodDisruptionBudgets
        ("", "pods/eviction"): "create",
        ("policy", "poddisruptionbudgets"): "get,list,watch",
        ("", "nodes"): "get,list,watch",
        ("scheduling.volcano.sh", "scheduling.x-k8s.io", "podgroups"): "get,list,watch",
        ("", "events.k8s.io", "events"): "create,patch",
        # DRA: what holds GPUs, and the claims of the pods it places (written before binding;
        # resourceclaims/binding: the API server's check of allocation writes since 1.36); the
        # DeviceClasses, and the special claims of plain GPU requests on DRA-only nodes;
        # update: kube-scheduler's finalizer on the claims it allocates
        ("resource.k8s.io", "resourceslices,resourceclaims,deviceclasses"): "get,list,watch",
        ("resource.k8s.io", "resourceclaims"): "create,delete,update",
        ("resource.k8s.io", "resourceclaims/status,resourceclaims/binding"): "update",
    })
    assert _grants(objs, "Role", "muster-binder-leader") == _expand({
        ("coordination.k8s.io", "leases"): "create,get,update"})
    assert _grants(objs, "ClusterRole", "muster-agent") == _expand({
        ("", "nodes"): "get,patch",
        ("", "pods"): "list,patch",  # its node's pods; the mark on each pod it served
        ("", "events"): "create,patch",  # a pod refused: the kubelet allocated other GPUs
    })
    # the read-only commands' role: get and list only, never a Secret but the serving one,
    # bound to nobody (the admin binds it); the job kinds the webhook reads too
    reader = one(objs, "ClusterRole", "muster-reader")
    assert {v for r in reader["rules"] for v in r["verbs"]} == {"get", "list"}
    assert [r.get("resourceNames") for r in reader["rules"] if "secrets" in r["resources"]] == [
        ["muster-webhook-tls"]]
    assert not [b for b in find(objs, "ClusterRoleBinding")
                if b["roleRef"]["name"] == "muster-reader"]
    assert ("ray.io", "rayjobs", "list") in _grants(extra, "ClusterRole", "muster-reader")
    assert not find(helm_template({"reader": {"clusterRole": False}}), "ClusterRole",
                    "muster-reader")
    # hooks: the uninstall Job may only delete Muster's two configurations
    name = one(objs, "MutatingWebhookConfiguration")["metadata"]["name"]
    (rule,) = one(objs, "ClusterRole", "muster-uninstall")["rules"]
    assert rule["verbs"] == ["delete"] and rule["resourceNames"] == [name]
    # every binding points at an existing role and a rendered ServiceAccount
    sas = {(o["metadata"]["namespace"], o["metadata"]["name"])
           for o in find(objs, "ServiceAccount")}
    for b in find(objs, "RoleBinding") + find(objs, "ClusterRoleBinding"):
        one(objs, b["roleRef"]["kind"], b["roleRef"]["name"])
        for s in b["subjects"]:
            assert (s["namespace"], s["name"]) in sas
    # and every pod runs as a ServiceAccount the chart renders
    for owner, spec in pod_specs(objs):
        assert (owner["metadata"]["namespace"], spec["serviceAccountName"]) in sas


# --- lifecycle ---------------------------------------------------------------------------------


def test_uninstall_removes_webhook_configurations_first(helm_template: Render) -> None:
    objs = helm_template()
    job = one(objs, "Job", "muster-uninstall")
    assert hook(job) == "pre-delete"
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    name = one(objs, "MutatingWebhookConfiguration")["metadata"]["name"]
    assert args[args.index("certs"):args.index("certs") + 2] == ["certs", "remove-webhooks"]
    assert _arg(args, "--mutating-webhook-configuration") == name
    assert _arg(args, "--validating-webhook-configuration") == name
    # its RBAC exists before it (lower weight) and everything is cleaned up after success
    for o in objs:
        if hook(o) == "pre-delete":
            ann = o["metadata"]["annotations"]
            assert "hook-succeeded" in ann["helm.sh/hook-delete-policy"]
            assert int(ann["helm.sh/hook-weight"]) <= int(
                job["metadata"]["annotations"]["helm.sh/hook-weight"])
    assert not find(helm_template(COMBOS["no-pdb-no-uninstall-hook"]), "Job", "muster-uninstall")


def test_uninstall_then_removes_what_the_components_created(helm_template: Render) -> None:
    objs = helm_template()
    job = one(objs, "Job", "muster-cleanup")
    assert hook(job) == "post-delete"  # a running binder would make its Lease again
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("certs"):args.index("certs") + 2] == ["certs", "remove-runtime-objects"]
    assert _arg(args, "--namespace") == NAMESPACE
    secrets = ["muster-webhook-tls", "muster-webhook-ca"]
    assert [a.split("=", 1)[1] for a in args if a.startswith("--secret=")] == secrets
    leases = ["muster-webhook-podgroup-cleanup", "muster-binder"]
    assert [a.split("=", 1)[1] for a in args if a.startswith("--lease=")] == leases
    # it may delete exactly those, nothing else
    assert _grants(objs, "Role", "muster-cleanup") == _expand({
        ("", "secrets"): "delete", ("coordination.k8s.io", "leases"): "delete"})
    rules = one(objs, "Role", "muster-cleanup")["rules"]
    assert [r["resourceNames"] for r in rules] == [secrets, leases]
    for o in objs:
        if hook(o) == "post-delete":
            assert "hook-succeeded" in o["metadata"]["annotations"]["helm.sh/hook-delete-policy"]
    # other cert modes own no Secrets of Muster's; no binder, no binder Lease; or switched off
    external = helm_template({"certs": {"mode": "external", "external": {
        "secretName": "mine", "caBundle": "eA=="}}})
    assert not [a for a in one(external, "Job", "muster-cleanup")["spec"]["template"]["spec"][
        "containers"][0]["args"] if a.startswith("--secret")]
    alone = one(helm_template({"certs": {"mode": "external", "external": {
        "secretName": "mine", "caBundle": "eA=="}}, "binder": {"enabled": False}}),
        "Job", "muster-cleanup")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert [a for a in alone if a.startswith("--lease")] == [
        "--lease=muster-webhook-podgroup-cleanup"]
    assert not find(helm_template({"uninstall": {"removeRuntimeObjects": False}}),
                    "Job", "muster-cleanup")


def _shipped_policies() -> dict[str, str]:
    shipped = {p.name: p.read_text() for p in sorted(EXAMPLE_POLICIES.glob("*.yaml"))}
    assert shipped, "webhook/demo/policies/ has no example policies"
    return shipped


def test_policies_configmap_from_values(helm_template: Render) -> None:
    shipped = _shipped_policies()
    objs = helm_template({"policies": shipped})
    cm = one(objs, "ConfigMap", "muster-policies")
    selftest = cm["data"].pop("zz-muster-selftest.yaml")
    assert cm["data"] == {k: v.rstrip("\n") for k, v in shipped.items()}
    assert "name: muster-selftest" in selftest
    vol = next(v for v in _webhook_pod(objs)["volumes"] if v["name"] == "policies")
    assert vol["configMap"]["name"] == "muster-policies"
    assert _arg(next(c for c in _webhook_pod(objs)["containers"] if c["name"] == "webhook")[
        "args"], "--policies-configmap") == "muster-policies"
    no_selftest = helm_template({"tests": {"selftestPolicy": False}})
    assert one(no_selftest, "ConfigMap", "muster-policies")["data"] == {}


def test_rendered_policies_load_and_match_the_helm_test_pod(helm_template: Render) -> None:
    """The ConfigMap as rendered goes through the real policy loader (as the webhook's
    /validate/policies and hot reload do), and the helm test's pod gets the self-test policy
    and only it; an ordinary pod in the same namespace does not."""
    from webhook.policy import evaluate, load_policy_texts  # noqa: PLC0415

    objs = helm_template({"policies": _shipped_policies()})
    policies = load_policy_texts(one(objs, "ConfigMap", "muster-policies")["data"])
    (test_pod,) = [o for o in objs if o["kind"] == "Pod" and hook(o) == "test"]
    env = {e["name"]: e["value"] for e in test_pod["spec"]["containers"][0]["env"]}
    labels = json.loads(env["TEST_LABELS"])
    ns_labels = {"kubernetes.io/metadata.name": env["TEST_NAMESPACE"]}
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"generateName": "muster-selftest-", "namespace": env["TEST_NAMESPACE"],
                        "labels": labels},
           "spec": {"containers": [{"name": "c", "image": "busybox",
                                    "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
    decision = evaluate(pod, namespace_labels=ns_labels, owners=[], policies=policies)
    assert decision.policies == ("muster-selftest",)
    other = {**pod, "metadata": {**pod["metadata"], "labels": {"app": "web"}}}
    assert evaluate(other, namespace_labels=ns_labels, owners=[],
                    policies=policies).policies == ()


def test_helm_test_pod_dry_runs_a_pod_create(helm_template: Render) -> None:
    objs = helm_template()
    (pod,) = [o for o in objs if o["kind"] == "Pod" and hook(o) == "test"]
    script = pod["spec"]["containers"][0]["args"][0]
    assert "dryRun=All" in script and "muster.io/policy" in script
    compile(script, "helm-test", "exec")  # it is valid Python
    role = one(objs, "Role", "muster-test")
    assert role["metadata"]["namespace"] == "default"
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]}]


def test_monitoring_objects_only_when_enabled(helm_template: Render) -> None:
    assert not find(helm_template(), "ServiceMonitor")
    objs = helm_template(COMBOS["monitoring"])
    sm = one(objs, "ServiceMonitor")
    # one endpoint: the "metrics" port of the webhook's and the binder's Services, plain HTTP;
    # never the webhook's admission port
    assert sm["spec"]["endpoints"] == [{"port": "metrics", "path": "/metrics", "scheme": "http",
                                        "interval": "30s"}]
    selected = [s for s in find(objs, "Service") if all(
        s["metadata"]["labels"].get(k) == v
        for k, v in sm["spec"]["selector"]["matchLabels"].items())]
    assert sorted(s["metadata"]["name"] for s in selected if any(
        p["name"] == "metrics" for p in s["spec"]["ports"])) == ["muster-binder-metrics",
                                                                  "muster-webhook"]
    rule = one(objs, "PrometheusRule")
    alerts = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]}
    assert {"MusterWebhookDown", "MusterCertificateExpiringSoon", "MusterPolicySetsDiffer"
            } <= alerts
    [differ] = [r for g in rule["spec"]["groups"] for r in g["rules"]
                if r["alert"] == "MusterPolicySetsDiffer"]
    # more than one digest of the active set among the release's replicas (docs/webhook.md)
    assert differ["expr"] == ('count(count by (digest) (muster_policy_set_info'
                              '{namespace="muster-system"})) > 1')


def _container_args(objs: list[Obj]) -> dict[str, list[str]]:
    out = {}
    for owner, spec in pod_specs(objs):
        for c in spec["containers"]:
            if c.get("args") and not c.get("command"):  # the helm test pod runs python itself
                out[f"{owner['metadata']['name']}/{c['name']}"] = c["args"]
    return out


@pytest.mark.parametrize("container", [
    "muster-webhook/webhook", "muster-cert-rotator/certs", "muster-webhook-certs/certs",
    "muster-uninstall/uninstall", "muster-cleanup/cleanup", "muster-binder/binder",
    "muster-agent/agent",
])
def test_every_flag_the_chart_passes_parses(helm_template: Render, container: str) -> None:
    """The chart's container args against the real `muster` CLI parser of each area."""
    from webhook.cli import build_parser  # noqa: PLC0415

    parser = build_parser()
    args = _container_args(helm_template(COMBOS["monitoring"]))[container]
    sub = next(a for a in args if not a.startswith("-"))
    commands = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert sub in commands, f"{container}: the chart runs `muster {sub}`, which the CLI lacks"
    try:
        ns = parser.parse_args(args)
    except SystemExit as exc:  # argparse printed why on stderr
        pytest.fail(f"{container}: muster {' '.join(args)} -> exit {exc}")
    assert ns.command == sub


def test_install_dry_run_renders_notes() -> None:
    from webhook.cli import build_parser  # noqa: PLC0415

    proc = run_helm("install", "muster", str(CHART), "--namespace", NAMESPACE,
                    "--dry-run=client", "--set", "webhook.excludeNamespaces={monitoring}")
    assert proc.returncode == 0, proc.stderr
    notes = proc.stdout.split("NOTES:", 1)[1]
    assert "Mutating webhook: 0-muster (failurePolicy Ignore, timeout 5s)" in notes
    assert f"Never sent to the webhook: kube-system, {NAMESPACE}, monitoring." in notes
    # the analyze command the notes print is one the CLI takes, naming the release's objects
    other = run_helm("install", "team", str(CHART), "--namespace", NAMESPACE, "--dry-run=client")
    [line] = [ln.strip() for ln in other.stdout.split("NOTES:", 1)[1].splitlines()
              if ln.strip().startswith("muster analyze")]
    ns = build_parser().parse_args(line.split()[1:])
    assert (ns.namespace, ns.release) == (NAMESPACE, "team-muster")
    assert "--clusterrole team-muster-reader" in other.stdout


def test_webhook_limits_are_serve_flags_with_the_servers_defaults(helm_template: Render) -> None:
    """values.yaml's webhook.limits are `muster serve`'s defaults (docs/webhook.md, "Limits"),
    and a large value renders as an integer, not Helm's float notation."""
    from webhook.admission.server import ServeOptions  # noqa: PLC0415
    from webhook.cli import build_parser  # noqa: PLC0415

    def serve_options(values: Obj | None) -> argparse.Namespace:
        args = _container_args(helm_template(values))["muster-webhook/webhook"]
        return build_parser().parse_args(args)

    ns = serve_options(None)
    defaults = ServeOptions(policies=[])
    flags = ("max_body_bytes", "body_timeout", "max_inflight_body_bytes", "header_timeout",
             "idle_timeout", "max_connections", "max_connections_per_source",
             "reserved_connections", "metrics_max_connections")
    for flag in flags:
        assert getattr(ns, flag) == getattr(defaults, flag), flag
    big = {"webhook": {"limits": {
        "maxBodyBytes": 6291456, "bodyTimeoutSeconds": 2.5, "maxInflightBodyBytes": 268435456,
        "headerTimeoutSeconds": 5, "idleTimeoutSeconds": 300, "maxConnections": 1024,
        "maxConnectionsPerSource": 2048, "reservedConnections": 1000,
        "metricsMaxConnections": 4096}}}
    ns = serve_options(big)
    assert tuple(getattr(ns, flag) for flag in flags) == (
        6291456, 2.5, 268435456, 5.0, 300.0, 1024, 2048, 1000, 4096)


def test_a_reserve_of_every_connection_fails_the_render() -> None:
    proc = run_helm("template", "muster", str(CHART), "--namespace", NAMESPACE, "--set",
                    "webhook.limits.maxConnections=8", "--set",
                    "webhook.limits.reservedConnections=8")
    assert proc.returncode != 0
    assert "reservedConnections must be fewer than webhook.limits.maxConnections" in proc.stderr


def test_a_hook_checks_the_policies_before_install_and_upgrade(helm_template: Render) -> None:
    """`muster policy check` runs on exactly the values' policies before the release's objects
    exist, with no API access, and fails the release at its first failure."""
    shipped = _shipped_policies()
    objs = helm_template({"policies": shipped})
    cm = one(objs, "ConfigMap", "muster-policy-check")
    job = one(objs, "Job", "muster-policy-check")
    for obj in (cm, job):
        assert hook(obj) == "pre-install,pre-upgrade"
    assert int(cm["metadata"]["annotations"]["helm.sh/hook-weight"]) < int(
        job["metadata"]["annotations"]["helm.sh/hook-weight"])
    assert cm["data"] == {k: v.rstrip("\n") for k, v in shipped.items()}
    pod = job["spec"]["template"]["spec"]
    assert job["spec"]["backoffLimit"] == 0 and pod["automountServiceAccountToken"] is False
    (container,) = pod["containers"]
    assert container["args"] == ["policy", "check", "--as-served", "/policies"]
    assert pod["volumes"][0]["configMap"]["name"] == "muster-policy-check"
    assert not find(helm_template({"policyCheck": {"enabled": False}}), "Job",
                    "muster-policy-check")


@pytest.mark.parametrize("as_values", [False, True])
def test_the_hook_refuses_what_the_webhook_would_refuse(
        helm_template: Render, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        as_values: bool) -> None:
    """The hook's check, on its ConfigMap's files, passes exactly when `muster serve`'s loader
    loads them: a values file set as a policy (`--set-file policies.x.yaml=values.yaml`) is
    refused by both."""
    shipped = _shipped_policies()
    name, text = next(iter(shipped.items()))
    if as_values:
        shipped[name] = "policies:\n  inner.yaml: |\n" + "".join(
            f"    {line}\n" for line in text.splitlines())
    objs = helm_template({"policies": shipped})
    mounted = tmp_path / "policies"  # (the fixture writes its values files to tmp_path)
    mounted.mkdir()
    for file, body in one(objs, "ConfigMap", "muster-policy-check")["data"].items():
        (mounted / file).write_text(body)
    args = one(objs, "Job", "muster-policy-check")["spec"]["template"]["spec"]["containers"][0][
        "args"]
    hook_rc = main([str(mounted) if a == "/policies" else a for a in args])
    try:
        load_policies([str(mounted)])
        served = True
    except PolicyError:
        served = False
    assert (hook_rc == 0) is served is (not as_values), capsys.readouterr().out


# --- exposure: metrics port, NetworkPolicy, priority ---------------------------------------------


def test_webhook_metrics_are_on_their_own_port(helm_template: Render) -> None:
    objs = helm_template()
    args = _container_args(objs)["muster-webhook/webhook"]
    assert _arg(args, "--port") == "8443" and _arg(args, "--metrics-port") == "8080"
    assert not any(a.startswith("--metrics-host") for a in args)
    local = helm_template({"webhook": {"metricsLocalhostOnly": True}})
    args = _container_args(local)["muster-webhook/webhook"]
    assert _arg(args, "--metrics-host") == "127.0.0.1"
    pod = one(local, "Deployment", "muster-webhook")["spec"]["template"]["spec"]
    (c,) = [c for c in pod["containers"] if c["name"] == "webhook"]
    assert [p["name"] for p in c["ports"]] == ["https"]
    assert [p["name"] for p in one(local, "Service", "muster-webhook")["spec"]["ports"]] == [
        "https"]


@pytest.mark.parametrize(("values", "said"), [
    ({"webhook": {"metricsPort": 8443}}, "webhook.metricsPort must differ from webhook.port"),
    ({"webhook": {"metricsLocalhostOnly": True},
      "metrics": {"prometheusRule": {"enabled": True}}},
     "metrics.prometheusRule needs the webhook's metrics scraped"),
])
def test_metrics_settings_that_cannot_work_are_refused(
        helm_template_error: Callable[..., str], values: Obj, said: str) -> None:
    assert said in helm_template_error(values)


def _declared_ports(objs: list[Obj], deployment: str) -> list[int]:
    pod = one(objs, "Deployment", deployment)["spec"]["template"]["spec"]
    return sorted(p["containerPort"] for c in pod["containers"] for p in c.get("ports", []))


def _admitted(policy: Obj) -> dict[int, list[Obj] | None]:
    """Each port the policy opens -> its peers (None: any source)."""
    return {p["port"]: rule.get("from") for rule in policy["spec"]["ingress"]
            for p in rule["ports"]}


def test_network_policies_are_on_and_open_only_the_ports_the_pods_serve(
        helm_template: Render) -> None:
    """On by default, any source: an API server's source no plain NetworkPolicy can name on
    every CNI must not be blocked (docs/operations.md, "Exposure"); every other port is shut."""
    objs = helm_template()
    for name in ("muster-webhook", "muster-binder"):
        policy = one(objs, "NetworkPolicy", name)
        selector = one(objs, "Deployment", name)["spec"]["selector"]["matchLabels"]
        assert policy["spec"]["podSelector"] == {"matchLabels": selector}
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        assert all(p["protocol"] == "TCP" for r in policy["spec"]["ingress"] for p in r["ports"])
        admitted = _admitted(policy)
        assert sorted(admitted) == _declared_ports(objs, name)
        assert set(admitted.values()) == {None}
    assert sorted(_admitted(one(objs, "NetworkPolicy", "muster-webhook"))) == [8080, 8443]
    assert list(_admitted(one(objs, "NetworkPolicy", "muster-binder"))) == [9090]
    # the agent: its metrics port only, one policy for every pool's DaemonSet
    agent = one(objs, "NetworkPolicy", "muster-agent")
    assert _admitted(agent) == {8080: None}
    pools = find(helm_template({"agent": {"gpuServingPools": ["dra"]}}), "DaemonSet")
    assert len(pools) == 2 and all(
        agent["spec"]["podSelector"]["matchLabels"].items()
        <= d["spec"]["template"]["metadata"]["labels"].items() for d in pools)
    local = helm_template({"webhook": {"metricsLocalhostOnly": True}})
    assert list(_admitted(one(local, "NetworkPolicy", "muster-webhook"))) == [8443]
    off = helm_template({"webhook": {"networkPolicy": {"enabled": False}},
                         "binder": {"networkPolicy": {"enabled": False}},
                         "agent": {"networkPolicy": {"enabled": False}}})
    assert not find(off, "NetworkPolicy")
    assert not find(helm_template({"binder": {"enabled": False}}), "NetworkPolicy",
                    "muster-binder")


def test_network_policies_narrow_to_the_api_server_and_the_scraper(
        helm_template: Render) -> None:
    apiserver = [{"ipBlock": {"cidr": "10.0.0.10/32"}}, {"ipBlock": {"cidr": "10.0.0.11/32"}}]
    prometheus = [{"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "monitoring"}}}]
    objs = helm_template({"webhook": {"networkPolicy": {
        "enabled": True, "from": apiserver, "metricsFrom": prometheus}},
        "binder": {"networkPolicy": {"enabled": True, "metricsFrom": prometheus}},
        "agent": {"networkPolicy": {"enabled": True, "metricsFrom": prometheus}}})
    # the API server reaches the metrics port too: its pod proxy (`kubectl get --raw
    # .../pods/NAME:8080/proxy/metrics`, docs/policies.md) comes from where its calls do
    assert _admitted(one(objs, "NetworkPolicy", "muster-webhook")) == {
        8443: apiserver, 8080: prometheus + apiserver}
    assert _admitted(one(objs, "NetworkPolicy", "muster-binder")) == {9090: prometheus}
    assert _admitted(one(objs, "NetworkPolicy", "muster-agent")) == {8080: prometheus}
    scraper_only = helm_template({"webhook": {"networkPolicy": {
        "enabled": True, "metricsFrom": prometheus}}})
    assert _admitted(one(scraper_only, "NetworkPolicy", "muster-webhook")) == {
        8443: None, 8080: prometheus}
    api_only = helm_template({"webhook": {"networkPolicy": {"enabled": True, "from": apiserver}}})
    assert _admitted(one(api_only, "NetworkPolicy", "muster-webhook")) == {
        8443: apiserver, 8080: None}


def test_components_run_with_critical_priority(helm_template: Render) -> None:
    objs = helm_template()
    priority = {o["metadata"]["name"]: o["spec"]["template"]["spec"].get("priorityClassName")
                for o in find(objs, "Deployment") + find(objs, "DaemonSet")}
    # the cert-rotator is not: the serving certificate is re-issued 30 days ahead
    assert priority == {"muster-webhook": "system-cluster-critical",
                        "muster-binder": "system-cluster-critical",
                        "muster-agent": "system-node-critical", "muster-cert-rotator": None}
    objs = helm_template({"webhook": {"priorityClassName": ""},
                          "binder": {"priorityClassName": "gpu-infra"}})
    assert "priorityClassName" not in one(objs, "Deployment", "muster-webhook")[
        "spec"]["template"]["spec"]
    assert one(objs, "Deployment", "muster-binder")["spec"]["template"]["spec"][
        "priorityClassName"] == "gpu-infra"
