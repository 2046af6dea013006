"""TableCache: what it keeps per node follows the live Topology objects (no fixed bound below
the cluster's size), and its usable masks are the nodes' free healthy GPUs."""

from __future__ import annotations

import dataclasses
import gc

from bench.topology_sim import own_uuids
from webhook.topology import builtin
from webhook.topology.gpu_choice import TableCache, usable_mask
from webhook.topology.model import Topology


def own_copies(n: int, kind: str = "dgx1-v100") -> list[Topology]:
    """n nodes of one kind, each its own Topology object with its own UUIDs (as decoded)."""
    return [own_uuids(builtin(kind), str(i)) for i in range(n)]


def test_every_live_node_stays_known_past_the_old_bound() -> None:
    cache = TableCache(warm=False)
    nodes = own_copies(5000)
    first = [cache.tables(t) for t in nodes]
    assert cache.objects() == 5000
    assert len({id(x) for x in first}) == 1  # one class, one set of tables
    # a second pass finds every node without recomputing its class: the same entries
    entries = [cache._known(t) for t in nodes]
    assert all(e.ref() is t for e, t in zip(entries, nodes, strict=True))
    assert cache.objects() == 5000


def test_a_node_gone_takes_its_entry_with_it() -> None:
    cache = TableCache(warm=False)
    nodes = own_copies(10)
    masks = [cache.usable(t, frozenset({0, 1}))[1] for t in nodes]
    assert masks == [0b11] * 10
    del nodes[4:]  # (the first stays: its class's tables hold it as their example)
    gc.collect()
    assert cache.objects() == 4
    for t in own_copies(3):  # new objects may reuse the old ids: each is known as itself
        assert cache._known(t).ref() is t


def test_usable_mask_counts_only_healthy_existing_gpus() -> None:
    cache = TableCache(warm=False)
    t = builtin("dgx1-v100")
    sick = dataclasses.replace(t, gpus=tuple(dataclasses.replace(g, healthy=g.index != 3)
                                             for g in t.gpus))
    free = frozenset({1, 3, 5, 9, -1})
    assert cache.usable(t, free)[1] == usable_mask(t, free) == 0b100010 | 0b1000
    # the same free set on a node with GPU 3 unhealthy is another entry, not the first's
    assert cache.usable(sick, free)[1] == usable_mask(sick, free) == 0b100010
    assert cache.usable(t, free)[1] == 0b101010


def test_a_node_asking_with_another_free_set_gets_that_sets_mask() -> None:
    cache = TableCache(warm=False)
    t = builtin("dgx1-v100")
    both, one = frozenset({0, 1}), frozenset({1})
    # the node's last set is remembered; any other set (even an equal copy) is looked up
    assert [cache.usable(t, f)[1] for f in (both, both, one, frozenset({0, 1}), one)] == \
        [0b11, 0b11, 0b10, 0b11, 0b10]
