"""Reruns the benches behind docs/benchmarks.md and prints each one's figures as a table row.

    scripts/bench --readme [--root] [--only NAME ...] [--logs DIR [--reparse]]

Each bench runs as its own process, one after another (they share nothing but the machine), with
the command docs/benchmarks.md names. From its output this script takes the figures the row shows,
says for each row with a target whether it is met, and names the commit measured and the load
average (`uptime`'s 1-minute figure) before and after the bench: every figure is a ratio against
a baseline of the same run, but a busy machine still widens the rounds. A bench that fails (its
work did not happen, or it crashed) makes its row say so, and this script exit non-zero.

The benches that need root and the real cluster (bench_apiserver, bench_scheduler, bench_node:
minutes each, a real kube-apiserver, etcd and kubelet) run only with --root; without it their
rows are listed as not rerun.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.results import REPO, commit

PY = str(REPO / ".venv" / "bin" / "python") if (REPO / ".venv").exists() else sys.executable


class Unreadable(ValueError):
    """A bench's output lacks a figure its row needs."""


def find(pattern: str, text: str, flags: int = 0) -> re.Match[str]:
    m = re.search(pattern, text, flags)
    if m is None:
        raise Unreadable(f"no line matching {pattern!r}")
    return m


def met(ok: bool) -> str:
    return "met" if ok else "**NOT met**"


# --- one parser per bench: (measured, target verdict or "" when the row has no target) -------

def engine(out: str) -> tuple[str, str]:
    got = {m[1]: m for m in re.finditer(
        r"50 (\w+)\s+best\s+([\d.]+) us\s+ratio median ([\d.]+) \(rounds: ([\d.]+)-([\d.]+)\)",
        out)}
    base = find(r"json.loads\(AdmissionReview\)\s+best\s+([\d.]+) us", out)[1]
    if set(got) != {"realistic", "audited", "adversarial"}:
        raise Unreadable(f"engine sets {sorted(got)}")
    text = "; ".join(f"{name} {m[3]}× (rounds {m[4]}–{m[5]}; best {m[2]} µs)"
                     for name, m in got.items())
    return f"{text}; json.loads best {base} µs", \
        f"≤ 1.0× (realistic): {met(float(got['realistic'][3]) <= 1.0)}"


def serve_case(out: str, case: str) -> tuple[str, str]:
    block = find(rf"\n{case}: wrk.*?\n\s+p50 ratio[^\n]*", out, re.S)[0]
    noop = find(r"no-op\s+median\s+(\d+) req/s.*?p99\s+([\d.]+) ms.*?server\s+(\d+) us", block)
    mine = find(r"muster\s+median\s+(\d+) req/s.*?p99\s+([\d.]+) ms.*?server\s+(\d+) us, "
                r"emulator\s+(\d+) us", block)
    rps = float(find(r"throughput ratio ([\d.]+)", block)[1])
    p99 = float(find(r"p99 ratio\s+([\d.]+)", block)[1])
    rounds = [f"{float(m[1]):.0f}" for m in re.finditer(
        rf"^{case} round \d+ muster .*?p99\s+([\d.]+) ms", out, re.M)]
    text = (f"{rps:.2f}× throughput ({mine[1]} vs {noop[1]} req/s), p99 {p99:.2f}× (muster p99 "
            f"per round {' / '.join(rounds)} ms); CPU per request {mine[3]} µs (no-op {noop[3]} "
            f"µs) + {mine[4]} µs in the emulator")
    return text, f"≥ 0.75×: {met(rps >= 0.75)}; p99 ≤ 1.5×: {met(p99 <= 1.5)}"


def memory(out: str) -> tuple[str, str]:
    m = find(r"RSS after admissions\s+([\d.]+) MiB \(peak ([\d.]+) MiB\)", out)
    gang = find(r"pods admitted with gang (\d+/\d+)", out)[1]
    groups = find(r"podgroups in cache\s+(\d+)", out)[1]
    return (f"{m[1]} MiB (peak {m[2]}); pods admitted with their gang {gang}, PodGroups "
            f"cached {groups}"), f"< 150 MiB: {met(float(m[2]) < 150)}"


