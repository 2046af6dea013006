"""A pod whose GPUs come through ResourceClaims, as the planner sees it: pure functions of the
pod and its claims.

Each app container gets the GPUs of the claims it lists (resources.claims), so the planner
places the pod with its NVLink choice like any other; the GPU indices it chooses for a container
become the devices of that container's claims, request by request (`claim_devices`). The claims
are the trusted record of the choice: an unbound pod whose every claim is allocated and reserved
for it alone is reserved (its assignment is read back from them); one holding only some of them
is reserved in a way that cannot be bound (`assignment_raw` ""), which the planner strips.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from webhook.binder.assignment import encode_assignment
from webhook.binder.claims import ClaimInfo, PodClaims
from webhook.binder.pods import PodInfo
from webhook.topology.model import ContainerGpus, GpuAssignment

Lookup = Callable[[str], ClaimInfo | None]


def _claims(pod: PodInfo, pc: PodClaims, lookup: Lookup
            ) -> tuple[dict[str, ClaimInfo], list[str]]:
    """Pod claim name → its ResourceClaim, and what keeps the binder from allocating them."""
    found: dict[str, ClaimInfo] = {}
    problems = []
    for pod_claim, name in pc.names:
        info = lookup(f"{pod.namespace}/{name}") if name else None
        if info is None:
            problems.append(f"ResourceClaim {name or '(from a template)'} of pod claim "
                            f"{pod_claim!r} does not exist yet")
            continue
        if info.problem:
            problems.append(f"ResourceClaim {name}: {info.problem}")
        elif info.allocated and not pod.bound and not info.reserved_only_for(pod.uid):
            problems.append(f"ResourceClaim {name} is already allocated, not by this binder "
                            "for this pod alone: claims are not shared")
        found[pod_claim] = info
    users: dict[str, int] = {}
    for _, refs in pc.containers:
        for ref in refs:
            users[ref] = users.get(ref, 0) + 1
    problems += [f"pod claim {pod_claim!r} is used by {users.get(pod_claim, 0)} containers, "
                 "not exactly one" for pod_claim, _ in pc.names if users.get(pod_claim) != 1]
    if pc.init_users:
        problems.append(f"init containers {', '.join(pc.init_users)} use ResourceClaims: "
                        "not supported")
    return found, problems


def _assignment(pod: PodInfo, pc: PodClaims, claims: dict[str, ClaimInfo]
                ) -> GpuAssignment | None:
    """What the claims allocated for the pod, per container; None when they do not agree on
    one node or do not all name GPUs of ours."""
    nodes = {claims[p].node for p, _ in pc.names if p in claims}
    if len(claims) != len(pc.names) or len(nodes) != 1 or None in nodes:
        return None
    containers = {}
    for name, refs in pc.containers:
        indices = tuple(i for ref in refs for _, i in claims[ref].devices)
        if indices:
            containers[name] = ContainerGpus(indices, ("",) * len(indices))
    return GpuAssignment(node=str(nodes.pop()), containers=containers)


def resolve(pod: PodInfo, lookup: Lookup) -> PodInfo:
    """The pod with its GPUs from its claims (unchanged when it has none). Idempotent: it
    reads only what parse_pod set, so an assumed copy may be resolved again."""
    pc = pod.claims
    if pc is None:
        return pod
    claims, problems = _claims(pod, pc, lookup)
    containers = tuple((name, sum(claims[r].gpus for r in refs if r in claims))
                       for name, refs in pc.containers)
    held = () if pod.bound else tuple(
        c.key for c in claims.values() if c.reserved_only_for(pod.uid))
    assignment = _assignment(pod, pc, claims) if held else None
    return replace(pod, dra=True, gpus=sum(n for _, n in containers), container_gpus=containers,
                   init_containers=0, sidecars=frozenset(), assignment=assignment,
                   assignment_raw=(encode_assignment(assignment) if assignment is not None
                                   else "" if held else None),
                   held_claims=held, claim_problems=tuple(problems))


def claim_devices(pod: PodInfo, assignment: GpuAssignment, lookup: Lookup
                  ) -> list[tuple[ClaimInfo, tuple[tuple[str, int], ...]]]:
    """Each of the pod's claims with the (request, GPU index) pairs the assignment gives it:
    a container's GPUs in order, to its claims in the order it lists them, and within a claim
    to its requests in spec order."""
    pc = pod.claims
    assert pc is not None, "a pod without claims has no claim devices"
    out = []
    for name, refs in pc.containers:
        held = assignment.containers.get(name)
        left = list(held.indices) if held is not None else []
        for ref in refs:
            info = lookup(f"{pod.namespace}/{pc.claim_name(ref)}")
            assert info is not None, "resolve left the pod with a problem"
            devices = []
            for request, count in info.requests:
                devices += [(request, i) for i in left[:count]]
                left = left[count:]
            out.append((info, tuple(devices)))
    return out
