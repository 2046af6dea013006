"""Names Muster owns or reads: the contract between webhook, binder and node agent.

Every component imports these instead of spelling the strings, so a rename is one edit.
See docs/design.md ("Keys Muster owns") and docs/architecture.md.
"""

from __future__ import annotations

import re

DOMAIN = "muster.io"

# --- pod annotations -------------------------------------------------------------------------
#: name(s) of the policies applied, comma separated (audit trail)
ANN_POLICY = "muster.io/policy"
#: JSON topology request the binder reads, see webhook.topology.model.TopologyRequest
ANN_GPU_TOPOLOGY = "muster.io/gpu-topology"
#: JSON GPU assignment, written only by the binder, see webhook.topology.model.GpuAssignment
ANN_GPU_ASSIGNMENT = "muster.io/gpu-assignment"
#: JSON record of a whole gang placement (each member's node and GPUs), written by the binder
#: on every Binding of the gang: a member left unbound by a crash stays reserved by it
ANN_GANG_PLACEMENT = "muster.io/gang-placement"
#: the annotations only the binder writes (on its Bindings)
BINDER_ANNOTATIONS = (ANN_GPU_ASSIGNMENT, ANN_GANG_PLACEMENT)
#: written by the node agent once the kubelet's Allocate served every GPU container of the pod
#: (value: the node's name); the binder binds the node's next GPU pod after it
ANN_GPU_ALLOCATED = "muster.io/gpu-allocated"
#: gang of pods scheduled by Muster's own binder (gang backend "muster")
ANN_GANG_NAME = "muster.io/gang-name"
ANN_GANG_MIN_MEMBER = "muster.io/gang-min-member"
ANN_GANG_TIMEOUT = "muster.io/gang-timeout-seconds"
#: the policy's gang.preemption ("Never" or "LowerPriority"): whether the binder may evict
#: lower-priority gangs to place this one (absent: the binder's --preemption default)
ANN_GANG_PREEMPTION = "muster.io/gang-preemption"
PREEMPTION_VALUES = ("Never", "LowerPriority")
#: "<backend>/<gang name>" of the gang the webhook itself joined the pod to (every backend), so
#: that a later pass over the same pod (reinvocation) tells the group keys Muster wrote from the
#: same keys written by a job's own controller (see joined_gang)
ANN_JOINED_GANG = "muster.io/joined-gang"
#: when the gang last saved its training state, RFC 3339 (e.g. 2026-12-06T18:00:00Z): its job
#: writes it on its own running pods after each checkpoint, and the binder prices the gang as a
#: preemption victim by the work since then, not since its start (it can only lower that price)
ANN_LAST_CHECKPOINT = "muster.io/last-checkpoint-time"
#: the form of that time: RFC 3339 with its zone (the chart's annotation guard refuses any other
#: with the same pattern, `muster.checkpointTimePattern`; a chart test holds them equal)
CHECKPOINT_TIME = re.compile(
    "^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]"
    "([.][0-9]+)?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$")
#: the muster.io/ annotations a pod's owner may add, change or remove on its running pods (the
#: chart's ValidatingAdmissionPolicy lists the same; a chart test holds them equal)
USER_ANNOTATIONS = (ANN_LAST_CHECKPOINT,)
#: prefix of every pod annotation Muster owns
ANNOTATION_PREFIX = f"{DOMAIN}/"
#: the muster.io/ pod annotations the webhook writes on CREATE: the only ones a pod may be
#: created with (the chart's ValidatingAdmissionPolicy lists the same; a chart test holds them
#: equal). A user may set them too, on their own pods only: see docs/operations.md
WEBHOOK_ANNOTATIONS = (ANN_POLICY, ANN_GPU_TOPOLOGY, ANN_GANG_NAME, ANN_GANG_MIN_MEMBER,
                       ANN_GANG_TIMEOUT, ANN_GANG_PREEMPTION, ANN_JOINED_GANG)
#: the annotations only Muster's binder and node agent write, never a pod's creator: the
#: webhook removes them (and any other muster.io/ key it does not write) from every pod CREATE
PROTECTED_ANNOTATIONS = (*BINDER_ANNOTATIONS, ANN_GPU_ALLOCATED)

