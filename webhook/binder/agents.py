"""Whether a node's GPU agent serves the node's GPU pods now.

When a node's agent pod is replaced (a DaemonSet rollout, the node back from a failure), the
kubelet may still call the old agent's device plugin: a pod bound then fails admission
(UnexpectedAdmissionError, "GetPreferredAllocation rpc failed ... connection reset"). The
acknowledgement label does not tell: an agent killed at once leaves it behind. So each agent
records its pod on the Node whenever its plugin registers (keys.ANN_GPU_AGENT) and is Ready only
while registered, and the binder places GPU pods on the node only while the pod recorded there
exists under the uid recorded, is not being deleted, and is Ready. A node without the record
(agents before it, or none at all) is placed on as before.
"""

from __future__ import annotations

from dataclasses import dataclass

from webhook import keys
from webhook.binder.pods import PodInfo

#: how the planner says a node is left out for this (`muster explain` reads it)
AGENT_WAIT = "its GPU agent is restarting"


@dataclass(frozen=True, slots=True)
class AgentPod:
    """The agent pod a node's record names."""

    namespace: str
    name: str
    uid: str

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def parse_agent(text: str | None) -> AgentPod | str | None:
    """The pod a node's record names, the record itself when it names none, or None when the
    node has no record."""
    if text is None:
        return None
    named = keys.parse_gpu_agent(text)
    return AgentPod(*named) if named is not None else text


def agent_wait(record: AgentPod | str | None, pod: PodInfo | None, node: str) -> str | None:
    """Why the GPU pods of node `node` must wait for its agent, given the pod its record names
    as the binder sees it (None: not seen); None when they need not."""
    if record is None:
        return None
    if isinstance(record, str):
        return f"its {keys.ANN_GPU_AGENT} annotation names no pod ({record[:80]!r})"
    if pod is None or pod.uid != record.uid:
        return f"agent pod {record.key} is gone and no new agent has registered"
    if pod.node_name != node:  # a record no agent of this node wrote
        return f"agent pod {record.key} runs on {pod.node_name or 'no node'}, not on this node"
    if pod.deleting:
        return f"agent pod {record.key} is being deleted"
    if not pod.ready:
        return f"agent pod {record.key} is not Ready"
    return None


class AgentIndex:
    """Which nodes' records name each pod, so that a pod's update re-decides only those."""

    def __init__(self) -> None:
        self._named: dict[str, str] = {}  # node -> pod key
        self._nodes: dict[str, set[str]] = {}  # pod key -> nodes

    def put(self, node: str, record: AgentPod | str | None) -> None:
        """The node's record now (None: the node or its record is gone)."""
        old = self._named.pop(node, None)
        if old is not None:
            nodes = self._nodes[old]
            nodes.discard(node)
            if not nodes:
                del self._nodes[old]
        if isinstance(record, AgentPod):
            self._named[node] = record.key
            self._nodes.setdefault(record.key, set()).add(node)

    def naming(self, pod: str) -> frozenset[str]:
        """The nodes whose record names the pod `pod` (namespace/name)."""
        return frozenset(self._nodes.get(pod, ()))
