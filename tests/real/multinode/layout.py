"""The multi-node tier's cluster: its nodes and racks, and the admin's policy for training jobs."""

from __future__ import annotations

from webhook import keys

SPINE, LEAF = "network.topology.nvidia.com/spine", "network.topology.nvidia.com/leaf"
#: node -> rack; one block
RACKS = {"muster-a1": "rack-a", "muster-a2": "rack-a", "muster-b1": "rack-b",
         "muster-b2": "rack-b"}
GPUS_PER_NODE = 8  # the dgx1-v100 profile
#: namespaces labelled so, MPIJobs, PyTorchJobs and JobSets are gangs of Muster's binder
#: within one rack, which may preempt jobs of lower priority (an admin's own policy, shipped
#: beside the examples: `TRAINING_POLICY`)
TRAINING_LABEL = {"muster.io/training": "rack"}
TRAINING_POLICY = {
    "apiVersion": "muster.io/v1alpha1", "kind": "SchedulingPolicy",
    "metadata": {"name": "training-in-one-rack"},
    "spec": {
        "priority": 20,
        "match": {"namespaceSelector": {"matchLabels": TRAINING_LABEL},
                  "ownerKinds": ["kubeflow.org/MPIJob", "kubeflow.org/PyTorchJob",
                                 "jobset.x-k8s.io/JobSet"]},
        # a job of higher priority may have whole jobs of lower priority evicted to fit
        "gang": {"backend": "muster", "minAvailable": "auto", "scheduleTimeoutSeconds": 600,
                 "preemption": "LowerPriority"},
        "topology": {"mode": "required", "network": {"required": LEAF}}}}


def node_labels(rack: str) -> dict[str, str]:
    return {keys.LABEL_GPU_TOPOLOGY: keys.LABEL_GPU_TOPOLOGY_ENABLED, SPINE: "block-1",
            LEAF: rack}
