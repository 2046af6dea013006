"""The PNGs of docs/benchmarks.md, drawn from the JSON the benches write with `--json FILE`.

    .venv/bin/python bench/plots.py [--data docs/img/data] [--out docs/img]

Reads, from --data, each file a bench wrote (`bench/bench_placement.py --json
docs/img/data/placement.json`, the same for bench_topology.py `--only sim` and bench_abuse.py)
and writes `<bench>.png` beside the others in --out, titled with the command and commit that
measured it. A file missing is skipped with a line saying so; a file that is not a bench's
JSON, or none at all, is a one-line error (exit 2).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display, the same output everywhere

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure

REPO = Path(__file__).resolve().parent.parent


class BadData(ValueError):
    """A JSON file that is not the output its name says."""


def title(doc: dict[str, Any], what: str) -> str:
    """What the plot shows, then how to measure it again (the output path left out)."""
    command = re.sub(r"\s--json\s+\S+", "", doc["command"])
    return f"{what}\n{command}   (commit {doc['commit']}, load {doc['load'][0]}→{doc['load'][1]})"


def placement(doc: dict[str, Any]) -> Figure:
    """Gang placement p99 against the cluster's size, one line per gang shape."""
    fig, ax = plt.subplots(figsize=(8, 4.8))
    for gang in dict.fromkeys(r["gang"] for r in doc["gangs"]):  # in the bench's order
        rows = sorted((r for r in doc["gangs"] if r["gang"] == gang), key=lambda r: r["nodes"])
        line = ax.plot([r["nodes"] for r in rows], [r["p99_ms"] for r in rows], marker="o",
                       label=f"{gang} wall p99")[0]
        ax.plot([r["nodes"] for r in rows], [r["cpu_p99_ms"] for r in rows], marker="x",
                linestyle="--", color=line.get_color(), label=f"{gang} CPU p99")
    targets = sorted({(r["nodes"], r["target_ms"]) for r in doc["gangs"] if r["target_ms"]})
    ax.scatter([n for n, _ in targets], [t for _, t in targets], marker="_", s=600,
               color="red", label="target")
    ax.set(xscale="log", yscale="log", xlabel="nodes (8 GPUs each, 60 % occupied)",
           ylabel="ms per gang placed")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.suptitle(title(doc, "Gang placement p99 by cluster size"), fontsize=9)
    return fig


#: bench_topology's metrics drawn, each with its axis label
TOPOLOGY = {"util %": "GPU utilisation % (higher is better)",
            "delay mean": "queueing delay, mean min (lower)",
            "frag %": "stranded free GPUs % (lower)",
            "step x mean": "step time / ideal, mean (lower)"}


def topology(doc: dict[str, Any]) -> Figure:
    """Per metric, a group of bars per cluster, a bar per placement."""
    sim: dict[str, dict[str, dict[str, float]]] = doc["sim"]
    if not sim:
        raise BadData("no cluster in 'sim'")
    clusters = list(sim)
    names = list(next(iter(sim.values())))
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    width = 0.8 / len(names)
    for ax, (metric, label) in zip(axes.flat, TOPOLOGY.items(), strict=True):
        for i, name in enumerate(names):
            ax.bar([c + i * width for c in range(len(clusters))],
                   [sim[cl][name][metric] for cl in clusters], width, label=name)
        ax.set_xticks([c + width * (len(names) - 1) / 2 for c in range(len(clusters))],
                      [cl.replace(", ", "\n", 1) for cl in clusters], fontsize=7)
        ax.set_ylabel(label, fontsize=8)
        if metric == "step x mean":
            low = min(sim[cl][n][metric] for cl in clusters for n in names)
            ax.set_ylim(bottom=min(1.0, low) - 0.005)
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(title(doc, f"Gangs on a network topology, offered load "
                            f"{doc['offered_load']:.0%}, seed {doc['seed']}"), fontsize=9)
    fig.tight_layout()
    return fig