def allocator(out: str) -> tuple[str, str]:
    rows = re.findall(r"^(\S+)\s+\d+\s+([\d.]+)%\s+([\d.]+)%\s+(\d+)\s+(\d+)", out, re.M)
    if not rows:
        raise Unreadable("no node type rows")
    ours = " / ".join(f"{r[1]} %" for r in rows)
    text = (f"Muster {ours} on {' / '.join(r[0] for r in rows)}, "
            f"{sum(int(r[3]) for r in rows)} broken rings; best-effort "
            f"{' / '.join(r[2] + ' %' for r in rows)}, {' / '.join(r[4] for r in rows)} broken")
    ok = all(float(r[1]) == 100.0 and r[3] == "0" for r in rows)
    return text, f"100 %, 0: {met(ok)}"


def placement(out: str) -> tuple[str, str]:
    cold = find(r"both cold: ([\d.]+)x", out)[1]
    warm = find(r"both warm: ([\d.]+)x", out)[1]
    parts, verdicts = [], []
    for section in re.finditer(r"\n(\d+) nodes \(.*?\n(.*?)(?=\n\n|\n\d+ nodes|\Z)", out, re.S):
        rows = re.findall(r"^\s+(\S+)\s+[\d.]+\s+([\d.]+)\s+[\d.]+\s+([\d.]+)\s+([\d.]+)\s+"
                          r"(\d+)/(\d+)\s+(\S+)", section[2], re.M)
        if not rows:
            continue
        p99 = " / ".join(r[1] for r in rows)
        cpu = " / ".join(r[2] for r in rows)
        per_node = statistics.median(float(r[3]) for r in rows)
        parts.append(f"{int(section[1]):,} nodes: p99 {p99} ms wall, {cpu} ms CPU "
                     f"(p50 {per_node:.1f} µs per node)")
        verdicts += [(section[1], r[6]) for r in rows if r[6] != "-"]
    if not parts:
        raise Unreadable("no gang rows")
    missed = [f"{n} nodes" for n, v in verdicts if v == "MISSED"]
    ok = not missed
    # a target counts as met on CPU time when a busy machine's wall time is not the engine's
    return (f"cold {cold}× best-effort, warm {warm}×; gangs 4×1 / 8×1 / 2×4 / 16×8, "
            + "; ".join(parts)), \
        f"< 10 ms / < 100 ms: {met(ok)}" + (f" ({', '.join(missed)})" if missed else "")


def simulate(out: str) -> tuple[str, str]:
    rows = re.findall(r"(vgg16|resnet50)\s+(muster|regular)\s+modelled\s+([\d.]+)\s+published\s+"
                      r"([\d.]+)\s+error\s+([+-][\d.]+) %", out)
    speed = re.findall(r"(vgg16|resnet50)\s+speed-up modelled ([\d.]+)x, published ([\d.]+)x",
                       out)
    if len(rows) != 4 or len(speed) != 2:
        raise Unreadable("no check against the published figures")
    text = "; ".join(f"{r[0]} {r[1]} {r[2]} (published {r[3]}: {r[4]} %)" for r in rows)
    return text + "; speed-up " + " / ".join(f"{s[1]}× (published {s[2]}×)" for s in speed), ""


def binder(out: str) -> tuple[str, str]:
    burst = find(r"burst:\s+binder\s+([\d.]+) pods/s.*?baseline \(own process\)\s+([\d.]+) "
                 r"pods/s; ratio ([\d.]+)", out)
    rounds = [f"{float(b) / float(n):.2f}" for b, n in re.findall(
        r"round \d+: binder\s+([\d.]+) pods/s, API-writes-only\s+([\d.]+)", out)]
    arrival = find(r"arrival:.*?p50 (\d+) ms, p99 (\d+) ms", out)
    mems = re.findall(r"memory:\s+(\d+) nodes.*?binder RSS (\d+) MiB, peak (\d+) MiB", out)
    if not mems:
        raise Unreadable("no memory line")
    mem = "; ".join(f"{int(n):,} nodes: RSS {r} MiB (peak {p})" for n, r, p in mems)
    peak_5000 = [int(p) for n, _, p in mems if int(n) == 5000]
    return (f"burst {float(burst[1]):,.0f} pods/s, {burst[3]}× the writes alone (rounds "
            f"{' / '.join(rounds)}); arrival p99 {arrival[2]} ms (p50 {arrival[1]}); {mem}"), \
        (f"p99 < 1 s: {met(int(arrival[2]) < 1000)}; RSS < 500 MiB at 5,000 nodes: "
         f"{met(bool(peak_5000) and peak_5000[0] < 500)}")