# --- node label / annotation / taint ---------------------------------------------------------
#: node label value "enabled" marks nodes managed by the agent; also the optional taint key
LABEL_GPU_TOPOLOGY = "muster.io/gpu-topology"
LABEL_GPU_TOPOLOGY_ENABLED = "enabled"
TAINT_GPU_TOPOLOGY = "muster.io/gpu-topology"
#: node label: topology class hash published by the agent
LABEL_TOPOLOGY_CLASS = "muster.io/gpu-topology-class"
#: node label: GPU model (sanitised by gpu_model_label_value), used by policies' allowedModels
LABEL_GPU_MODEL = "muster.io/gpu-model"
#: node annotation: the discovered topology (compact JSON, schema version + class hash)
ANN_NODE_TOPOLOGY = "muster.io/gpu-topology"
#: node label "true" while NVML discovery fails on the node
LABEL_GPU_DEGRADED = "muster.io/gpu-degraded"

#: node label "true": the node's agent writes muster.io/gpu-allocated on each pod it served,
#: so the binder hands that node one GPU pod at a time (webhook.binder.gate)
LABEL_GPU_ALLOCATION_ACK = "muster.io/gpu-allocation-ack"
#: node annotation "<namespace>/<pod name>/<pod uid>": the agent pod whose device plugin last
#: registered with the node's kubelet, written at each registration and kept when it stops.
#: While that pod is gone, being deleted or not Ready, the binder places no GPU pod on the node
#: (webhook.binder.agents): the kubelet may still call the old agent's plugin
ANN_GPU_AGENT = "muster.io/gpu-agent"

#: the node label every kubelet sets to the node's name: the narrowest network level
HOSTNAME_LABEL = "kubernetes.io/hostname"

# --- defaults ---------------------------------------------------------------------------------
#: the pod webhook's path for the namespaces whose pods are refused, not admitted unmutated,
#: when their policies cannot be applied (the chart's webhook.failClosedNamespaceLabel)
FAIL_CLOSED_PATH = "/mutate/pods/fail-closed"
DEFAULT_BINDER_SCHEDULER_NAME = "muster-binder"
GPU_RESOURCE = "nvidia.com/gpu"

# --- upstream keys (reference facts in docs/design.md) --------------------------------------------
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
VOLCANO_QUEUE_ANNOTATION = "scheduling.volcano.sh/queue-name"
COSCHEDULING_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
LEGACY_COSCHEDULING_GROUP_LABEL = "pod-group.scheduling.sigs.k8s.io"
ISTIO_INJECT = "sidecar.istio.io/inject"
#: pod (or namespace) label of Istio's ambient data plane; "none" keeps the pod out of ztunnel's
#: capture even in an ambient namespace (istio/istio pkg/config/constants DataplaneModeNone)
ISTIO_DATAPLANE_MODE = "istio.io/dataplane-mode"
ISTIO_DATAPLANE_MODE_NONE = "none"

