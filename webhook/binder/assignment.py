"""The annotations the binder writes: muster.io/gpu-assignment (one pod's GPUs, by container)
and muster.io/gang-placement (every member's node and GPUs); JSON forms, and an assignment's
construction from a placement."""

from __future__ import annotations

import json
import operator
from collections.abc import Collection, Sequence
from typing import Any

from webhook.podresources import DeviceShortage, GpuAsk, allocate
from webhook.topology.model import ContainerGpus, GpuAssignment, Topology


class AssignmentError(ValueError):
    pass


def encode_assignment(a: GpuAssignment) -> str:
    return json.dumps(
        {"v": 1, "node": a.node, "containers": {
            name: {"indices": list(c.indices), "uuids": list(c.uuids)}
            for name, c in a.containers.items()}},
        separators=(",", ":"),
    )


def _version_1(text: str) -> dict[str, Any]:
    """The JSON object of one of the binder's annotations (schema version 1)."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise AssignmentError(f"not JSON: {exc.msg}") from exc
    if not isinstance(doc, dict) or doc.get("v") != 1:
        raise AssignmentError('expected an object with "v": 1')
    return doc


def decode_assignment(text: str) -> GpuAssignment:
    doc = _version_1(text)
    node, containers = doc.get("node"), doc.get("containers")
    if not isinstance(node, str) or not node or not isinstance(containers, dict):
        raise AssignmentError('"node" (string) and "containers" (object) are required')
    out: dict[str, ContainerGpus] = {}
    for name, c in containers.items():
        if not isinstance(c, dict):
            raise AssignmentError(f"container {name!r}: expected an object")
        indices, uuids = c.get("indices"), c.get("uuids")
        if (not isinstance(indices, list) or not isinstance(uuids, list)
                or len(indices) != len(uuids)
                or not all(isinstance(i, int) and not isinstance(i, bool) for i in indices)
                or not all(isinstance(u, str) for u in uuids)):
            raise AssignmentError(f"container {name!r}: indices and uuids must be lists of "
                                  "equal length of integers and strings")
        out[name] = ContainerGpus(tuple(indices), tuple(uuids))
    return GpuAssignment(node=node, containers=out)


#: (pod name, node, GPU indices) of each member of one placement
Record = tuple[tuple[str, str, tuple[int, ...]], ...]

#: a record longer than this is not written: annotations share 256 KiB per object with the
#: user's own; a gang of 2,000 members with short names fits
RECORD_LIMIT = 100_000


def encode_record(record: Record) -> str:
    """The gang-placement annotation of the members placed together."""
    return json.dumps(
        {"v": 1, "members": {name: {"node": node, "gpus": list(gpus)}
                             for name, node, gpus in record}},
        separators=(",", ":"),
    )


def decode_record(text: str) -> Record:
    """A gang-placement annotation; AssignmentError when it is not one."""
    members = _version_1(text).get("members")
    if not isinstance(members, dict):
        raise AssignmentError('"members" (object) is required')
    out = []
    for name, slot in members.items():
        node = slot.get("node") if isinstance(slot, dict) else None
        gpus = slot.get("gpus") if isinstance(slot, dict) else None
        if not isinstance(node, str) or not node or not isinstance(gpus, list) or not all(
                isinstance(i, int) and not isinstance(i, bool) for i in gpus):
            raise AssignmentError(f"member {name!r}: expected a node and a list of GPU indices")
        out.append((name, node, tuple(gpus)))
    return tuple(out)


def assigned_indices(a: GpuAssignment) -> frozenset[int]:
    return frozenset(i for c in a.containers.values() for i in c.indices)


_INDEX, _UUID = operator.attrgetter("index"), operator.attrgetter("uuid")


def uuids_of(topology: Topology | None, indices: Sequence[int]) -> tuple[str, ...]:
    """The UUIDs an assignment names for these GPU indices: "" where the node's topology does
    not know one (none published, or parsed from `nvidia-smi topo -m`); the agent's device
    plugin resolves those by index from NVML."""
    if topology is None:
        return ("",) * len(indices)
    gpus = topology.gpus
    # (map and attrgetter: a pod's GPUs are read for every pod placed, without a Python loop)
    if indices and min(indices) >= 0 and max(indices) < len(gpus):
        picked = list(map(gpus.__getitem__, indices))
        if list(map(_INDEX, picked)) == list(indices):  # listed by index, as all nodes are
            uuids = tuple(map(_UUID, picked))
            return uuids if None not in uuids else tuple(u or "" for u in uuids)
    uuid = {g.index: g.uuid for g in gpus}
    return tuple(uuid.get(i) or "" for i in indices)


def build_assignment(node: str, topology: Topology | None, gpus: Sequence[int],
                     container_gpus: Sequence[tuple[str, int]],
                     init_containers: int = 0, *,
                     sidecars: Collection[str] = ()) -> GpuAssignment:
    """Give containers the pod's GPUs as the kubelet's device manager will
    (`webhook.podresources.allocate`), as many as their nvidia.com/gpu limit.

    The first `init_containers` entries are init containers, `sidecars` those among them with
    restartPolicy Always: a container after a finished regular init container reuses its GPUs,
    never a sidecar's, which keeps them.
    """
    return Assigner().build(node, topology, gpus, container_gpus, init_containers,
                            sidecars=sidecars)


#: a pod's containers as the hand-out reads them: (name, GPUs) each, how many lead as init
#: containers, the sidecars among those, and how many GPUs the pod got
_Shape = tuple[tuple[tuple[str, int], ...], int, frozenset[str], int]


class Assigner:
    """`build_assignment` for many pods (one planning round): the pods of a job share their
    containers' shape, so which of a pod's GPUs each container gets is worked out once per
    shape and GPU count, not once per pod."""

    def __init__(self) -> None:
        self._positions: dict[_Shape, dict[str, tuple[int, ...]]] = {}

    def build(self, node: str, topology: Topology | None, gpus: Sequence[int],
              container_gpus: Sequence[tuple[str, int]], init_containers: int = 0, *,
              sidecars: Collection[str] = ()) -> GpuAssignment:
        shape = (tuple(container_gpus), init_containers, frozenset(sidecars), len(gpus))
        positions = self._positions.get(shape)
        if positions is None:
            asks = [GpuAsk(name, count, "app" if n >= init_containers
                           else "sidecar" if name in sidecars else "init")
                    for n, (name, count) in enumerate(container_gpus)]
            try:  # positions in the pod's GPUs: the same for every pod of this shape
                positions = allocate(asks, range(len(gpus)))
            except DeviceShortage as exc:
                raise AssignmentError(str(exc)) from exc
            self._positions[shape] = positions
        containers = {}
        for name, at in positions.items():
            # ascending positions: all of them are the pod's GPUs in their order
            indices = tuple(gpus) if len(at) == len(gpus) else tuple([gpus[i] for i in at])
            containers[name] = ContainerGpus(indices, uuids_of(topology, indices))
        return GpuAssignment(node=node, containers=containers)


def shape_matches(a: GpuAssignment, container_gpus: Sequence[tuple[str, int]]) -> bool:
    """Does an assignment give each container exactly the GPUs it asks for?"""
    wanted = {name: count for name, count in container_gpus if count > 0}
    return {n: len(c.indices) for n, c in a.containers.items()} == wanted
