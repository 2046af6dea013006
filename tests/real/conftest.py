"""The `real` tier: Muster installed with `helm install` on a real single-node Kubernetes cluster
(etcd, kube-apiserver, controller-manager, scheduler, containerd, kubelet, kube-proxy) built from
the Go module proxy at the pinned release (`e2e/node/versions.py`; `MUSTER_K8S_VERSION` picks
another, `MUSTER_K8S_BIN` takes a user's own binaries) inside namespaces the session creates.

One cluster and one installation serve every test of the session. Each test runs with its thread
inside the cluster's network namespace (`_in_cluster_network`), so its API clients, helm and
kubectl reach 10.255.0.1 and nothing else.

Where the tier cannot run (not root, no unshare, no binaries) it is skipped with the reason;
under CI=true that skip is a failure.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import subprocess
import sys
import time
import urllib.request
from collections import defaultdict
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent))

from neighbours import KUEUE_PODS_READY_TIMEOUT
from operator_runs import module_controller
from real_helpers import (
    diagnostics,
    installed,
    kubectl,
    release_values,
    wait_established,
)

from e2e.cluster import helm
from e2e.node import image, operators, schedulers, versions
from e2e.node.assets import ensure_debian_packages, missing_prerequisites
from e2e.node.cluster import NodeCluster
from e2e.node.kubectl import write_list
from e2e.node.launcher import NODE_IP
from e2e.node.yamldocs import documents
from webhook import keys
from webhook.certs import pki
from webhook.kube import KubeApi, make_api_client


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks this folder's tests `real` and runs them last: the cluster lives until the session
    ends, and would load the other tests on a 2-core machine. The multi-node tier
    (multinode/, its own cluster) runs only in a session of its own, `-m multinode`."""
    here = Path(__file__).parent
    multinode = [i for i in items if here / "multinode" in Path(str(i.path)).parents]
    if "multinode" not in (config.option.markexpr or ""):
        config.hook.pytest_deselected(items=multinode)
        items[:] = [i for i in items if i not in multinode]
    real = [i for i in items if here in Path(str(i.path)).parents]
    for item in real:
        item.add_marker(pytest.mark.real)
        if item in multinode:
            item.add_marker(pytest.mark.multinode)
        # the first test also waits for the image build and the cluster's start
        item.add_marker(pytest.mark.timeout(900))
    # the neighbours' scenarios first: they need the node's GPUs and CPU that other scenarios
    # leave taken; test_lifecycle last: it ends with `helm uninstall`
    real.sort(key=lambda i: (i.get_closest_marker("neighbour") is None,
                             Path(str(i.path)).name == "test_lifecycle.py"))
    items[:] = [i for i in items if i not in real] + real


_NEIGHBOUR_SECONDS: defaultdict[str, float] = defaultdict(float)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Adds each test's own time to the neighbour its marker names (the neighbour's fixture
    adds its start: a test's setup also holds the cluster's)."""
    if report.when == "call":
        for name in getattr(report, "neighbours", ()):
            _NEIGHBOUR_SECONDS[name] += report.duration


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The time each neighbour (a scheduler run beside the cluster) added to the run."""
    if _NEIGHBOUR_SECONDS:
        terminalreporter.write_sep("-", "time each neighbour adds (its tests, its start)")
        for name, seconds in sorted(_NEIGHBOUR_SECONDS.items()):
            terminalreporter.write_line(f"{name}: {seconds:.0f} s")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Iterator[None]:
    """A failing real test carries the cluster's pods, warnings and not-ready containers' logs
    (the test's thread is still inside the cluster's network here), and the last lines of each
    neighbour it ran beside."""
    report: pytest.TestReport = yield
    report.neighbours = [m.args[0] for m in item.iter_markers("neighbour")]  # type: ignore[attr-defined]
    if report.when == "call" and report.failed:
        args = getattr(item, "funcargs", {})
        cluster = args.get("node_cluster")
        if isinstance(cluster, NodeCluster):
            report.sections.append(("cluster", diagnostics(cluster)))
        for value in args.values():
            if isinstance(value, schedulers.Neighbour):
                report.sections.append((f"{value.name} log", value.tail()))
    return report  # type: ignore[no-any-return]


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"the real-cluster tier must run under CI=true, but cannot: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def images() -> image.Images:
    reason = missing_prerequisites()
    if reason:
        _unavailable(reason)
    ensure_debian_packages()
    return image.build()


