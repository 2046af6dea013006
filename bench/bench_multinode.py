"""Submit -> all ranks Running -> first allreduce done, for the same MPIJob (a launcher and two
workers of 8 GPUs on two nodes, mpirun over SSH, an allreduce over TCP) placed by Muster's
binder, by Volcano and by coscheduling, on the multi-node real cluster (four nodes in two racks,
tests/real/multinode): medians of rounds, and Muster's as ratios of each other's, in one run.

It runs the tier's `rounds.py` by path in a pytest session of its own (the cluster, Volcano,
coscheduling and mpi-operator are that tier's fixtures; root, and the tier's binaries), then
reports. It fails when a round did not finish with every rank's sum right (the work did not
happen) or a backend has fewer rounds than asked.

    bench/bench_multinode.py [--rounds 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench import results  # noqa: E402

BACKENDS = ("muster", "volcano", "coscheduling")
PHASES = (("running_s", "submit -> all ranks Running"),
          ("allreduce_s", "submit -> first allreduce done"))


def run_rounds(rounds: int, out: Path) -> list[dict[str, Any]]:
    env = {**os.environ, "MUSTER_BENCH_ROUNDS": str(rounds), "MUSTER_BENCH_OUT": str(out),
           "PATH": f"{REPO / '.cache' / 'bin'}:{os.environ.get('PATH', '')}"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-m", "multinode", "-q",
                           "-p", "no:cacheprovider", "tests/real/multinode/rounds.py"],
                          cwd=REPO, env=env, check=False, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-6000:] + proc.stderr[-2000:])
        raise SystemExit(f"the rounds failed (pytest exit {proc.returncode})")
    done: list[dict[str, Any]] = json.loads(out.read_text())
    return done


def summary(done: list[dict[str, Any]], rounds: int) -> dict[str, dict[str, float]]:
    """backend -> phase -> median seconds; SystemExit when a backend lacks rounds."""
    medians: dict[str, dict[str, float]] = {}
    for backend in BACKENDS:
        mine = [r for r in done if r["backend"] == backend]
        if len(mine) < rounds:
            raise SystemExit(f"{backend}: {len(mine)} of {rounds} rounds finished")
        medians[backend] = {phase: statistics.median(r[phase] for r in mine)
                            for phase, _ in PHASES}
    return medians


def report(medians: dict[str, dict[str, float]], done: list[dict[str, Any]]) -> None:
    print(f"{'phase':34} " + " ".join(f"{b:>13}" for b in BACKENDS)
          + "  Muster/Volcano  Muster/coscheduling")
    for phase, words in PHASES:
        row = [medians[b][phase] for b in BACKENDS]
        print(f"{words:34} " + " ".join(f"{v:12.2f}s" for v in row)
              + f"  {row[0] / row[1]:13.2f}x  {row[0] / row[2]:18.2f}x")
    for r in done:
        print(f"  round {r['round']} {r['backend']:13} running {r['running_s']:6.2f}s  "
              f"allreduce {r['allreduce_s']:6.2f}s  on {', '.join(r['nodes'])}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, help="write the figures here (bench/plots.py)")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="muster-bench-multinode-") as tmp:
        done = run_rounds(args.rounds, Path(tmp) / "rounds.json")
    medians = summary(done, args.rounds)
    report(medians, done)
    if args.json:
        results.write(args.json, "multinode", load, {"medians": medians, "rounds": done})
    return 0


if __name__ == "__main__":
    sys.exit(main())
