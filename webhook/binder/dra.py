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
    problems += _use_problems(pc, found)
    if pc.init_users:
        problems.append(f"init containers {', '.join(pc.init_users)} use ResourceClaims: "
                        "not supported")
    return found, problems


def _use_problems(pc: PodClaims, claims: dict[str, ClaimInfo]) -> list[str]:
    """Each claim (or each of its requests, where containers name them) must be used by
    exactly one container."""
    users: dict[tuple[str, str], int] = {}
    for _, refs in pc.containers:
        for ref in refs:
            users[ref] = users.get(ref, 0) + 1
    problems = []
    for pod_claim, _ in pc.names:
        info = claims.get(pod_claim)
        named = {r for p, r in users if p == pod_claim and r}
        if named and info is not None:
            uses = [users.get((pod_claim, r), 0) + users.get((pod_claim, ""), 0)
                    for r, _ in info.requests]
            if named - {r for r, _ in info.requests} or uses.count(1) != len(uses):
                problems.append(f"the requests of pod claim {pod_claim!r} are not each used "
                                "by exactly one container")
        elif not named and users.get((pod_claim, ""), 0) != 1:
            problems.append(f"pod claim {pod_claim!r} is used by "
                            f"{users.get((pod_claim, ''), 0)} containers, not exactly one")
    return problems


def _devices(info: ClaimInfo, request: str) -> tuple[tuple[str, int], ...]:
    """(request, GPU index) of the claim's allocation that `request` ("": all) gets."""
    return tuple(d for d in info.devices if not request or d[0] == request)


def _gpus(info: ClaimInfo, request: str) -> int:
    return sum(n for r, n in info.requests if not request or r == request)


def _assignment(pod: PodInfo, pc: PodClaims, claims: dict[str, ClaimInfo]
                ) -> GpuAssignment | None:
    """What the claims allocated for the pod, per container; None when they do not agree on
    one node or do not all name GPUs of ours."""
    nodes = {claims[p].node for p, _ in pc.names if p in claims}
    if len(claims) != len(pc.names) or len(nodes) != 1 or None in nodes:
        return None
    containers = {}
    for name, refs in pc.containers:
        indices = tuple(i for p, r in refs for _, i in _devices(claims[p], r))
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
    containers = tuple((name, sum(_gpus(claims[p], r) for p, r in refs if p in claims))
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
    to its requests (those it names, else all) in spec order."""
    pc = pod.claims
    assert pc is not None, "a pod without claims has no claim devices"
    out: dict[str, tuple[ClaimInfo, list[tuple[str, int]]]] = {}
    for name, refs in pc.containers:
        held = assignment.containers.get(name)
        left = list(held.indices) if held is not None else []
        for pod_claim, only in refs:
            info = lookup(f"{pod.namespace}/{pc.claim_name(pod_claim)}")
            assert info is not None, "resolve left the pod with a problem"
            devices = out.setdefault(info.key, (info, []))[1]
            for request, count in info.requests:
                if not only or request == only:
                    devices += [(request, i) for i in left[:count]]
                    left = left[count:]
    return [(info, tuple(devices)) for info, devices in out.values()]
