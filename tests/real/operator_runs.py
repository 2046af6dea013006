"""The job operators run for real beside the test cluster (`e2e.node.operators`): each test starts
the one it needs, inside the cluster's network namespace, and it stops when the test ends."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import yaml
from real_helpers import kubectl

from e2e import jobkind_scenarios as scenarios
from e2e.node import operators, schedulers
from e2e.node.cluster import NodeCluster
from e2e.node.kubectl import write_list
from e2e.node.launcher import NODE_IP
from e2e.probes import eventually
from webhook.kube import ApiError, KubeApi, Resource


def install_crds(cluster: NodeCluster, op: operators.Operator, tmp: Path) -> None:
    """The operator's CRDs at its release (the shared ones may be older), served before it
    starts."""
    docs = operators.crds(op, operators.module_dir(op))
    path = write_list(tmp / f"{op.name}-crds.json", docs)
    kubectl(cluster, "apply", "--server-side", "--force-conflicts", "-f", str(path))
    for crd in docs:
        kubectl(cluster, "wait", "--for=condition=Established", "--timeout=60s",
                f"crd/{crd['metadata']['name']}")


@contextmanager
def operator(cluster: NodeCluster, binary: Path, name: str, args: list[str], *,
             ready: Sequence[str]) -> Iterator[None]:
    """`binary` running with `args` against the cluster (admin kubeconfig), logged beside the
    cluster's own components (so a failing test's report carries it)."""
    log = cluster.dir / "logs" / f"{name}.log"
    with operators.running(binary, args, log,
                           env={"KUBECONFIG": str(cluster.kubeconfig)}) as proc:
        operators.wait_ready(proc, log, ready)
        yield


async def delete_and_wait(kube: KubeApi, resource: Resource, name: str, ns: str,
                          *also: tuple[Resource, str]) -> None:
    """Delete the job as its user would (the garbage collector takes what it owns) and wait
    until it and each of `also` are gone."""
    try:
        await kube.delete(resource, name, ns, propagation_policy="Background")
    except ApiError as exc:
        if not exc.not_found:  # already gone: e.g. its owner's garbage collection took it
            raise

    async def gone() -> bool:
        for res, obj in ((resource, name), *also):
            try:
                await kube.get(res, obj, namespace=ns)
                return False
            except ApiError as exc:
                if not exc.not_found:
                    raise
        return True
    await eventually(gone, within=120, what=f"{resource.kind} {ns}/{name} and what it owns gone")


async def condition(kube: KubeApi, resource: Resource, name: str, ns: str, kind: str, *,
                    within: float = 300) -> dict[str, Any]:
    """The job once its status has condition `kind` True."""
    async def met() -> dict[str, Any] | None:
        job = await kube.get(resource, name, namespace=ns)
        conds = (job.get("status") or {}).get("conditions") or []
        return job if any(c.get("type") == kind and c.get("status") == "True"
                          for c in conds) else None
    found: dict[str, Any] = await eventually(met, within=within, interval=0.5,
                                             what=f"{resource.kind} {ns}/{name} {kind}")
    return found


@contextmanager
def webhook_operator(cluster: NodeCluster, op: operators.Operator, tmp: Path, port: int, *,
                     config_extra: Mapping[str, Any] | None = None) -> Iterator[None]:
    """A controller-runtime operator with its admission webhooks served on loopback and its own
    webhook configurations pointing there; both gone after the block (a webhook whose server is
    gone would refuse every object it selects). `config_extra`: top-level fields added to its
    Configuration (e.g. LWS's gangSchedulingManagement)."""
    where = operators.serving(tmp, port)
    config = tmp / "config.yaml"
    config.write_text(yaml.safe_dump({**operators.manager_config(op, where),
                                      **(config_extra or {})}))
    hooks = tmp / "webhooks.yaml"
    hooks.write_text(yaml.safe_dump_all(operators.webhook_configurations(
        op, operators.module_dir(op), where.url, where.ca_pem, prefix=f"muster-test-{op.name}-")))
    log = cluster.dir / "logs" / f"{op.name}.log"
    with operators.running(operators.build(op), ["--config", str(config), *op.flags], log,
                           env={"KUBECONFIG": str(cluster.kubeconfig), "TMPDIR": str(tmp)}
                           ) as proc:
        operators.wait_ready(proc, log, ("Serving webhook server", "Starting workers"))
        kubectl(cluster, "apply", "-f", str(hooks))
        try:
            yield
        finally:
            kubectl(cluster, "delete", "--wait", "-f", str(hooks))


def module_controller(cluster: NodeCluster, op: operators.Operator, tmp: Path, port: int, *,
                      config_extra: Mapping[str, Any] | None = None) -> Iterator[None]:
    """The operator for a module's tests (a module fixture yields from it). Its setup and
    teardown enter the cluster's network themselves: each test leaves it at its end."""
    with ExitStack() as running:
        with cluster.netns():
            install_crds(cluster, op, tmp)
            running.enter_context(webhook_operator(cluster, op, tmp, port,
                                                   config_extra=config_extra))
        try:
            yield
        finally:
            with cluster.netns():
                running.close()


async def delete_all(kube: KubeApi, resource: Resource, ns: str) -> None:
    """The real operator adopts every object of its kind: the ones earlier tests made, with what
    their operator would have made made by hand (no operator ran then), go first, so that it
    reconciles only this test's."""
    for obj in (await kube.list(resource, namespace=ns))["items"]:
        await delete_and_wait(kube, resource, obj["metadata"]["name"], ns)


# --- the training operator (v1): PyTorchJob, elastic too ---------------------------------------

#: where the training operator's certificate rotation keeps its Secret, and the Service it signs
#: for (training-operator.<ns>.svc); the operator itself runs beside the API server, so the
#: Service's endpoint is the node's address, where it serves its webhooks
TRAINING_NS = "training-operator-system"
TRAINING_WEBHOOK_PORT = 9443
TRAINING_CERTS = "/tmp/k8s-webhook-server"  # fixed in the operator (its cert-controller)


def _training_objects(ns: str) -> list[dict[str, Any]]:
    """What its manifests deploy beside it, less the Deployment: the (empty) Secret its
    cert-controller fills, the Service the webhook configuration names, and that Service's
    endpoint (the operator's process, on the node's address)."""
    meta = {"name": "training-operator", "namespace": ns}
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
         "metadata": {"name": "training-operator-webhook-cert", "namespace": ns}},
        {"apiVersion": "v1", "kind": "Service", "metadata": meta,
         "spec": {"ports": [{"name": "webhook-server", "port": 443,
                             "targetPort": TRAINING_WEBHOOK_PORT}]}},
        schedulers.endpoint_slice(ns, meta["name"], "webhook-server", NODE_IP,
                                  TRAINING_WEBHOOK_PORT)]


