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
    installed,
    release_values,
)

from e2e.node import image, operators, train_image, versions
from e2e.node.cluster import NodeCluster

sys.path.insert(0, str(Path(__file__).parent))

from layout import RACKS, TRAINING_LABEL, TRAINING_POLICY, node_labels


def multinode_values(cluster: NodeCluster) -> dict[str, Any]:
    """The single-node tier's values, the admin's training policy beside the examples, and each
    node's agent with GPUs of its own, serving other schedulers' pods too."""
    values = release_values(cluster)
    values["policies"]["training.yaml"] = yaml.safe_dump(TRAINING_POLICY)
    # a training pod is refused, for its controller to create again, rather than run without
    # its gang (placed by another scheduler) while the webhook cannot be reached: a node's
    # death takes a replica with it
    values["webhook"]["failClosedNamespaceLabel"] = dict(TRAINING_LABEL)
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
    with installed(cluster, multinode_values(cluster), tmp_path_factory.mktemp("install"),
                   within=600, helm_timeout="5m"):
        yield cluster


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