@pytest.fixture(scope="session")
def node_cluster(images: image.Images, tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[NodeCluster]:
    """The cluster with the CRDs and Muster installed by `helm install` with its hooks, and
    native gangs (feature gate GenericWorkload) on where the release has them."""
    gates, runtime_config = versions.native_gangs(versions.kubernetes())
    cluster = NodeCluster(images, {keys.LABEL_GPU_TOPOLOGY: keys.LABEL_GPU_TOPOLOGY_ENABLED},
                          feature_gates=gates, runtime_config=runtime_config)
    with installed(cluster, release_values(cluster), tmp_path_factory.mktemp("install"),
                   within=240, helm_timeout="3m"):
        yield cluster


@pytest.fixture(autouse=True)
def _in_cluster_network(node_cluster: NodeCluster) -> Iterator[None]:
    gone = node_cluster.alive()
    if gone:
        pytest.fail(f"the cluster is down: {gone}\n{node_cluster.logs()}")
    with node_cluster.netns():
        yield


@pytest.fixture
async def kube(node_cluster: NodeCluster) -> AsyncIterator[KubeApi]:
    client = await make_api_client(str(node_cluster.kubeconfig))
    try:
        yield KubeApi(client)
    finally:
        await client.close()


def _wait_healthy(neighbour: schedulers.Neighbour, url: str, within: float = 90) -> None:
    deadline = time.monotonic() + within
    while not _healthy(url):
        gone = neighbour.alive()
        if gone or time.monotonic() > deadline:
            raise RuntimeError(gone or f"{neighbour.name} is not healthy at {url} within "
                               f"{within:.0f} s:\n{neighbour.tail()}")
        time.sleep(0.2)


def _healthy(url: str) -> bool:
    insecure = ssl.create_default_context()
    insecure.check_hostname, insecure.verify_mode = False, ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, context=insecure, timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


@pytest.fixture(scope="module")
def coscheduling(node_cluster: NodeCluster, tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[schedulers.Neighbour]:
    """scheduler-plugins' kube-scheduler, coscheduling its only gang plugin, as the second
    scheduler `scheduler-plugins-scheduler` the shipped mpi-coscheduling policy names. Only
    within the version skew a kube-scheduler has with its API server (at most one minor
    older): scripts/test runs these scenarios on `KUBERNETES_OLDEST`."""
    built_on = versions.SCHEDULER_PLUGINS_KUBERNETES
    minor = int(node_cluster.version.split(".")[1]) - int(built_on.split(".")[1])
    if minor not in (0, 1):
        pytest.skip(f"scheduler-plugins {versions.SCHEDULER_PLUGINS} is built on Kubernetes "
                    f"{built_on}, outside a kube-scheduler's version skew with this "
                    f"{node_cluster.version} API server: run with MUSTER_K8S_VERSION={built_on}")
    started = time.monotonic()
    binary = schedulers.build_coscheduling()
    work = tmp_path_factory.mktemp("coscheduling")
    config = work / "config.yaml"
    config.write_text(yaml.safe_dump(schedulers.coscheduling_config(
        node_cluster.kubeconfig, schedulers.COSCHEDULING_NAME,
        reject_percentage=schedulers.COSCHEDULING_REJECT_PERCENTAGE)))
    port = 10359  # the cluster's own kube-scheduler has 10259 in this network
    with node_cluster.netns():
        neighbour = schedulers.Neighbour("coscheduling", [
            str(binary), "--config", str(config), "--bind-address", "127.0.0.1",
            "--secure-port", str(port), *schedulers.COSCHEDULING_FLAGS, "--v=2"],
            work / "scheduler.log")
        try:
            _wait_healthy(neighbour, f"https://127.0.0.1:{port}/healthz")
        except BaseException:
            neighbour.stop()
            raise
    _NEIGHBOUR_SECONDS["coscheduling"] += time.monotonic() - started
    yield neighbour
    neighbour.stop()


def _mount_secret(cluster: NodeCluster, neighbour: schedulers.Neighbour, into: Path,
                  within: float = 90) -> None:
    """What the kubelet's Secret volume does for Kueue in a cluster: its certificate manager
    fills the webhook Secret, then waits to find the same files in its certificate directory."""
    deadline = time.monotonic() + within
    while True:
        out = kubectl(cluster, "get", "secret", "-n", schedulers.KUEUE_NAMESPACE,
                      "kueue-webhook-server-cert", "-o", "json", check=False).stdout
        data = json.loads(out or "{}").get("data") or {}
        if {"ca.crt", "tls.crt", "tls.key"} <= set(data):
            for name, value in data.items():
                (into / name).write_bytes(base64.b64decode(value))
            return
        gone = neighbour.alive()
        if gone or time.monotonic() > deadline:
            raise RuntimeError(gone or f"Kueue filled no certificate Secret within "
                               f"{within:.0f} s:\n{neighbour.tail()}")
        time.sleep(0.5)


@pytest.fixture(scope="module")
def kueue(node_cluster: NodeCluster, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[schedulers.Neighbour]:
    """Kueue's manager (its controllers, webhooks and certificate manager) beside the cluster,
    with its own CRDs and webhook configurations read from the module cache; its webhook Service
    has an EndpointSlice at the node's address, where the manager listens. The webhook
    configurations go again after the module: its Job webhook fails closed."""
    started = time.monotonic()
    binary = schedulers.build_kueue()
    source = schedulers.module_dir("sigs.k8s.io/kueue", versions.KUEUE)
    work = tmp_path_factory.mktemp("kueue")
    (work / "certs").mkdir()
    port, health = 9643, "127.0.0.1:8681"
    config = work / "config.yaml"
    config.write_text(yaml.safe_dump(schedulers.kueue_config(
        host=NODE_IP, port=port, cert_dir=work / "certs", health=health,
        pods_ready_timeout=f"{KUEUE_PODS_READY_TIMEOUT}s")))
    hooks = work / "webhooks.yaml"
    manifests = source / "config" / "components" / "webhook" / "manifests.yaml"
    hooks.write_text(yaml.safe_dump_all(
        schedulers.kueue_service(NODE_IP, port) + schedulers.kueue_webhooks(
            documents(manifests.read_text()))))
    crds = write_list(work / "crds.json", [
        schedulers.kueue_crd(crd)
        for f in sorted((source / "config" / "components" / "crd" / "bases").glob("*.yaml"))
        for crd in documents(f.read_text())])
    with node_cluster.netns():
        kubectl(node_cluster, "apply", "--server-side", "--force-conflicts", "-f", str(crds))
        wait_established(node_cluster)
        kubectl(node_cluster, "create", "namespace", schedulers.KUEUE_NAMESPACE, check=False)
        kubectl(node_cluster, "apply", "-f", str(hooks))
        neighbour = schedulers.Neighbour(
            "kueue", [str(binary), "--config", str(config), "--zap-log-level=2",
                      # its on-demand visibility API server wants in-cluster credentials (it
                      # exits without them) and writes its certificate to /visibility
                      "--feature-gates=VisibilityOnDemand=false"],
            work / "kueue.log", env={**os.environ, "KUBECONFIG": str(node_cluster.kubeconfig)})
        try:
            _mount_secret(node_cluster, neighbour, work / "certs")
            _wait_healthy(neighbour, f"http://{health}/readyz")
        except BaseException:
            neighbour.stop()
            raise
    _NEIGHBOUR_SECONDS["kueue"] += time.monotonic() - started
    yield neighbour
    with node_cluster.netns():
        kubectl(node_cluster, "delete", "--ignore-not-found", "-f", str(hooks))
    neighbour.stop()


def _volcano_certs(into: Path) -> None:
    """The webhook-manager's serving certificate for its Service, and the CA the chart's
    admission-init job would make (Volcano writes the CA into its webhook configurations)."""
    ca = pki.generate_ca("volcano-admission-ca", days=1)
    serving = pki.issue_serving_cert(
        ca, [f"{schedulers.VOLCANO_SERVICE}.{schedulers.VOLCANO_NAMESPACE}.svc"], days=1)
    (into / "ca.crt").write_bytes(ca.cert_pem)
    pki.write_pair(serving, into / "tls.crt", into / "tls.key")


def _volcano_admitting(cluster: NodeCluster, webhooks: Path, neighbour: schedulers.Neighbour,
                       within: float = 90) -> None:
    """The webhook-manager ready: it wrote its CA into each webhook configuration (it serves
    only after that), and the API server reaches it (a dry-run Queue passes its webhooks)."""
    names = [d["metadata"]["name"] for d in yaml.safe_load_all(webhooks.read_text())
             if d and d["kind"].endswith("WebhookConfiguration")]
    queue = webhooks.with_name("probe-queue.yaml")
    queue.write_text(yaml.safe_dump({"apiVersion": "scheduling.volcano.sh/v1beta1",
                                     "kind": "Queue", "metadata": {"name": "probe"},
                                     "spec": {"weight": 1}}))
    deadline = time.monotonic() + within
    while True:
        out = kubectl(cluster, "get", "mutatingwebhookconfigurations,"
                      "validatingwebhookconfigurations", "-o", "json", check=False).stdout
        bundles = {d["metadata"]["name"]: all(h["clientConfig"].get("caBundle")
                                              for h in d.get("webhooks") or [])
                   for d in json.loads(out or '{"items": []}')["items"]}
        probe = kubectl(cluster, "create", "--dry-run=server", "-f", str(queue), check=False)
        if all(bundles.get(n) for n in names) and probe.returncode == 0:
            return
        gone = neighbour.alive()
        if gone or time.monotonic() > deadline:
            raise RuntimeError(gone or f"Volcano's webhooks not serving within {within:.0f} s "
                               f"({probe.stderr.strip()}):\n{neighbour.tail()}")
        time.sleep(0.5)


@pytest.fixture(scope="module")
def volcano(node_cluster: NodeCluster, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[dict[str, schedulers.Neighbour]]:
    """Volcano's scheduler, controller-manager and webhook-manager beside the cluster, as its
    Helm chart (read from the module cache) configures them: the chart's CRDs the cluster lacks,
    its webhook configurations (`helm template`), calling a selector-less Service whose
    EndpointSlice is the node's address, where the webhook-manager listens. Binary name ->
    process. The webhook configurations go again after the module: they fail closed."""
    started = time.monotonic()
    bin_dir = schedulers.build_volcano()
    chart = schedulers.module_dir("volcano.sh/volcano", versions.VOLCANO) / \
        schedulers.VOLCANO_CHART
    work = tmp_path_factory.mktemp("volcano")
    (work / "certs").mkdir()
    _volcano_certs(work / "certs")
    port = 9743
    rendered = subprocess.run(
        [helm(), "template", schedulers.VOLCANO_RELEASE, str(chart), "--namespace",
         schedulers.VOLCANO_NAMESPACE, "--show-only", "templates/webhooks.yaml"],
        capture_output=True, text=True, check=True, timeout=60).stdout
    hooks = work / "webhooks.yaml"
    hooks.write_text(yaml.safe_dump_all(
        schedulers.webhook_service(schedulers.VOLCANO_NAMESPACE, schedulers.VOLCANO_SERVICE,
                                   NODE_IP, port)
        + [d for d in yaml.safe_load_all(rendered) if d]))
    files = sorted((chart / "crd" / "bases").glob("*.yaml")) + sorted(
        (chart / "charts" / "jobflow" / "crd" / "bases").glob("*.yaml"))
    commands = schedulers.volcano_commands(bin_dir, chart, node_cluster.kubeconfig,
                                           work / "certs", address=NODE_IP, port=port)
    neighbours: dict[str, schedulers.Neighbour] = {}
    with node_cluster.netns():
        served = {c["metadata"]["name"] for c in json.loads(
            kubectl(node_cluster, "get", "crd", "-o", "json").stdout)["items"]}
        crds = write_list(work / "crds.json", schedulers.volcano_crds(
            [crd for f in files for crd in documents(f.read_text())], served))
        kubectl(node_cluster, "apply", "--server-side", "-f", str(crds))
        wait_established(node_cluster)
        kubectl(node_cluster, "create", "namespace", schedulers.VOLCANO_NAMESPACE, check=False)
        kubectl(node_cluster, "apply", "-f", str(hooks))
        try:
            for name, argv in commands.items():
                neighbours[name] = schedulers.Neighbour(f"volcano {name}", argv,
                                                        work / f"{name}.log")
            for name, address in schedulers.VOLCANO_HEALTH.items():
                _wait_healthy(neighbours[name], f"http://{address}/healthz")
            _volcano_admitting(node_cluster, hooks, neighbours["webhook-manager"])
        except BaseException:
            kubectl(node_cluster, "delete", "--ignore-not-found", "-f", str(hooks))
            for neighbour in neighbours.values():
                neighbour.stop()
            raise
    _NEIGHBOUR_SECONDS["volcano"] += time.monotonic() - started
    yield neighbours
    with node_cluster.netns():
        kubectl(node_cluster, "delete", "--ignore-not-found", "-f", str(hooks))
    for neighbour in neighbours.values():
        neighbour.stop()


@pytest.fixture(scope="module")
def jobset_controller(node_cluster: NodeCluster, tmp_path_factory: pytest.TempPathFactory
                      ) -> Iterator[None]:
    """JobSet's controller and webhooks (the released one, `e2e.node.operators`) for a module."""
    yield from module_controller(node_cluster, operators.JOBSET,
                                 tmp_path_factory.mktemp("jobset"), 19443)
