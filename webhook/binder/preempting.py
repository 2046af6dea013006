"""The binder's side of preemption (docs/binder.md, "Priority and preemption"): what the
preemption planner is given each cycle (the running gangs, the PodDisruptionBudgets, the
victims the API refused lately), the reservations of the gangs that preempted, and the start
of each preemption's evictions (`webhook.binder.evict`)."""

from __future__ import annotations

from collections.abc import Collection, Coroutine, Mapping
from typing import Any

from webhook.binder.evict import Evictor
from webhook.binder.fit import FitCache
from webhook.binder.gangs import Gang, PodGroupInfo
from webhook.binder.nodes import NodeInfo
from webhook.binder.pdb import PdbInfo, forbidding, parse_pdb
from webhook.binder.planner import PlaceFn, PlanConfig, Preempt, PreemptFn
from webhook.binder.preemption import Running, kueue_admitted, preempter
from webhook.binder.reserve import Reservation
from webhook.binder.snapshot import Snapshot

#: how long a victim whose eviction the API refused is left out of preemption
REFUSED_SECONDS = 60.0


class Preemptions:
    def __init__(self, evictor: Evictor, snapshot: Snapshot) -> None:
        self.evictor = evictor
        self.snapshot = snapshot
        #: the reservations of the gangs that preempted, by gang key
        self.reserved: dict[str, Reservation] = {}
        #: the PodDisruptionBudgets, by "namespace/name"
        self.budgets: dict[str, PdbInfo] = {}
        #: the candidates as last made, by gang key: kept while the snapshot gives the same
        #: Gang and its flags hold (a Running reads its members once)
        self._candidates: dict[str, Running] = {}

    def on_pdb(self, event: str, obj: dict[str, Any], _old: dict[str, Any] | None) -> None:
        pdb = parse_pdb(obj)
        key = f"{pdb.namespace}/{pdb.name}"
        if event == "DELETED":
            self.budgets.pop(key, None)
        else:
            self.budgets[key] = pdb

    def prune(self, open_gangs: Collection[str], now: float) -> None:
        """Let go of the reservations whose gang is placed or gone, whose time is up, or
        whose victims are all gone (the preemptor is placed afresh on what they freed)."""
        for key, held in list(self.reserved.items()):
            if key not in open_gangs or now >= held.until or \
                    not any(self.snapshot.holds(p) for p in held.victim_pods):
                del self.reserved[key]
        refused = self.evictor.refused
        for key in [k for k, at in refused.items() if now - at >= REFUSED_SECONDS]:
            del refused[key]

    def running(self, pod_groups: Mapping[str, PodGroupInfo] | None, timeout: int
                ) -> list[Running]:
        """The running gangs, as victim candidates: not those an earlier preemption chose
        (their evictions may still be under way)."""
        gangs = self.snapshot.running_gangs(pod_groups, timeout)
        chosen = {v for held in self.reserved.values() for v in held.victims}
        kept, made = self._candidates, {}
        for key, g in gangs.items():
            hit = kept.get(key)
            evictable = self._evictable(g)
            if hit is None or hit.gang is not g or hit.evictable != evictable:
                hit = Running(g, evictable=evictable, kueue_admitted=kueue_admitted(g))
            made[key] = hit
        self._candidates = made
        return [r for key, r in made.items() if key not in chosen]

    def _evictable(self, gang: Gang) -> bool:
        if gang.key in self.evictor.refused:
            return False
        mine = [p for p in self.budgets.values() if p.namespace == gang.namespace]
        return not mine or forbidding(gang.members, mine) is None

    def planner(self, nodes: Mapping[str, NodeInfo], *, config: PlanConfig, place: PlaceFn,
                fit: FitCache, now: float, pod_groups: Mapping[str, PodGroupInfo] | None
                ) -> PreemptFn:
        """This cycle's preemption planner."""
        return preempter(lambda: self.running(pod_groups, config.podgroup_default_timeout),
                         nodes, config=config, place=place, now=now, fit=fit)

    def begin(self, pe: Preempt, now: float) -> Coroutine[Any, Any, None]:
        """Hold the preemptor's reservation from now on; the evictions, to run."""
        self.reserved[pe.gang.key] = pe.reservation

        async def run() -> None:
            if not await self.evictor.preempt(pe, now):
                self.reserved.pop(pe.gang.key, None)  # it plans again, without that victim
        return run()