#: Kueue Topology Aware Scheduling's pod template annotations (a node label names the level)
#: pod labels Kueue sets on the pods of the workloads it admitted (a job's pod set; a plain pod
#: it manages): such a gang is Kueue's to preempt, never the binder's
KUEUE_ADMITTED_LABELS = ("kueue.x-k8s.io/podset", "kueue.x-k8s.io/managed")
KUEUE_REQUIRED_TOPOLOGY = "kueue.x-k8s.io/podset-required-topology"
KUEUE_PREFERRED_TOPOLOGY = "kueue.x-k8s.io/podset-preferred-topology"
KUEUE_SLICE_REQUIRED_TOPOLOGY = "kueue.x-k8s.io/podset-slice-required-topology"
KUEUE_SLICE_SIZE = "kueue.x-k8s.io/podset-slice-size"
#: "true": the pod set has no compactness constraint (Kueue fills the gaps, LeastFreeCapacity)
KUEUE_UNCONSTRAINED_TOPOLOGY = "kueue.x-k8s.io/podset-unconstrained-topology"
#: which KAI Topology object's levels KAI's placement annotations name (read where the binder
#: reads KAI's Topologies: `--network-levels kai:NAME`)
KAI_TOPOLOGY = "kai.scheduler/topology"
#: KAI Scheduler's topology annotations, on the workload or its pod template (a node label, or
#: an alias of the binder's levels, names the level); both together: the preferred level within
#: one domain of the required one
KAI_REQUIRED_PLACEMENT = "kai.scheduler/topology-required-placement"
KAI_PREFERRED_PLACEMENT = "kai.scheduler/topology-preferred-placement"
#: KAI's segments: each `segment-size` pods (in rank order) within one domain of a level
KAI_SEGMENT_SIZE = "kai.scheduler/segment-size"
KAI_SEGMENT_REQUIRED_PLACEMENT = "kai.scheduler/segment-topology-required-placement"
KAI_SEGMENT_PREFERRED_PLACEMENT = "kai.scheduler/segment-topology-preferred-placement"
#: Volcano's network topology on a pod (template), as its PodGroup's spec.networkTopology: mode
#: hard (within one HyperNode of at most the highest tier) or soft (best effort)
VOLCANO_NETWORK_TOPOLOGY_MODE = "volcano.sh/network-topology-mode"
VOLCANO_NETWORK_TOPOLOGY_HIGHEST_TIER = "volcano.sh/network-topology-highest-tier"
#: the job annotations a policy may honour as a network request (webhook.policy.network)
NETWORK_ANNOTATIONS = (KUEUE_REQUIRED_TOPOLOGY, KUEUE_PREFERRED_TOPOLOGY,
                       KUEUE_UNCONSTRAINED_TOPOLOGY, KUEUE_SLICE_REQUIRED_TOPOLOGY,
                       KUEUE_SLICE_SIZE, KAI_TOPOLOGY, KAI_REQUIRED_PLACEMENT,
                       KAI_PREFERRED_PLACEMENT, KAI_SEGMENT_SIZE, KAI_SEGMENT_REQUIRED_PLACEMENT,
                       KAI_SEGMENT_PREFERRED_PLACEMENT, VOLCANO_NETWORK_TOPOLOGY_MODE,
                       VOLCANO_NETWORK_TOPOLOGY_HIGHEST_TIER)
#: a network level named by its tier, as Volcano counts HyperNode tiers: the binder resolves it
#: against its levels (HyperNode tier N where they are HyperNodes; else "tier:1" the narrowest
#: declared level, "tier:2" the one above it); a ":" is in no label key, so no label is
#: mistaken for one
NETWORK_TIER_PREFIX = "tier:"
#: the Topology APIs whose objects a network request or `--network-levels` names as "API:NAME"
#: (webhook.topology.network.TopologyRef), by that API's name: its group
TOPOLOGY_APIS = {"kueue": "kueue.x-k8s.io", "kai": "kai.scheduler"}

VOLCANO_API = ("scheduling.volcano.sh", "v1beta1", "podgroups")
COSCHEDULING_API = ("scheduling.x-k8s.io", "v1alpha1", "podgroups")

_LABEL_BAD = re.compile(r"[^A-Za-z0-9._-]+")
#: a qualified label key: an optional DNS subdomain prefix, then a name of at most 63 characters
_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]"
                        r"([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


#: a DNS-1123 subdomain: an object's name (a node's, a Topology's), a label key's prefix
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def is_dns_subdomain(name: str) -> bool:
    """Whether `name` is a DNS-1123 subdomain of at most 253 characters."""
    return len(name) <= 253 and bool(_DNS_SUBDOMAIN.match(name))


def is_label_key(key: str) -> bool:
    """Whether `key` is a valid Kubernetes label key (a network level names a node label)."""
    return bool(_LABEL_KEY.match(key))


def gpu_model_label_value(model: str) -> str:
    """A GPU model name ("Tesla V100-SXM2-16GB") as a valid label value ("Tesla-V100-SXM2-16GB").

    Label values are at most 63 characters of [A-Za-z0-9._-], starting and ending alphanumeric.
    The agent writes the node label and the policy engine writes node affinity with this function,
    so both sides always agree.
    """
    value = _LABEL_BAD.sub("-", model.strip())[:63]
    return value.strip("-._")