def _mount_certs(cluster: NodeCluster, certs: Path, ns: str) -> None:
    """Copy the certificate its rotation wrote into its Secret to the folder it reads, as the
    kubelet's Secret volume would in its pod."""
    deadline = time.monotonic() + 60
    while True:
        secret = json.loads(kubectl(cluster, "get", "secret", "-n", ns,
                                    "training-operator-webhook-cert", "-o", "json").stdout)
        data = secret.get("data") or {}
        if "tls.crt" in data and "tls.key" in data:
            break
        if time.monotonic() > deadline:
            raise AssertionError("the training operator wrote no certificate into its Secret")
        time.sleep(0.5)
    certs.mkdir(parents=True, exist_ok=True)
    for key in ("tls.crt", "tls.key"):
        (certs / key).write_bytes(base64.b64decode(data[key]))


@contextmanager
def training_operator_running(cluster: NodeCluster, tmp: Path, *flags: str) -> Iterator[None]:
    """The training operator (PyTorchJobs of the Volcano tests' namespace, and any `flags`
    add) beside the API server, its validating webhook served and configured; the webhook
    configuration gone after the block."""
    op = operators.TRAINING_OPERATOR
    objects, hooks = tmp / "objects.yaml", tmp / "webhooks.yaml"
    objects.write_text(yaml.safe_dump_all(_training_objects(TRAINING_NS)))
    hooks.write_text(yaml.safe_dump(operators.service_webhook_configuration(
        op, operators.module_dir(op), "validator.training-operator.kubeflow.org",
        (TRAINING_NS, "training-operator", 443), keep="pytorchjob")))
    kubectl(cluster, "apply", "-f", str(objects))
    kubectl(cluster, "apply", "-f", str(hooks))
    log = cluster.dir / "logs" / "training-operator.log"
    binary = operators.build(op)
    try:
        with operators.running(
                binary,
                ["--enable-scheme=pytorchjob", f"--namespace={scenarios.VOLCANO_NS}",
                 f"--webhook-server-port={TRAINING_WEBHOOK_PORT}", "--metrics-bind-address=0",
                 "--health-probe-bind-address=127.0.0.1:18081", *flags],
                log, env={"KUBECONFIG": str(cluster.kubeconfig), "MY_POD_NAMESPACE": TRAINING_NS},
                private_dir=TRAINING_CERTS) as proc:
            _mount_certs(cluster, operators.private_path(
                proc, binary, f"{TRAINING_CERTS}/serving-certs"), TRAINING_NS)
            operators.wait_ready(proc, log, ("Starting workers", "Serving webhook server"))
            yield
    finally:
        kubectl(cluster, "delete", "--ignore-not-found", "-f", str(hooks))
