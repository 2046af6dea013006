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

import asyncio
import os
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent))

from real_helpers import (
    crd_documents,
    diagnostics,
    kubectl,
    release_values,
    run_helm,
    wait_established,
)

from e2e.cluster import NAMESPACE, RELEASE
from e2e.node import image, versions
from e2e.node.assets import REPO, ensure_debian_packages, missing_prerequisites
from e2e.node.cluster import NodeCluster
from e2e.probes import open_volcano_queues
from webhook import keys
from webhook.kube import KubeApi, make_api_client


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks this folder's tests `real` and runs them last: the cluster lives until the session
    ends, and would load the other tests on a 2-core machine."""
    here = Path(__file__).parent
    real = [i for i in items if here in Path(str(i.path)).parents]
    for item in real:
        item.add_marker(pytest.mark.real)
        # the first test also waits for the image build and the cluster's start
        item.add_marker(pytest.mark.timeout(900))
    items[:] = [i for i in items if i not in real] + real


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Iterator[None]:
    """A failing real test carries the cluster's pods, warnings and not-ready containers' logs
    (the test's thread is still inside the cluster's network here)."""
    report: pytest.TestReport = yield
    cluster = getattr(item, "funcargs", {}).get("node_cluster")
    if report.when == "call" and report.failed and isinstance(cluster, NodeCluster):
        report.sections.append(("cluster", diagnostics(cluster)))
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
    try:
        cluster.start()
        with cluster.netns():
            crds = tmp_path_factory.mktemp("crds") / "crds.yaml"
            crds.write_text(yaml.safe_dump_all(crd_documents()))
            kubectl(cluster, "apply", "--server-side", "-f", str(crds))
            wait_established(cluster)
            asyncio.run(_open_queues(cluster))
            values = tmp_path_factory.mktemp("values") / "values.yaml"
            values.write_text(yaml.safe_dump(release_values(cluster)))
            run_helm(cluster, "install", RELEASE, str(REPO / "charts" / "muster"),
                     "--namespace", NAMESPACE, "--create-namespace", "--values", str(values),
                     "--wait", "--timeout", "3m")
    except BaseException:
        print(cluster.logs())
        if cluster.alive() is None:
            with cluster.netns():
                print(diagnostics(cluster))
        cluster.stop()
        raise
    yield cluster
    cluster.stop()


async def _open_queues(cluster: NodeCluster) -> None:
    client = await make_api_client(str(cluster.kubeconfig))
    try:
        await open_volcano_queues(KubeApi(client))
    finally:
        await client.close()


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
