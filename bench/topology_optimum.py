"""The exact best placement of one gang on what is free, by the model's objective, found with an
integer program (HiGHS, through highspy: a dev/bench dependency only).

The objective is the modelled step time. For a gang of fixed size it falls as the allreduce bus
bandwidth rises, so the program maximises the bus bandwidth b:
- y[i, j] = 1 when node i takes j of the gang's pods (at most one j per node, pods sum up);
- b <= the best j-pod GPU set of node i (scoring over every subset of its free GPUs), if y[i, j];
- when the gang spans nodes (z = 1): b <= the NICs node i uses over the oversubscription of the
  scope, if y[i, j], or the clique's NVLink when the scope is one clique.
One program per scope (each leaf, each block, the cluster) holds the nodes to that scope; the
best over the scopes is the optimum, since a placement's true figure is that of the narrowest
scope holding it and a wider scope's figure is never higher.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import cast

import highspy

from bench.topology_sim import Cluster, Job
from webhook.topology.gpu_choice import TableCache, usable_mask


@dataclass(frozen=True)
class Optimum:
    bus_gbps: float
    nodes: dict[int, int]  # node index -> pods


def _scopes(c: Cluster) -> list[tuple[list[int], float]]:
    """(nodes, network GB/s per NIC-used over the scope's oversubscription) per scope; a clique
    scope's figure is its NVLink and is marked by a negative sign."""
    f = c.spec.fabric
    over = [*f.oversubscription, 1.0, 1.0]
    out: list[tuple[list[int], float]] = []
    for leaf in range(len(c.leaf_free)):
        out.append((list(c.nodes_in(leaf)), -f.clique_gbps if c.spec.clique else 1.0))
    for b in range(len(c.block_free)):
        out.append(([i for x in c.leaves_in(b) for i in c.nodes_in(x)], over[0]))
    out.append((list(range(c.spec.nodes)), over[0] * over[1]))
    return out


def optimum(c: Cluster, job: Job, tables: TableCache) -> Optimum | None:
    """The highest bus bandwidth any placement of `job` on `c`'s free GPUs reaches, or None when
    the job does not fit (a one-GPU job runs no allreduce: its figure is 0)."""
    best: Optimum | None = None
    for nodes, ratio in _scopes(c):
        got = _solve(c, job, nodes, ratio, tables)
        if got is not None and (best is None or got.bus_gbps > best.bus_gbps + 1e-9):
            best = got
    return best


def _solve(c: Cluster, job: Job, nodes: list[int], ratio: float,
           tables: TableCache) -> Optimum | None:
    spec, f, p = c.spec, c.spec.fabric, job.pod_gpus
    ct = tables.tables(spec.topology)
    caps = {i: len(c.free[i]) // p for i in nodes}
    if sum(caps.values()) < job.pods:
        return None
    top = max(f.clique_gbps, f.rails * f.rail_gbps, 2 * ct.score((1 << spec.gpus_per_node) - 1)
              .allreduce_gbps) * 2
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    b = h.addVariable(lb=0, ub=top)
    z = h.addBinary()
    y: dict[tuple[int, int], highspy.highs.highs_var] = {}
    for i, cap in caps.items():
        mask = usable_mask(spec.topology, c.free[i])
        for j in range(1, min(cap, job.pods) + 1):
            v = y[i, j] = h.addBinary()
            k = j * p
            if k >= 2:
                h.addConstr(b <= ct.best_by_size(mask)[k] + top * (1 - v))
            net = -ratio if ratio < 0 else min(k, f.rails) * f.rail_gbps / ratio
            h.addConstr(b <= net + top * (1 - v) + top * (1 - z))
        if any(key[0] == i for key in y):
            # node i has a y, so the sum is an expression, never sum()'s start 0
            picks = cast(highspy.highs_linear_expression,
                         sum(y[i, j] for j in range(1, min(cap, job.pods) + 1)))
            h.addConstr(picks <= 1)
    if not y:
        return None
    h.addConstr(sum(j * v for (_, j), v in y.items()) == job.pods)
    h.addConstr(sum(y.values()) <= 1 + job.pods * z)
    if job.gpus < 2:
        h.addConstr(b == 0)
    h.maximize(b)
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return None
    chosen = {i: j for (i, j), v in y.items() if h.val(v) > 0.5}
    return Optimum(math.floor(h.val(b) * 1e6) / 1e6, chosen)


def as_placement(c: Cluster, job: Job, opt: Optimum, tables: TableCache
                 ) -> list[tuple[int, tuple[int, ...]]]:
    """The optimum as pods on nodes, each node's pods on its best set (so the model, not the
    program's arithmetic, gives its step time)."""
    ct = tables.tables(c.spec.topology)
    out = []
    for i, pods in sorted(opt.nodes.items()):
        mask = ct.choose(usable_mask(c.spec.topology, c.free[i]), pods * job.pod_gpus)
        assert mask is not None
        gpus = [g for g in range(c.spec.gpus_per_node) if mask >> g & 1]
        for p in range(pods):
            out.append((i, tuple(gpus[p * job.pod_gpus:(p + 1) * job.pod_gpus])))
    return out