def abuse(doc: dict[str, Any]) -> Figure:
    """Normal requests' p99 and the server's RSS in each phase of abusive clients."""
    phases = doc["phases"]
    fig, (lat, mem) = plt.subplots(2, 1, figsize=(10, 6.5), sharex=True)
    x = range(len(phases))
    lat.bar(x, [p["p99_ms"] for p in phases], label="p99")
    lat.bar(x, [p["p50_ms"] for p in phases], label="p50")
    lat.axhline(1000, color="red", linestyle="--", label="limit: p99 < 1 s")
    lat.set(yscale="log", ylabel="normal requests, ms")
    lat.legend(fontsize=7)
    mem.bar(x, [p["rss_max_mib"] for p in phases], color="tab:green")
    mem.axhline(doc["memory_limit_mib"], color="red", linestyle="--",
                label=f"chart's memory limit {doc['memory_limit_mib']:.0f} MiB")
    mem.set(ylabel="server RSS peak, MiB")
    mem.legend(fontsize=7)
    _phase_ticks(mem, [p["phase"] for p in phases])
    fig.suptitle(title(doc, "muster serve under abusive clients, phase by phase"), fontsize=9)
    fig.tight_layout()
    return fig


def multinode(doc: dict[str, Any]) -> Figure:
    """Each round's submit -> all ranks Running and -> first allreduce, per scheduler."""
    fig, ax = plt.subplots(figsize=(9, 4.5))
    backends = list(doc["medians"])
    for phase, label, marker in (("running_s", "all ranks Running", "o"),
                                 ("allreduce_s", "first allreduce done", "^")):
        for i, backend in enumerate(backends):
            times = [r[phase] for r in doc["rounds"] if r["backend"] == backend]
            ax.scatter([i] * len(times), times, marker=marker,
                       label=label if i == 0 else None,
                       color="tab:blue" if phase == "running_s" else "tab:orange")
    ax.set_xticks(range(len(backends)), backends)
    ax.set(ylabel="seconds after submit", ylim=(0, None))
    ax.legend(fontsize=7)
    fig.suptitle(title(doc, "one MPIJob on two real nodes, each round, by scheduler"),
                 fontsize=9)
    fig.tight_layout()
    return fig


def _phase_ticks(ax: Axes, names: list[str]) -> None:
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=7)


PLOTS: dict[str, Callable[[dict[str, Any]], Figure]] = {
    "placement": placement, "topology": topology, "abuse": abuse, "multinode": multinode}


def draw(source: Path, out: Path) -> Path:
    """One bench's JSON to its PNG; BadData when it is not that bench's output."""
    bench = source.stem
    try:
        doc = json.loads(source.read_text())
        if doc.get("bench") != bench:
            raise BadData(f"written by bench {doc.get('bench')!r}, not {bench!r}")
        fig = PLOTS[bench](doc)
    except (KeyError, TypeError, IndexError, json.JSONDecodeError) as exc:
        plt.close("all")  # a figure half drawn
        raise BadData(f"not {bench}'s --json output ({type(exc).__name__}: {exc})") from exc
    target = out / f"{bench}.png"
    fig.savefig(target, dpi=100, metadata={"Software": None})
    plt.close(fig)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=REPO / "docs" / "img" / "data")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "img")
    args = parser.parse_args(argv)
    found = [args.data / f"{bench}.json" for bench in PLOTS
             if (args.data / f"{bench}.json").is_file()]
    if not found:
        print(f"plots: no bench JSON in {args.data} (expected {', '.join(PLOTS)}.json)",
              file=sys.stderr)
        return 2
    for bench in PLOTS:
        if not (args.data / f"{bench}.json").is_file():
            print(f"skipped {bench}: no {args.data / bench}.json")
    args.out.mkdir(parents=True, exist_ok=True)
    for source in found:
        try:
            print(f"wrote {draw(source, args.out)}")
        except BadData as exc:
            print(f"plots: {source}: {exc}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
