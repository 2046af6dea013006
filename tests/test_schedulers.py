"""The configuration `e2e.node.schedulers` hands the neighbour schedulers: pure data, checked
without building or running anything."""

from __future__ import annotations

from pathlib import Path

from e2e.node import schedulers, versions


def test_the_coscheduling_profile_is_the_plugins_own_with_our_name_and_qps() -> None:
    config = schedulers.coscheduling_config(Path("/k"), "second", qps=1000, reject_percentage=30)
    assert config["clientConnection"] == {"kubeconfig": "/k", "qps": 1000, "burst": 1000}
    (profile,) = config["profiles"]
    assert profile["schedulerName"] == "second"
    assert profile["plugins"]["queueSort"] == {"enabled": [{"name": "Coscheduling"}],
                                               "disabled": [{"name": "*"}]}
    assert profile["pluginConfig"][0]["args"]["podGroupRejectPercentage"] == 30
    assert "qps" not in schedulers.coscheduling_config(Path("/k"), "s")["clientConnection"]


def _hook(name: str, path: str) -> dict[str, object]:
    return {"name": name, "clientConfig": {"service": {"name": "webhook-service",
                                                       "namespace": "kueue-system",
                                                       "path": path}}}


def test_kueue_webhooks_keep_our_integrations_and_call_its_service() -> None:
    manifests = [{"apiVersion": "admissionregistration.k8s.io/v1",
                  "kind": "MutatingWebhookConfiguration",
                  "metadata": {"name": "mutating-webhook-configuration"},
                  "webhooks": [_hook("mjob.kb.io", "/mutate-batch-v1-job"),
                               _hook("mpod.kb.io", "/mutate--v1-pod"),
                               _hook("mmpijob.kb.io", "/mutate-kubeflow-org-v2beta1-mpijob"),
                               _hook("mcq.kb.io", "/mutate-kueue-x-k8s-io-v1beta2-clusterqueue")]},
                 {"kind": "ValidatingWebhookConfiguration", "metadata": {"name": "v"},
                  "webhooks": [_hook("vray.kb.io", "/validate-ray-io-v1-rayjob")]}]
    (doc,) = schedulers.kueue_webhooks(manifests)
    assert doc["metadata"] == {"name": "kueue-mutating-webhook-configuration"}
    assert [h["name"] for h in doc["webhooks"]] == ["mjob.kb.io", "mmpijob.kb.io", "mcq.kb.io"]
    assert doc["webhooks"][0]["clientConfig"] == {"service": {
        "namespace": "kueue-system", "name": "kueue-webhook-service",
        "path": "/mutate-batch-v1-job"}}
    secret, service, endpoints = schedulers.kueue_service("10.255.0.1", 9643)
    assert secret["metadata"]["name"] == "kueue-webhook-server-cert"
    assert service["spec"]["ports"][0]["targetPort"] == 9643 and "selector" not in service["spec"]
    # the API server routes by the slice whose port has the Service port's name
    assert endpoints["metadata"]["labels"]["kubernetes.io/service-name"] == "kueue-webhook-service"
    assert endpoints["ports"] == [{"name": service["spec"]["ports"][0]["name"], "port": 9643,
                                   "protocol": "TCP"}]
    assert endpoints["endpoints"] == [{"addresses": ["10.255.0.1"], "conditions": {"ready": True}}]


def test_kueues_converted_crds_call_its_webhook() -> None:
    crd = {"spec": {"names": {"plural": "workloads"}, "versions": []}}
    conversion = schedulers.kueue_crd(crd)["spec"]["conversion"]
    assert conversion["strategy"] == "Webhook"
    assert conversion["webhook"]["clientConfig"]["service"]["path"] == "/convert"
    flavors = {"spec": {"names": {"plural": "resourceflavors"}}}
    assert schedulers.kueue_crd(flavors) == flavors


def test_kueue_runs_outside_the_cluster_with_our_certificate() -> None:
    config = schedulers.kueue_config(host="10.255.0.1", port=9643, cert_dir=Path("/c"),
                                     health="127.0.0.1:8681", pods_ready_timeout="40s")
    assert config["internalCertManagement"] == {"enable": True,
                                                "webhookServiceName": "kueue-webhook-service"}
    assert config["webhook"] == {"host": "10.255.0.1", "port": 9643, "certDir": "/c"}
    assert config["integrations"]["frameworks"] == ["batch/job", "kubeflow.org/mpijob"]
    assert config["waitForPodsReady"]["timeout"] == "40s"


def test_volcano_keeps_the_clusters_newer_podgroup_and_queue_crds() -> None:
    def crd(name: str) -> dict[str, object]:
        return {"metadata": {"name": name}}
    chart = [crd("podgroups.scheduling.volcano.sh"), crd("jobs.batch.volcano.sh")]
    kept = schedulers.volcano_crds(chart, {"podgroups.scheduling.volcano.sh"})
    assert kept == [crd("jobs.batch.volcano.sh")]


def test_volcano_runs_as_its_chart_says_with_loopback_health_and_our_webhook_address() -> None:
    commands = schedulers.volcano_commands(Path("/bin"), Path("/chart"), Path("/k"),
                                           Path("/certs"), address="10.255.0.1", port=9743)
    assert sorted(commands) == ["controller-manager", "scheduler", "webhook-manager"]
    for name, argv in commands.items():
        assert argv[0] == f"/bin/{name}"
        assert "--kubeconfig=/k" in argv
    scheduler = commands["scheduler"]
    assert "--scheduler-conf=/chart/config/volcano-scheduler.conf" in scheduler
    assert "--leader-elect=false" in scheduler
    assert "--leader-elect=false" in commands["controller-manager"]
    health = [a for argv in commands.values() for a in argv if a.startswith("--healthz-")]
    assert health == ["--healthz-address=127.0.0.1:11251", "--healthz-address=127.0.0.1:11252"]
    webhook = commands["webhook-manager"]
    assert {"--listen-address=10.255.0.1", "--port=9743", "--ca-cert-file=/certs/ca.crt",
            "--tls-cert-file=/certs/tls.crt", "--tls-private-key-file=/certs/tls.key",
            "--webhook-namespace=volcano-system",
            "--webhook-service-name=volcano-admission-service"} <= set(webhook)


def test_the_newest_volcano_the_proxy_serves_is_older_than_every_refused_one() -> None:
    def release(tag: str) -> tuple[int, ...]:
        return tuple(int(n) for n in tag.removeprefix("v").split("."))
    assert all(release(v) > release(versions.VOLCANO) for v in versions.VOLCANO_REFUSED)
