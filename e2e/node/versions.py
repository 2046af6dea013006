"""The releases the real tier runs: the one place they are pinned.

`KUBERNETES` is the newest release the Go module proxy serves (the default tier);
`KUBERNETES_OLDEST` is the oldest release Muster supports (DRA's `resource.k8s.io/v1` is GA
there), which gets a control-plane pass of its own. `MUSTER_K8S_VERSION` picks another release
for one run.
"""

from __future__ import annotations

import os

KUBERNETES = "v1.37.2"
KUBERNETES_OLDEST = "v1.34.4"
ETCD = "v3.6.16"
#: github.com/containerd/containerd/v2, the node's runtime: the newest release the proxy serves
#: (CDI on by default since 2.0, which the agent's DRA driver needs; Debian's 1.6 has none)
CONTAINERD = "v2.4.2"
#: github.com/coredns/coredns, a multi-node cluster's DNS (mpirun's hostfile, a PyTorchJob's
#: MASTER_ADDR name Services): the newest release the proxy serves
COREDNS = "v1.15.0"

#: sigs.k8s.io/scheduler-plugins (the coscheduling kube-scheduler): the newest release, on 1.34;
#: its k8s.io modules are pinned to this Kubernetes release's (the proxy refuses its own v0.34.7)
SCHEDULER_PLUGINS = "v0.34.7"
SCHEDULER_PLUGINS_KUBERNETES = KUBERNETES_OLDEST
KUEUE = "v0.17.0"
#: volcano.sh/volcano: the newest release the Go module proxy serves. Every newer one asked for
#: was refused ("403 not available"): `VOLCANO_REFUSED`
VOLCANO = "v1.10.0"
VOLCANO_REFUSED = ("v1.14.0", "v1.13.2", "v1.13.1", "v1.13.0", "v1.12.2", "v1.12.1", "v1.12.0",
                   "v1.11.2", "v1.11.1", "v1.11.0", "v1.10.3", "v1.10.2", "v1.10.1")


def kubernetes() -> str:
    """The release this run's cluster is built from."""
    return os.environ.get("MUSTER_K8S_VERSION") or KUBERNETES


#: the scheduling.k8s.io version each release serves the native Workload API in (KEP-4671),
#: from its k8s.io/api module: 1.35 v1alpha1, 1.36 v1alpha2 (PodGroup objects), 1.37 v1beta1
_WORKLOAD_API = {35: "v1alpha1", 36: "v1alpha2"}


def native_gangs(release: str) -> tuple[dict[str, bool], tuple[str, ...]]:
    """(feature gates, API server --runtime-config) that turn on native gangs (feature gate
    GenericWorkload, off by default up to 1.37 at least) on `release`; none before 1.35.

    From 1.36 the gates also turn InPlacePodLevelResourcesVerticalScaling (beta, on) off: on
    this tier's cgroup v1 node the kubelet reports each pod's status.resources requests as
    1 CPU (read back from the pod cgroup), and kube-scheduler then counts 1 CPU per pod, so a
    2-core node is full after two pods (a Helm hook's pod waited with "Insufficient cpu" while
    0.47 of 2 CPUs were requested)."""
    minor = int(release.lstrip("v").split(".")[1])
    if minor < 35:
        return {}, ()
    version = _WORKLOAD_API.get(minor, "v1beta1")
    gates = {"GenericWorkload": True}
    if minor >= 36:
        gates["InPlacePodLevelResourcesVerticalScaling"] = False
    return gates, (f"scheduling.k8s.io/{version}=true",)


#: the job operators the real tier runs (`e2e.node.operators`): current releases the Go module
#: proxy serves, each built with its own go.mod's requirements
MPI_OPERATOR = "v0.8.0"
JOBSET = "v0.12.0"
LWS = "v0.9.0"
TRAINING_OPERATOR = "v1.9.3"
TRAINER = "v2.2.0"
