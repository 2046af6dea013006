"""The multi-node real tier: four real nodes (a kubelet, containerd 2 with CDI and kube-proxy
each, in network and mount namespaces of their own, `e2e.node.kubenode`) in two racks of one
block, pods routed between the nodes, CoreDNS, against the real API server, controller-manager
and kube-scheduler. Muster installed by `helm install` with its RBAC, admission policies and
NetworkPolicies; its agent a DaemonSet with a fake NVML per node (`dgx1-v100@<node>`: 8 GPUs,
UUIDs of each node's own).

This folder's `node_cluster` replaces the single-node tier's, so every fixture of
tests/real/conftest.py (Volcano, coscheduling, the operators) runs beside this cluster. It runs
in a pytest session of its own: `pytest -m multinode tests/real/multinode`, on the Kubernetes
release the newest scheduler-plugins is built on (`versions.SCHEDULER_PLUGINS_KUBERNETES`, the
oldest supported), so that the binder, Volcano and coscheduling all place the same jobs on one
cluster; `MUSTER_K8S_VERSION` picks another.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from operator_runs import install_crds, operator
from real_helpers import (
    crd_documents,
    diagnostics,
    kubectl,
    release_values,
    run_helm,
    wait_established,
    with_api,
)

from e2e.cluster import NAMESPACE, RELEASE
from e2e.node import image, operators, train_image, versions
from e2e.node.assets import REPO
from e2e.node.cluster import NodeCluster
from e2e.node.kubectl import write_list
from e2e.probes import open_volcano_queues

sys.path.insert(0, str(Path(__file__).parent))

from layout import RACKS, TRAINING_POLICY, node_labels


def multinode_values(cluster: NodeCluster) -> dict[str, Any]:
    """The single-node tier's values, the admin's training policy beside the examples, and each
    node's agent with GPUs of its own, serving other schedulers' pods too."""
    values = release_values(cluster)
    values["policies"]["training.yaml"] = yaml.safe_dump(TRAINING_POLICY)
    # Volcano and coscheduling place GPU pods on these nodes too: each gets the kubelet's own
    # GPUs (never while a binder grant waits beside it); the default refuses them
    values["agent"] = {"extraArgs": ["--fake-nvml=dgx1-v100@$(NODE_NAME)",
                                     "--unassigned=kubelet"]}
    return values


@pytest.fixture(scope="session")
def images(images: image.Images) -> image.Images:
    """Muster's and the training image (`e2e.node.train_image`), which every node imports as
    it starts."""
    return dataclasses.replace(images, extra=(train_image.build().archive,))


@pytest.fixture(scope="session")
def node_cluster(images: image.Images, tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[NodeCluster]:
    release = os.environ.get("MUSTER_K8S_VERSION") or versions.SCHEDULER_PLUGINS_KUBERNETES
    gates, runtime_config = versions.native_gangs(release)
    cluster = NodeCluster(images, {}, release, feature_gates=gates,
                          runtime_config=runtime_config,
                          nodes=[(name, node_labels(rack)) for name, rack in RACKS.items()])
    try:
        cluster.start(within=600)
        with cluster.netns():
            crds = write_list(tmp_path_factory.mktemp("crds") / "crds.json", crd_documents())
            kubectl(cluster, "apply", "--server-side", "-f", str(crds))
            wait_established(cluster)
            with_api(cluster, open_volcano_queues)
            values = tmp_path_factory.mktemp("values") / "values.yaml"
            values.write_text(yaml.safe_dump(multinode_values(cluster)))
            run_helm(cluster, "install", RELEASE, str(REPO / "charts" / "muster"),
                     "--namespace", NAMESPACE, "--create-namespace", "--values", str(values),
                     "--wait", "--timeout", "5m")
    except BaseException:
        print(cluster.logs())
        if cluster.alive() is None:
            with cluster.netns():
                print(diagnostics(cluster))
        cluster.stop()
        raise
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def mpi_operator(node_cluster: NodeCluster, tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[None]:
    """mpi-operator on every namespace, for the module."""
    binary = operators.build(operators.MPI_OPERATOR)
    with node_cluster.netns():
        install_crds(node_cluster, operators.MPI_OPERATOR, tmp_path_factory.mktemp("mpi"))
        with operator(node_cluster, binary, "mpi-operator", ["--lock-namespace", "default"],
                      ready=("Started workers",)):
            yield


@pytest.fixture(scope="module")
def pytorch_operator(node_cluster: NodeCluster, tmp_path_factory: pytest.TempPathFactory
                     ) -> Path:
    """The training operator built and its CRDs installed; each test runs it on its
    namespace."""
    tmp = tmp_path_factory.mktemp("training-operator")
    operators.build(operators.TRAINING_OPERATOR)
    with node_cluster.netns():
        install_crds(node_cluster, operators.TRAINING_OPERATOR, tmp)
    return tmp