def abuse(out: str) -> tuple[str, str]:
    rows = re.findall(r"^(\S.{21})\s+\d+\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)"
                      r"\s+[\d/]+\s+[-\d/]+$", out, re.M)
    if not rows:
        raise Unreadable("no phase rows")
    quiet = rows[0]
    others = [float(r[4]) for r in rows[1:]]
    hwm = find(r"server peak RSS \(VmHWM\) over the run: ([\d.]+) MiB", out)[1]
    ok = "\nok: every normal request answered" in out
    return (f"p99 {min(others):.2f}–{max(others):.2f}× the quiet phase ({quiet[2]} ms quiet); "
            f"RSS peak {hwm} MiB"), f"within the chart's limit, no failed request: {met(ok)}"


def emulator(out: str) -> tuple[str, str]:
    got = re.findall(r"^(create \d+ nodes vs echo|list \d+ nodes vs static bytes|create \d+ pods,"
                     r" \d+ watchers vs none)\s+ratio ([\d.]+) \(rounds ([\d.]+)-([\d.]+)\)",
                     out, re.M)
    if len(got) != 3:
        raise Unreadable("no ratio lines")
    return "; ".join(f"{w} {r}× (rounds {a}–{b})" for w, r, a, b in got), ""


def deviceplugin(out: str) -> tuple[str, str]:
    ratio = find(r"muster / bare \(median of per-round p50 ratios\): ([\d.]+)x", out)[1]
    bare = find(r"bare\s+p50\s+([\d.]+) ms\s+p99\s+([\d.]+) ms", out)
    mine = find(r"muster\s+p50\s+([\d.]+) ms\s+p99\s+([\d.]+) ms", out)
    restart = find(r"registered again.*?median (\d+) ms", out)[1]
    return (f"p50 {mine[1]} ms vs {bare[1]} ms: {ratio}× (p99 {mine[2]} vs {bare[2]} ms); "
            f"kubelet restart → registered again {restart} ms median"), ""


def tail(out: str) -> tuple[str, str]:
    """The root benches: their summary's last lines as they print them."""
    lines = [ln.strip() for ln in out.strip().splitlines()[-6:]]
    return " / ".join(ln for ln in lines if ln), "(see the lines)"


@dataclass(frozen=True)
class Row:
    name: str
    what: str
    command: tuple[str, ...]
    parse: Callable[[str], tuple[str, str]]
    root: bool = False


SERVE = ("bench/bench_serve.py", "--request", "mix", "--request", "hit", "--request", "miss",
         "--rounds", "3")
