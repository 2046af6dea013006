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


def kubernetes() -> str:
    """The release this run's cluster is built from."""
    return os.environ.get("MUSTER_K8S_VERSION") or KUBERNETES

#: the job operators the real tier runs (`e2e.node.operators`): current releases the Go module
#: proxy serves, each built with its own go.mod's requirements
MPI_OPERATOR = "v0.8.0"
JOBSET = "v0.12.0"
LWS = "v0.9.0"
TRAINING_OPERATOR = "v1.9.3"
TRAINER = "v2.2.0"
