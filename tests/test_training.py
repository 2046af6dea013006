"""The real training jobs' parts that run without a cluster: what a rank reports and checks
(`e2e/train/rank.py`, the training image's program) and the jobs as submitted (`e2e.training`)."""

from __future__ import annotations

import http.server
import json
import ssl
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e import training
from e2e.train import rank
from webhook import keys
from webhook.certs import generate_ca, issue_serving_cert, write_pair
from webhook.demo import EXAMPLE_POLICIES


def test_a_rank_reads_the_containers_own_environment_not_sshds() -> None:
    raw = b"PATH=/bin\0NVIDIA_VISIBLE_DEVICES=GPU-1,GPU-2\0NODE_NAME=n1\0MUSTER_GPU_3=GPU-2\0"
    env = rank.container_env(raw, {"NVIDIA_VISIBLE_DEVICES": "from-sshd"})
    assert rank.seen(env) == {"node": "n1", "visible": "GPU-1,GPU-2", "cdi": ["GPU-2"]}
    # unreadable: its own environment
    assert rank.seen(rank.container_env(None, {"NODE_NAME": "n2"}))["node"] == "n2"


def test_a_worker_keeps_its_environment_for_the_ranks_before_it_becomes_sshd(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """sshd writes its process title over its environment: /proc/1/environ of a worker holds no
    NODE_NAME (seen on the real multi-node tier), so the worker keeps it first."""
    kept = tmp_path / "env.json"
    monkeypatch.setattr(rank, "CONTAINER_ENV", kept)
    monkeypatch.setenv("NODE_NAME", "n3")
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", "GPU-7")
    became: list[list[str]] = []
    monkeypatch.setattr(rank.os, "execv", lambda path, argv: became.append([path, *argv]))
    rank.sshd()
    assert became == [["/usr/sbin/sshd", "/usr/sbin/sshd", "-De"]]
    monkeypatch.delenv("NODE_NAME")  # a rank started over ssh has sshd's environment
    assert rank.seen(rank._env())["node"] == "n3"
    assert rank.seen(rank._env())["visible"] == "GPU-7"


def test_only_the_full_sum_of_every_rank_is_right() -> None:
    assert rank.summed_right([6.0] * rank.VECTOR, 3)
    assert not rank.summed_right([5.0] * rank.VECTOR, 3)  # a rank missing
    assert not rank.summed_right([6.0] * (rank.VECTOR - 1) + [5.0], 3)
    assert not rank.summed_right([6.0], 3)
    line = rank.line(1, 3, [6.0] * rank.VECTOR, 0.5, {"NODE_NAME": "n"})
    assert (line["rank"], line["ok"], line["sum"], line["node"]) == (1, True, 6.0, "n")


def test_the_launcher_waits_for_each_host_of_the_hostfile() -> None:
    text = "# mpi-operator's\njob-worker-0.job.ns.svc slots=1\n\njob-worker-1.job.ns.svc slots=1\n"
    assert rank.hostfile_hosts(text) == ["job-worker-0.job.ns.svc", "job-worker-1.job.ns.svc"]


def test_a_rank_with_no_mode_is_a_usage_error() -> None:
    with pytest.raises(SystemExit, match="usage"):
        rank.main(["train"])


def test_a_ddp_rank_is_paced_and_saves_every_n_steps_and_at_its_end() -> None:
    assert rank.ddp_args([]) == {"steps": 5, "step_seconds": 0.0, "save_every": 0}
    assert rank.ddp_args(["7", "--step-seconds", "0.5", "--save-every", "3"]) == {
        "steps": 7, "step_seconds": 0.5, "save_every": 3}
    assert [s for s in range(1, 8) if rank.saves_after(s, 7, 3)] == [3, 6, 7]
    assert [s for s in range(1, 8) if rank.saves_after(s, 7, 0)] == [7]  # at its end only
    with pytest.raises(SystemExit):
        rank.ddp_args(["--save-every", "often"])


def _container(spec: dict[str, Any]) -> dict[str, Any]:
    (container,) = spec["template"]["spec"]["containers"]
    return container  # type: ignore[no-any-return]


def test_mpijob_workers_ask_the_gpus_and_the_launcher_runs_every_rank() -> None:
    job = training.mpijob("j", "ns", workers=3, gpus_per_worker=2, slots_per_worker=2,
                          nameserver="10.0.0.1")
    specs = job["spec"]["mpiReplicaSpecs"]
    worker, launcher = _container(specs["Worker"]), _container(specs["Launcher"])
    assert specs["Worker"]["replicas"] == 3 and job["spec"]["slotsPerWorker"] == 2
    assert worker["resources"]["limits"] == {keys.GPU_RESOURCE: "2"}
    assert "limits" not in launcher["resources"]
    command = launcher["command"]
    assert command[command.index("-np") + 1] == "6"
    assert command[-2:] == [training.RANK, "mpi"] and "tcp,self" in command
    dns = specs["Worker"]["template"]["spec"]["dnsConfig"]
    assert dns["nameservers"] == ["10.0.0.1"] and dns["searches"][0] == "ns.svc.cluster.local"
    assert "dnsConfig" not in training.mpijob("j", "ns", workers=1)["spec"]["mpiReplicaSpecs"][
        "Worker"]["template"]["spec"]


def test_pytorchjob_master_is_a_rank_with_gpus_like_each_worker() -> None:
    job = training.pytorchjob("p", "ns", workers=2, gpus_per_worker=1, steps=3)
    specs = job["spec"]["pytorchReplicaSpecs"]
    assert (specs["Master"]["replicas"], specs["Worker"]["replicas"]) == (1, 2)
    for spec in specs.values():
        container = _container(spec)
        assert container["name"] == training.PYTORCH_CONTAINER  # the operator's env goes here
        assert container["command"][-2:] == ["ddp", "3"]
        assert container["resources"]["limits"] == {keys.GPU_RESOURCE: "1"}
        assert "priorityClassName" not in spec["template"]["spec"]
    paced = training.pytorchjob("p", "ns", workers=1, steps=10**6, step_seconds=1,
                                save_every=2, priority_class="low")
    for spec in paced["spec"]["pytorchReplicaSpecs"].values():
        command = _container(spec)["command"]
        assert rank.ddp_args(command[command.index("ddp") + 1:]) == {
            "steps": 10**6, "step_seconds": 1.0, "save_every": 2}
        assert spec["template"]["spec"]["priorityClassName"] == "low"


def _shipped_gangs() -> list[dict[str, Any]]:
    return [doc for f in sorted(EXAMPLE_POLICIES.glob("*.yaml"))
            for doc in yaml.safe_load_all(f.read_text()) if doc and doc["spec"].get("gang")]


@pytest.mark.parametrize(("kind", "backend"), [("MPIJob", "muster"), ("MPIJob", "volcano"),
                                                ("MPIJob", "coscheduling"),
                                                ("PyTorchJob", "volcano")])
def test_shipped_namespace_is_where_a_shipped_policy_gives_the_kind_to_the_backend(
        kind: Any, backend: Any) -> None:
    ns = training.shipped_namespace(kind, backend)
    matched = [p for p in _shipped_gangs()
               if f"kubeflow.org/{kind}" in p["spec"]["match"].get("ownerKinds", [])
               and p["spec"]["gang"]["backend"] == backend
               and (ns.name in p["spec"]["match"].get("namespaces", []) or (
                   (sel := p["spec"]["match"].get("namespaceSelector")) and
                   sel["matchLabels"].items() <= ns.labels.items()))]
    assert matched, f"no shipped policy gives a {kind} in {ns} to {backend}"


def test_no_shipped_namespace_for_a_backend_no_policy_names() -> None:
    with pytest.raises(ValueError, match="PyTorchJob to muster"):
        training.shipped_namespace("PyTorchJob", "muster")


def test_the_pytorch_init_container_waits_for_the_master_with_the_training_image(
        tmp_path: Any) -> None:
    """The training operator's default init container pulls alpine:3.10 (no registry here);
    ours, rendered as its Go template is, runs `getent` of the training image."""
    rendered = training.PYTORCH_INIT_TEMPLATE.replace(
        "{{.InitContainerImage}}", training.TRAIN_IMAGE).replace(
        "{{.MaxTries}}", "100").replace("{{.MasterAddr}}", "ddp-master-0")
    [container] = yaml.safe_load(rendered)
    assert container["image"] == training.TRAIN_IMAGE
    assert container["command"][:2] == ["sh", "-c"]
    assert "getent hosts ddp-master-0 && exit 0" in container["command"][2]
    flags = training.pytorch_operator_flags(tmp_path / "t.yaml")
    assert f"--pytorch-init-container-image={training.TRAIN_IMAGE}" in flags


class _ApiServer:
    """An HTTPS server on loopback that answers a pod PATCH as the API server would (`code`),
    and keeps what it was sent."""

    def __init__(self, tmp: Path, code: int) -> None:
        ca = generate_ca("test-ca", 1)
        pair = issue_serving_cert(ca, ["localhost"], ["127.0.0.1"], 1)
        write_pair(pair, tmp / "tls.crt", tmp / "tls.key")
        (tmp / "ca.crt").write_bytes(ca.cert_pem)
        (tmp / "token").write_text("the-token\n")
        self.account, self.got = tmp, []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_PATCH(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                server.got.append((self.path, dict(self.headers), json.loads(body)))
                self.send_response(code)
                self.end_headers()
                self.wfile.write(b'{"kind":"Status","message":"denied by the guard"}')

            def log_message(self, *_: Any) -> None:
                pass

        self.http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(tmp / "tls.crt", tmp / "tls.key")
        self.http.socket = tls.wrap_socket(self.http.socket, server_side=True)
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def env(self) -> dict[str, str]:
        return {"KUBERNETES_SERVICE_HOST": "127.0.0.1",
                "KUBERNETES_SERVICE_PORT": str(self.http.server_address[1]),
                "POD_NAME": "ddp-master-0", "POD_NAMESPACE": "train"}


def test_rank_0_says_when_it_checkpointed_on_its_own_pod_as_its_service_account(
        tmp_path: Path) -> None:
    api = _ApiServer(tmp_path, 200)
    try:
        said = rank.say_checkpointed(1796583600.0, api.env(), tmp_path)
    finally:
        api.http.shutdown()
    assert said == "2026-12-06T19:00:00Z"
    ((path, headers, body),) = api.got
    assert path == "/api/v1/namespaces/train/pods/ddp-master-0"
    assert headers["Authorization"] == "Bearer the-token"
    assert headers["Content-Type"] == "application/merge-patch+json"
    assert body == {"metadata": {"annotations": {keys.ANN_LAST_CHECKPOINT: said}}}
    assert rank.LAST_CHECKPOINT == keys.ANN_LAST_CHECKPOINT  # the image has no Muster code


def test_a_rank_that_may_not_say_it_reports_why(tmp_path: Path) -> None:
    api = _ApiServer(tmp_path, 403)
    try:
        refused = rank.say_checkpointed(1796583600.0, api.env(), tmp_path)
    finally:
        api.http.shutdown()
    assert refused.startswith("error: ") and "403" in refused and "denied by the guard" in refused
    # no Downward API: said so, nothing sent
    assert rank.say_checkpointed(0.0, {}, tmp_path).startswith("error: KeyError")


def test_the_pytorchjob_runs_as_the_account_that_may_say_it() -> None:
    job = training.pytorchjob("p", "ns", workers=1, service_account="trainer")
    for spec in job["spec"]["pytorchReplicaSpecs"].values():
        pod = spec["template"]["spec"]
        assert pod["serviceAccountName"] == "trainer"
        env = {e["name"]: e.get("valueFrom") for e in pod["containers"][0]["env"]}
        assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
        assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    sa, role, binding = training.checkpoint_rbac("ns", "trainer")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"],
                              "verbs": ["get", "patch"]}]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"],
                                    "namespace": "ns"}]
    assert "serviceAccountName" not in training.pytorchjob("p", "ns", workers=1)[
        "spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