ROWS = (
    Row("engine", "admission of an unseen pod, 50 policies, vs json.loads",
        ("bench/bench_engine.py",), engine),
    Row("serve", "muster serve vs a no-op TLS webhook, wrk: mix / hit / miss",
        SERVE, lambda out: serve_case(out, "mix")),
    Row("serve-msgspec", "the mix and the hits against the msgspec no-op",
        ("bench/bench_serve.py", "--noop-parser", "msgspec", "--request", "mix", "--request",
         "hit", "--rounds", "3"), lambda out: serve_case(out, "mix")),
    Row("memory", "muster serve RSS, 100 policies, 10,000 namespaces",
        ("bench/bench_memory.py",), memory),
    Row("allocator", "in-node GPU choice, optimal share", ("bench/bench_allocator.py",),
        allocator),
    Row("placement", "GPU choice vs best-effort; gang placement p99",
        ("bench/bench_placement.py",), placement),
    Row("simulate", "muster simulate, modelled img/s vs published", ("-m", "webhook", "simulate"),
        simulate),
    # its summary as printed until it has a parser of its own (the bench came with the network
    # topology work, beside this script)
    Row("topology", "gangs on a network topology, trace-driven, Muster vs other schedulers",
        ("bench/bench_topology.py",), tail),
    Row("binder", "binder through the emulator: burst, arrival p99, RSS",
        ("bench/bench_binder.py",), binder),
    Row("abuse", "muster serve under abusive clients", ("bench/bench_abuse.py",), abuse),
    Row("emulator", "API server emulator vs same-run baselines", ("bench/bench_emulator.py",),
        emulator),
    Row("deviceplugin", "device plugin admission per pod, agent vs bare plugin",
        ("bench/bench_deviceplugin.py",), deviceplugin),
    Row("scheduler", "binder vs the real kube-scheduler", ("bench/bench_scheduler.py",), tail,
        root=True),
    Row("apiserver", "pod creates through the real kube-apiserver",
        ("bench/bench_apiserver.py",), tail, root=True),
    Row("node", "the real tier's node per Kubernetes release", ("bench/bench_node.py",), tail,
        root=True),
)
#: the rows of the serve run's other cases (parsed from the same output)
SERVE_CASES = {"serve": ("hit", "miss"), "serve-msgspec": ("hit",)}


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def run(row: Row, logs: Path | None, reparse: bool
        ) -> tuple[list[tuple[str, str, str, str]], bool]:
    """(table rows: what, command, measured, target), and whether the bench did its work.
    `reparse`: read the output a run saved in `logs` instead of running the bench."""
    log = logs / f"{row.name}.log" if logs is not None else None
    if reparse and log is not None:
        saved = log.read_text()
        head, _, out = saved.partition("\n")
        returncode, context = int(head.split(" ", 1)[0]), head.split(" ", 1)[1]
    else:
        load0, measured = os.getloadavg()[0], commit()  # the code as the bench starts
        start = time.monotonic()
        proc = subprocess.run([PY, *row.command], cwd=REPO, capture_output=True, text=True,
                              check=False)
        took = time.monotonic() - start
        out, returncode = proc.stdout + proc.stderr, proc.returncode
        context = f"commit {measured}, load {load0:.1f}→{os.getloadavg()[0]:.1f}, {took:.0f} s"
        if log is not None:  # first line: exit status and context, for --reparse
            log.write_text(f"{returncode} {context}\n{out}")
    command = " ".join(row.command).replace("-m webhook", "muster", 1)
    if returncode != 0:
        why = [ln for ln in out.splitlines() if ln.startswith(("FAILED", "FAIL "))] or \
            out.strip().splitlines()[-3:]
        return [(row.what, command, f"**bench failed** (exit {returncode}): "
                 + " / ".join(why)[:600] + f" ({context})", "**not met**")], False
    try:
        out_rows = [(row.what, command, *row.parse(out))]
        for case in SERVE_CASES.get(row.name, ()):
            out_rows.append((f"{row.what}: {case}", "same run", *serve_case(out, case)))
    except Unreadable as exc:
        return [(row.what, command, f"**output not understood**: {exc} ({context})", "")], False
    return [(w, c, f"{m} ({context})", t) for w, c, m, t in out_rows], True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", action="store_true",
                        help="also the benches on the real cluster (root, many minutes)")
    parser.add_argument("--only", action="append", choices=[r.name for r in ROWS],
                        help="only these benches (repeatable)")
    parser.add_argument("--logs", type=Path, help="keep each bench's whole output here")
    parser.add_argument("--reparse", action="store_true",
                        help="print the rows from the outputs saved in --logs, running nothing")
    args = parser.parse_args()
    if args.reparse and args.logs is None:
        parser.error("--reparse reads the outputs saved in --logs")
    if args.logs is not None and not args.reparse:
        args.logs.mkdir(parents=True, exist_ok=True)
    rows = [r for r in ROWS if (args.only is None or r.name in args.only)
            and (args.root or not r.root or args.only)
            and (not args.reparse or (args.logs / f"{r.name}.log").exists())]
    skipped = [r.name for r in ROWS if r.root and r not in rows and args.only is None]
    absent = [r.name for r in rows if r.command[0].endswith(".py")
              and not (REPO / r.command[0]).exists()]
    rows = [r for r in rows if r.name not in absent]
    print(f"commit {commit()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f} at the "
          f"start; {len(rows)} benches, one at a time", flush=True)
    table: list[tuple[str, str, str, str]] = []
    ok = True
    for row in rows:
        got, worked = run(row, args.logs, args.reparse)
        ok &= worked
        table += got
        for what, _, measured, target in got:
            print(f"- {row.name}: {what}: {measured}" + (f" | target {target}" if target else ""),
                  flush=True)
    print()
    print("| what | command | measured | target |\n| --- | --- | --- | --- |")
    for what, command, measured, target in table:
        shown = f"`{command}`" if command != "same run" else command
        print(f"| {cell(what)} | {shown} | {cell(measured)} | {cell(target) or '—'} |")
    missed = [w for w, _, _, t in table if "NOT met" in t or "not met" in t]
    print(f"\ntargets missed: {'; '.join(missed) if missed else 'none'}")
    if skipped:
        print(f"not rerun (need root and the real cluster; --root): {', '.join(skipped)}")
    if absent:
        print(f"not in this checkout: {', '.join(absent)}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
