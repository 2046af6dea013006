"""Volcano's HyperNodes read as the binder's network levels (`webhook.binder.hypernodes`): the
view's first read, a node that joins, and a leaf HyperNode rewritten, against the plain way of
reading them in the same run: every member against every node (what Volcano's scheduler does
for each HyperNode), then the same tiers.

A fat tree of 16-node leaves, 16 leaves a spine, one core: leaves select their nodes by a name
pattern (`^node-<leaf>-`) or by a rack label, as admins and Volcano's label discovery write
them. Each read is checked: every node in its leaf, the same domains as the plain read.

Run: .venv/bin/python bench/bench_hypernodes.py [--nodes N ...] [--reps R]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from webhook.binder.hypernodes import (
    HyperNodeView,
    Tiers,
    parse_hypernode,
    selects,
    tiers,
)
from webhook.binder.nodes import NodeInfo, parse_node

LEAF = 16


def _member(leaf: int, by: str) -> dict[str, Any]:
    if by == "pattern":
        return {"type": "Node", "selector": {"regexMatch": {"pattern": f"^node-{leaf}-"}}}
    return {"type": "Node", "selector": {"labelMatch": {"matchLabels": {"rack": f"r{leaf}"}}}}


def hypernodes(n: int, by: str) -> list[dict[str, Any]]:
    leaves = n // LEAF
    out = [{"metadata": {"name": f"leaf-{i}"}, "spec": {"tier": 1, "members": [_member(i, by)]}}
           for i in range(leaves)]
    spines = max(1, leaves // 16)
    out += [{"metadata": {"name": f"spine-{s}"}, "spec": {"tier": 2, "members": [
        {"type": "HyperNode", "selector": {"exactMatch": {"name": f"leaf-{i}"}}}
        for i in range(s * 16, min(leaves, s * 16 + 16))]}} for s in range(spines)]
    out.append({"metadata": {"name": "core"}, "spec": {"tier": 3, "members": [
        {"type": "HyperNode", "selector": {"exactMatch": {"name": f"spine-{s}"}}}
        for s in range(spines)]}})
    return out


def cluster(n: int) -> dict[str, NodeInfo]:
    proto = parse_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "x"},
                        "spec": {}, "status": {"allocatable": {"cpu": "64"}}})
    return {f"node-{i // LEAF}-{i % LEAF}": replace(
        proto, name=f"node-{i // LEAF}-{i % LEAF}", labels={"rack": f"r{i // LEAF}"})
        for i in range(n)}


def plain(objs: list[dict[str, Any]], nodes: dict[str, NodeInfo]) -> Tiers:
    """The baseline: each HyperNode's members matched against every node, then the tiers."""
    parsed = [parse_hypernode(o)[0] for o in objs]
    members = {h.name: {name for name, info in nodes.items()
                        if selects(h, name, info.labels)} for h in parsed}
    return tiers(parsed, members)


def checked(t: Tiers, nodes: dict[str, NodeInfo], want: Tiers) -> None:
    if len(t.domains) != len(nodes) or t.domains != want.domains or t.problems:
        raise SystemExit(f"the view's tiers differ from the plain read ({len(t.domains)} of "
                         f"{len(nodes)} nodes placed, problems {t.problems[:3]})")


def timed(view: HyperNodeView, nodes: dict[str, NodeInfo], want: Tiers) -> float:
    """Milliseconds of the view's read (checked after the clock stops)."""
    t0 = time.perf_counter()
    t, remade = view.tiers(nodes)
    took = (time.perf_counter() - t0) * 1e3
    if not remade:
        raise SystemExit("the view did not read the change")
    checked(t, nodes, want)
    return took


def run(n: int, by: str, reps: int) -> None:
    objs, nodes = hypernodes(n, by), cluster(n)
    want = plain(objs, nodes)
    base, first, joined, rewritten = [], [], [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        checked(plain(objs, nodes), nodes, want)
        base.append((time.perf_counter() - t0) * 1e3)
        view = HyperNodeView()
        for o in objs:  # as the binder's informers sync: every HyperNode and node new
            view.on_event("ADDED", o)
        for name in nodes:
            view.nodes_changed(name)
        first.append(timed(view, nodes, want))
        view.nodes_changed("node-3-3")
        joined.append(timed(view, nodes, want))
        view.on_event("MODIFIED", objs[5])
        rewritten.append(timed(view, nodes, want))
    b, f = statistics.median(base), statistics.median(first)
    j, r = statistics.median(joined), statistics.median(rewritten)
    print(f"  {n:6} nodes, {len(objs):5} HyperNodes, leaves by {by:7}: plain read {b:8.1f} ms;"
          f" the view's first read {f:7.1f} ms ({b / f:5.1f}x faster), a node joins {j:6.1f} ms"
          f" ({b / j:6.1f}x), a leaf rewritten {r:6.1f} ms ({b / r:6.1f}x)")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, nargs="+", default=[4096, 16384])
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    print("== HyperNodes as network levels: median ms per read, against the plain read "
          "(every member against every node) of the same run")
    for n in args.nodes:
        for by in ("pattern", "label"):
            run(n, by, args.reps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
