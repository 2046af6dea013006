"""In-node GPU choice: Muster's engine vs go-gpuallocator's best-effort policy, exhaustively.

Run: .venv/bin/python bench/bench_allocator.py

For every free-GPU mask and every k (2..free) on DGX-1 V100, DGX-1 P100, HGX A100 and HGX H100:
- optimal share: how often the policy's set reaches the best allreduce bandwidth available;
- broken rings: sets with no NVLink ring although a k-set with one was free;
- mean bandwidth lost against the optimum when not optimal;
- per-call cost, best-effort vs the engine (cold: tables rebuilt; warm: cached per class).
The optimum is found by scoring every k-subset (webhook.topology.scoring); the independent
brute-force cross-check of the engine lives in tests/topology/test_exhaustive.py.
"""

from __future__ import annotations

import itertools
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from webhook.topology import besteffort, builtin, scoring
from webhook.topology.gpu_choice import ClassTables

NAMES = ("dgx1-v100", "dgx1-p100", "hgx-a100", "hgx-h100")


def main() -> int:
    print(f"{'node type':10} {'cases':>6} {'ours opt':>9} {'BE opt':>8} {'ours broken':>12} "
          f"{'BE broken':>10} {'BE loss':>8} {'BE us/call':>11} {'ours cold us':>13} "
          f"{'ours warm us':>13}")
    failures = 0
    for name in NAMES:
        t = builtin(name)
        score = {m: scoring.allreduce_gbps(t, m) for m in range(1 << t.size)}
        ring = {m: scoring.has_nvlink_ring(t, m) for m in range(1 << t.size)}
        cases = ours_opt = be_opt = ours_broken = be_broken = 0
        loss: list[float] = []
        be_time = 0.0
        start = time.perf_counter()
        tables = ClassTables(t)  # fresh, not warmed: the cold cost is measured here
        choices = {}
        for free in range(1, 1 << t.size):
            for k in range(2, free.bit_count() + 1):
                choices[free, k] = tables.choose(free, k)
        cold = (time.perf_counter() - start) / len(choices) * 1e6
        start = time.perf_counter()
        for free, k in choices:
            tables.choose(free, k)
        warm = (time.perf_counter() - start) / len(choices) * 1e6
        for (free, k), ours in choices.items():
            subsets = [scoring.to_mask(c) for c in itertools.combinations(scoring.members(free), k)]
            best = max(score[s] for s in subsets)
            ring_free = any(ring[s] for s in subsets)
            t0 = time.perf_counter()
            theirs = scoring.to_mask(besteffort.allocate(t, scoring.members(free), k))
            be_time += time.perf_counter() - t0
            cases += 1
            assert ours is not None
            ours_opt += score[ours] == best
            be_opt += score[theirs] == best
            ours_broken += ring_free and not ring[ours]
            be_broken += ring_free and not ring[theirs]
            if score[theirs] < best:
                loss.append(1 - score[theirs] / best)
        failures += (ours_opt != cases) + (ours_broken != 0)
        mean_loss = 100 * sum(loss) / len(loss) if loss else 0.0
        print(f"{name:10} {cases:6} {100 * ours_opt / cases:8.1f}% {100 * be_opt / cases:7.1f}% "
              f"{ours_broken:12} {be_broken:10} {mean_loss:7.1f}% {be_time / cases * 1e6:11.1f} "
              f"{cold:13.1f} {warm:13.2f}")
    print("\nengine optimal everywhere, no broken rings" if not failures else "\nENGINE FAILED")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