def joined_gang(backend: str, name: str) -> str:
    """The value of ANN_JOINED_GANG for the gang `name` of `backend` (a gang name, a DNS
    subdomain, has no slash)."""
    return f"{backend}/{name}"


def user_may_create_with(key: str) -> bool:
    """Whether a pod may be created carrying annotation `key`: any key outside muster.io/, and
    the muster.io/ keys the webhook itself writes."""
    return not key.startswith(ANNOTATION_PREFIX) or key in WEBHOOK_ANNOTATIONS

def gpu_agent(namespace: str, name: str, uid: str) -> str:
    """The value of ANN_GPU_AGENT naming a pod."""
    return f"{namespace}/{name}/{uid}"


def parse_gpu_agent(text: str) -> tuple[str, str, str] | None:
    """(namespace, name, uid) that an ANN_GPU_AGENT value names; None when it names no pod."""
    parts = text.split("/")
    if len(parts) != 3 or not all(parts) or not all(map(is_dns_subdomain, parts[:2])):
        return None
    namespace, name, uid = parts
    return namespace, name, uid


# DRA (resource.k8s.io/v1): the agent's driver name, its ResourceSlices' driver and pools, the
# DeviceClass selector; and the CDI kind (vendor/class) of the devices it prepares
DRA_DRIVER = "gpu.muster.io"
#: each GPU is the device `gpu-<index>` of its node's pool (the pool is named after the node)
DRA_DEVICE_PREFIX = "gpu-"


def dra_device_name(index: int) -> str:
    return f"{DRA_DEVICE_PREFIX}{index}"


def dra_device_index(name: str) -> int | None:
    """The GPU index a device name of our driver names, or None when it names none."""
    digits = name.removeprefix(DRA_DEVICE_PREFIX)
    return decimal(digits) if digits != name else None


CDI_KIND = "muster.io/gpu"
#: a DRA-backed extended resource (1.37, KEP-5004): the annotation on the special claim made for
#: a pod's plain requests, and the name a DeviceClass without extendedResourceName serves
EXTENDED_CLAIM_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"
#: kube-scheduler's finalizer on a claim it allocates: the resourceclaim controller deallocates
#: a claim whose last user is done (and removes it) only when the claim carries it
CLAIM_FINALIZER = "resource.kubernetes.io/delete-protection"
IMPLICIT_EXTENDED_PREFIX = "deviceclass.resource.kubernetes.io/"


#: a pod's index in its job, as its operator labels it (the labels Kueue's TAS reads as a
#: PodSet's pod index label): an Indexed Job's completion index, within a JobSet's job index
COMPLETION_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
JOBSET_JOB_INDEX_LABEL = "jobset.sigs.k8s.io/job-index"
#: the Kubeflow training operator's (and MPI operator's) index within a replica type
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"
REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"
LWS_WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
KUEUE_POD_GROUP_INDEX_LABEL = "kueue.x-k8s.io/pod-group-pod-index"
#: replica types ranked before the others (rank 0 of a PyTorchJob is its master)
FIRST_REPLICA_TYPES = frozenset({"master", "chief", "launcher"})


def decimal(text: str) -> int | None:
    """The whole number `text` writes in ASCII digits alone, else None (str.isdigit also takes
    digits such as "²", which int() refuses)."""
    return int(text) if text.isascii() and text.isdigit() else None


def network_tier_level(tier: int) -> str:
    """The level name of a tier (NETWORK_TIER_PREFIX)."""
    return f"{NETWORK_TIER_PREFIX}{tier}"


def topology_object(api: str, name: str) -> str:
    """How a Topology object is named where the webhook writes it and the binder reads it
    ("kai:NAME"); `api` is a key of TOPOLOGY_APIS."""
    return f"{api}:{name}"


def network_tier(level: str) -> int | None:
    """The tier (N >= 1) a level name names, or None when it names none."""
    digits = level.removeprefix(NETWORK_TIER_PREFIX)
    tier = decimal(digits) if digits != level else None
    return tier if tier is not None and tier >= 1 else None
