"""Load against `muster serve` vs. a no-op aiohttp TLS webhook: same machine, run, client, requests.

    .venv/bin/python bench/bench_serve.py [--duration 5] [--rounds 5] [--request mix|hit|miss|plain]

Both servers run as their own processes with the same certificate; the client is `wrk` (a C
client, so the client's own CPU cost distorts less; Debian package `wrk`), keeping 50 connections
open as kube-apiserver does. `muster serve` runs against the API server emulator with the shipped
example policies plus 40 generated ones that do not match. The requests are the real captured MPI
worker AdmissionReview with the names, owner and request uid filled in per request (a wrk Lua
script), for MPIJobs created in the emulator beforehand:

- `mix` (the headline): the worker pods of many jobs, one job after another, job sizes drawn from
  a realistic mix (1, 2, 2, 4, 4, 4, 8, 8, 16 or 32 workers: 8.1 on average). A job's first pod
  misses the outcome memo (muster reads the MPIJob, decides afresh and creates the PodGroup); its
  other pods hit it. No job is sent twice unless the bench says it wrapped around.
- `hit`: the 32 workers of one job, over and over: every pod after the first hits the memo.
- `miss`: every pod is the first of a job never seen: owner read, decision, PodGroup create.
- `plain`: a pod outside any job (no owner, no policy matches), evaluated afresh each time.

Without --request the bench runs mix, hit and miss in that order against the same servers. The
no-op parses the JSON and answers allowed:true with the uid, the least any correct webhook does;
with `--noop-parser msgspec` it reads only apiVersion and uid with msgspec and encodes with it,
the cheapest there is. Rounds alternate (no-op, muster, no-op, muster, ...) over the same request
sequence so that drift on a shared machine hits both; each muster round is compared with the no-op
round just before it and the median of those ratios is reported.
Targets (issue 3): throughput >= 75 % of the no-op, p99 latency <= 1.5x the no-op.

Muster answers a fail-open, a denial and a missed deadline with HTTP 200 too, so after each of
its runs the bench reads its /metrics and checks what the answers were: every request patched
(`plain`: allowed), none failed open, and one PodGroup created per job sent (less at most the
requests in flight when wrk stopped). It fails, with what differed, when the work did not
happen. Each round's line shows the CPU per request of the server and of the emulator, and the
PodGroups in the webhook's cache, so that a cost that grows with the objects in the cluster
shows up round by round.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import msgspec
import yaml
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from webhook.admission.tls import server_context  # noqa: E402
from webhook.certs import generate_ca, issue_serving_cert, write_pair  # noqa: E402
from webhook.demo import EXAMPLE_POLICIES  # noqa: E402

FIXTURES = REPO.parent / "shared" / "fixtures"
EXTRA_POLICY = """\
apiVersion: muster.io/v1alpha1
kind: SchedulingPolicy
metadata: {{name: generated-{i}}}
spec:
  match:
    namespaces: [other-{i}]
    podSelector: {{matchLabels: {{app: svc-{i}}}}}
  labels: {{generated: "p{i}"}}
"""


@dataclass
class Result:
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int
    requests: int = 0
    #: jobs whose first pod was sent (mix, miss): each should get its PodGroup
    jobs: int = 0
    #: CPU seconds the server process, and the emulator, used during the run
    server_cpu_s: float = 0.0
    emulator_cpu_s: float = 0.0


def cpu_seconds(pid: int) -> float:
    """user + system time of a process so far (/proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def local_tls(work: Path) -> Path:
    """A one-day CA and a serving pair for 127.0.0.1 in `work` (tls.crt, tls.key); the CA file."""
    ca = generate_ca("bench-ca", days=1)
    write_pair(issue_serving_cert(ca, ["localhost"], ["127.0.0.1"], days=1),
               work / "tls.crt", work / "tls.key")
    cafile = work / "ca.crt"
    cafile.write_bytes(ca.cert_pem)
    return cafile


# --- the no-op webhook (run as `bench_serve.py --noop-server PORT CERT KEY`) -------------------

class _Request(msgspec.Struct):
    uid: str


class _Review(msgspec.Struct, rename="camel"):
    api_version: str
    request: _Request


def noop_server(port: int, cert: str, key: str, parser: str, patch: str | None = None) -> None:
    """`patch` (base64 JSON Patch): answer it unchanged to every request, the static-patch
    baseline of bench_apiserver.py."""
    decode = msgspec.json.Decoder(_Review).decode
    patched = {"patchType": "JSONPatch", "patch": patch} if patch else {}

    async def mutate(request: web.Request) -> web.Response:
        raw = await request.read()
        if parser == "msgspec":  # the fastest parse there is: two fields, the rest skipped
            review = decode(raw)
            api_version, uid = review.api_version, review.request.uid
        else:
            doc = json.loads(raw)
            api_version, uid = doc["apiVersion"], doc["request"]["uid"]
        body = {"apiVersion": api_version, "kind": "AdmissionReview",
                "response": {"uid": uid, "allowed": True, **patched}}
        encoded = msgspec.json.encode(body) if parser == "msgspec" else json.dumps(body).encode()
        return web.Response(body=encoded, content_type="application/json")

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    # The same server settings as `muster serve` (webhook.admission.server): body limit, TLS
    # context, runner without access log, listen backlog. (muster also counts connections and
    # starts TLS itself, webhook.admission.limits: that is part of what is measured.)
    app = web.Application(client_max_size=3 * 1024 * 1024)
    app.router.add_post("/mutate/pods", mutate)
    app.router.add_get("/readyz", healthz)
    ctx = server_context()
    ctx.load_cert_chain(cert, key)

    async def serve() -> None:
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port, ssl_context=ctx, backlog=1024).start()
        await asyncio.Event().wait()  # until the bench terminates the process

    asyncio.run(serve())


# --- clients -------------------------------------------------------------------------------

#: wrk's Lua: one request body per call, from a template of the captured worker request.
#: Arguments after `--`: mode, template file, uids file (one MPIJob uid per line, job j on line
#: j+1), first job, job sizes (comma-separated), threads. Each thread walks its own jobs
#: (first + tid, + threads, ...); `done` prints the last job sent and whether any wrapped.
_WRK_LUA = """
local threads = {}

function setup(thread)
  thread:set("tid", #threads)
  table.insert(threads, thread)
end

function init(args)
  mode = args[1]
  local f = io.open(args[2], "rb")
  template = f:read("*a")
  f:close()
  uids = {}
  for line in io.lines(args[3]) do uids[#uids + 1] = line end
  sizes = {}
  for n in string.gmatch(args[5], "%d+") do sizes[#sizes + 1] = tonumber(n) end
  nthreads = tonumber(args[6])
  job = tonumber(args[4]) + (mode == "hit" and 0 or tid)
  pos, counter, last, wrapped, started = 0, 0, job, 0, 0
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
end

local function workers(j) return sizes[(j * 7) % #sizes + 1] end

function request()
  counter = counter + 1
  local j, p = job, pos
  if mode == "hit" then
    p = counter % workers(j)
  elseif mode == "miss" then
    job = job + nthreads
  else
    pos = pos + 1
    if pos >= workers(j) then pos, job = 0, job + nthreads end
  end
  if p == 0 and mode ~= "hit" then started = started + 1 end
  if j >= #uids then wrapped = 1 end
  if j > last then last = j end
  local name = "mix-" .. (j % #uids)
  local body = string.gsub(template, "@(%u+)@", {
    JOB = name, UID = uids[(j % #uids) + 1], POD = name .. "-worker-" .. p,
    IDX = tostring(p), REQ = tid .. "-" .. counter})
  return wrk.format(nil, nil, nil, body)
end

function done(summary, latency, requests)
  local used, wrap, jobs = 0, 0, 0
  for _, t in ipairs(threads) do
    used = math.max(used, t:get("last"))
    wrap = math.max(wrap, t:get("wrapped"))
    jobs = jobs + t:get("started")
  end
  io.write(string.format("JOBS_LAST %d WRAPPED %d STARTED %d\\n", used, wrap, jobs))
end
"""

#: workers per MPIJob in the mix; job j has SIZES[(7 j) % 10] (the Lua script's rule)
SIZES = (1, 2, 2, 4, 4, 4, 8, 8, 16, 32)
THREADS = 2


def job_size(j: int) -> int:
    return SIZES[(j * 7) % len(SIZES)]


@dataclass
class Load:
    """What one wrk run sends: a mode of the Lua script from a first job, or one fixed body."""

    mode: str  # mix | hit | miss | plain
    first: int = 0


def _ms(text: str) -> float:
    m = re.match(r"([\d.]+)(us|ms|s)", text)
    if m is None:
        raise ValueError(f"unexpected wrk latency {text!r}")
    return float(m[1]) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[m[2]]


def run_wrk(url: str, load: Load, connections: int, duration: float,
            work: Path) -> tuple[Result, int, bool]:
    """The run's figures, the last job it sent and whether it wrapped around the jobs."""
    lua = work / "requests.lua"
    lua.write_text(_WRK_LUA)
    mode = "hit" if load.mode == "plain" else load.mode  # plain: one fixed body, job unused
    template = work / ("plain.json" if load.mode == "plain" else "template.json")
    out = subprocess.run(
        ["wrk", f"-t{THREADS}", f"-c{connections}", f"-d{int(duration)}s", "--latency",
         "-s", str(lua), url, "--", mode, str(template), str(work / "uids.txt"), str(load.first),
         ",".join(map(str, SIZES)), str(THREADS)],
        capture_output=True, text=True, check=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out)[1])  # type: ignore[index]
    p50 = _ms(re.search(r"\s50%\s+(\S+)", out)[1])  # type: ignore[index]
    p99 = _ms(re.search(r"\s99%\s+(\S+)", out)[1])  # type: ignore[index]
    errors = 0
    if m := re.search(r"Non-2xx or 3xx responses: (\d+)", out):
        errors += int(m[1])
    if m := re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)",
                      out):
        errors += sum(int(x) for x in m.groups())
    jobs = re.search(r"JOBS_LAST (\d+) WRAPPED (\d) STARTED (\d+)", out)
    sent = re.search(r"(\d+) requests in", out)
    assert jobs is not None and sent is not None, out
    return Result(rps, p50, p99, errors, int(sent[1]), int(jobs[3])), int(jobs[1]), jobs[2] == "1"


@contextmanager
def process(cmd: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_ready(url: str, cafile: Path, proc: subprocess.Popen[bytes], log: Path,
               within: float = 60.0) -> None:
    ctx = ssl.create_default_context(cafile=str(cafile))
    import urllib.request  # noqa: PLC0415

    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{url} exited:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/readyz", context=ctx, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} not ready in {within}s:\n{log.read_text()[-3000:]}")


def emulator_cmd(work: Path) -> tuple[list[str], Path]:
    """The API server emulator as a process, with namespace team-a and the Volcano queues the
    jobs and the policies name, Open (a missing queue would make every pod an Event)."""
    kubeconfig = work / "kubeconfig"
    seed = work / "seed.yaml"
    seed.write_text("apiVersion: v1\nkind: Namespace\nmetadata: {name: team-a}\n" + "".join(
        f"---\napiVersion: scheduling.volcano.sh/v1beta1\nkind: Queue\nmetadata: {{name: {q}}}\n"
        "spec: {weight: 1}\nstatus: {state: Open}\n" for q in ("default", "research", "training")))
    cmd = [sys.executable, "-m", "webhook.doubles.emulator", "--port", str(free_port()),
           "--kubeconfig", str(kubeconfig), "--crds", str(REPO.parent / "shared" / "crds"),
           "--seed", str(seed), "--log-level", "warning"]
    return cmd, kubeconfig


async def create_jobs(kubeconfig: Path, count: int) -> list[str]:
    """MPIJobs mix-0 .. mix-<count-1> (the fixture's job, SIZES workers each); their uids."""
    from webhook.kube import MPIJOBS, KubeApi, make_api_client  # noqa: PLC0415

    base = yaml.safe_load((FIXTURES / "jobs" / "mpijob-vgg16-4workers.yaml").read_text())
    client = await make_api_client(str(kubeconfig))
    kube = KubeApi(client)
    uids = [""] * count
    sem = asyncio.Semaphore(32)

    async def one(j: int) -> None:
        job = json.loads(json.dumps(base))
        job["metadata"]["name"] = f"mix-{j}"
        job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] = job_size(j)
        async with sem:
            made = await kube.create(MPIJOBS, job, namespace="team-a")
        uids[j] = made["metadata"]["uid"]

    try:
        await asyncio.gather(*(one(j) for j in range(count)))
    finally:
        await client.close()
    return uids


def worker_template() -> str:
    """The captured worker request with @JOB@, @UID@, @POD@, @IDX@ and @REQ@ to fill in."""
    review = json.loads((FIXTURES / "admission" / "pod-create-worker.json").read_text())
    req = review["request"]
    req["uid"], req["name"] = "@REQ@", "@POD@"
    meta = req["object"]["metadata"]
    meta["name"] = "@POD@"
    meta["labels"]["training.kubeflow.org/job-name"] = "@JOB@"
    meta["labels"]["training.kubeflow.org/replica-index"] = "@IDX@"
    owner = meta["ownerReferences"][0]
    owner["name"], owner["uid"] = "@JOB@", "@UID@"
    meta.pop("managedFields", None)  # it names the captured owner's uid
    return json.dumps(review)


def plain_review() -> str:
    """The captured worker without owner or MPI labels: no policy matches (fixed body)."""
    review = json.loads((FIXTURES / "admission" / "pod-create-worker.json").read_text())
    meta = review["request"]["object"]["metadata"]
    meta["labels"] = {"app": "web"}
    meta.pop("ownerReferences", None)
    meta.pop("managedFields", None)
    return json.dumps(review)


def scrape(url: str) -> dict[str, float]:
    """Muster's counters this bench checks, from its /metrics: requests by outcome, fail-opens,
    PodGroup writes by result, and the PodGroups it has cached."""
    import urllib.request  # noqa: PLC0415

    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    names = {"muster_admission_requests_total": "outcome",
             "muster_admission_fail_open_total": "reason",
             "muster_podgroup_writes_total": "result"}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in names:
                key = f"{sample.name}:{sample.labels[names[sample.name]]}"
                out[key] = out.get(key, 0.0) + sample.value
            elif sample.name == "muster_cache_objects" and \
                    sample.labels.get("cache") == "podgroups":
                out["podgroups cached"] = sample.value
    return out


def check_outcomes(case: str, res: Result, before: dict[str, float], after: dict[str, float],
                   connections: int) -> list[str]:
    """What Muster's answers during one run were not, read from its counters' deltas."""
    delta = {k: v - before.get(k, 0.0) for k, v in after.items() if k != "podgroups cached"}
    expected = "allowed" if case == "plain" else "patched"
    answered = delta.get(f"muster_admission_requests_total:{expected}", 0.0)
    other = {k.split(":")[1]: v for k, v in delta.items() if v and k.startswith(
        "muster_admission_requests_total:") and not k.endswith((f":{expected}", ":disconnected"))}
    fail_open = {k.split(":")[1]: v for k, v in delta.items()
                 if v and k.startswith("muster_admission_fail_open_total:")}
    created = delta.get("muster_podgroup_writes_total:created", 0.0)
    errors = delta.get("muster_podgroup_writes_total:error", 0.0)
    problems = []
    if answered < res.requests:
        problems.append(f"{answered:.0f} requests {expected}, of {res.requests} wrk saw answered")
    if other:
        problems.append(f"other outcomes {other}")
    if fail_open:
        problems.append(f"failed open {fail_open}")
    if errors:
        problems.append(f"{errors:.0f} PodGroup writes failed")
    # a job's first pod still in flight when wrk stopped may not have reached the server
    low, high = (max(res.jobs - connections, 0), res.jobs) if case in ("mix", "miss") else (0, 1)
    if not low <= created <= high:
        problems.append(f"{created:.0f} PodGroups created for {res.jobs} jobs sent")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--connections", type=int, default=50)
    parser.add_argument("--request", choices=["mix", "hit", "miss", "plain"], action="append",
                        help="which requests (repeatable; default: mix, hit, miss)")
    parser.add_argument("--jobs", type=int, default=30000,
                        help="MPIJobs created in the emulator for mix and miss")
    parser.add_argument("--noop-parser", choices=["json", "msgspec"], default="json",
                        help="how the no-op reads and answers: json (the plain webhook), or "
                             "msgspec decoding only apiVersion and uid (the cheapest possible)")
    parser.add_argument("--noop-patch", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--noop-server", nargs=4, metavar=("PORT", "CERT", "KEY", "PARSER"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.noop_server:
        port, cert, key, parser_name = args.noop_server
        noop_server(int(port), cert, key, parser_name,
                    patch=args.noop_patch.read_text().strip() if args.noop_patch else None)
        return 0
    if shutil.which("wrk") is None:
        raise SystemExit("bench_serve needs wrk (Debian/Ubuntu: apt-get install wrk)")
    cases = args.request or ["mix", "hit", "miss"]
    everything_failed: list[str] = []

    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        work = Path(tmp)
        cafile = local_tls(work)
        policies = work / "policies"
        shutil.copytree(EXAMPLE_POLICIES, policies,
                        ignore=shutil.ignore_patterns("tests", "*.md"))
        for i in range(40):
            (policies / f"generated-{i:02d}.yaml").write_text(EXTRA_POLICY.format(i=i))
        (work / "template.json").write_text(worker_template())
        (work / "plain.json").write_text(plain_review())
        emulator, kubeconfig_path = emulator_cmd(work)
        muster_port, noop_port, metrics_port = free_port(), free_port(), free_port()
        metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        serve_cmd = [sys.executable, "-m", "webhook", "--log-level", "warning", "serve",
                     "--host", "127.0.0.1", "--port", str(muster_port),
                     "--policies", str(policies), "--tls-cert-file", str(work / "tls.crt"),
                     "--tls-key-file", str(work / "tls.key"), "--kubeconfig", str(kubeconfig_path),
                     "--metrics-host", "127.0.0.1", "--metrics-port", str(metrics_port)]
        noop_cmd = [sys.executable, __file__, "--noop-server", str(noop_port),
                    str(work / "tls.crt"), str(work / "tls.key"), args.noop_parser]
        with process(emulator, work / "emulator.log") as emu:
            wait_kubeconfig(kubeconfig_path, emu, work / "emulator.log")
            started = time.monotonic()
            uids = asyncio.run(create_jobs(kubeconfig_path, args.jobs))
            (work / "uids.txt").write_text("\n".join(uids) + "\n")
            print(f"{args.jobs} MPIJobs created in {time.monotonic() - started:.0f} s",
                  flush=True)
            with process(serve_cmd, work / "serve.log") as serve, \
                    process(noop_cmd, work / "noop.log") as noop:
                targets = {"no-op": (f"https://127.0.0.1:{noop_port}", noop, "noop.log"),
                           "muster": (f"https://127.0.0.1:{muster_port}", serve, "serve.log")}
                for url, proc, log in targets.values():
                    wait_ready(url, cafile, proc, work / log)
                hit_job = next(j for j in range(len(SIZES)) if job_size(j) == max(SIZES))
                first = len(SIZES)  # jobs below are the hit case's
                for case in cases:
                    results: dict[str, list[Result]] = {"no-op": [], "muster": []}
                    failed: list[str] = []
                    wrapped = False
                    for round_no in range(args.rounds + 1):  # round 0 warms both up
                        load = Load(case, hit_job if case == "hit" else first)
                        last = first
                        for name, (url, proc, _) in targets.items():
                            counters = scrape(metrics_url) if name == "muster" else {}
                            cpu0 = cpu_seconds(proc.pid), cpu_seconds(emu.pid)
                            res, used, wrap = run_wrk(
                                f"{url}/mutate/pods?timeout=10s", load, args.connections,
                                2.0 if round_no == 0 else args.duration, work)
                            res.server_cpu_s = cpu_seconds(proc.pid) - cpu0[0]
                            res.emulator_cpu_s = cpu_seconds(emu.pid) - cpu0[1]
                            extra = ""
                            if name == "muster":  # the no-op is sent the same jobs
                                last, wrapped = max(last, used), wrapped or wrap
                                after = scrape(metrics_url)
                                failed += (f"{case} round {round_no}: {why}" for why in
                                           check_outcomes(case, res, counters, after,
                                                          args.connections))
                                extra = f"  PodGroups cached {after['podgroups cached']:.0f}"
                            if round_no:
                                results[name].append(res)
                                print(f"{case} round {round_no} {name:7s} {res.rps:8.0f} req/s  "
                                      f"p50 {res.p50_ms:7.2f} ms  p99 {res.p99_ms:7.2f} ms  "
                                      f"errors {res.errors}  CPU/request server "
                                      f"{res.server_cpu_s / res.requests * 1e6:5.0f} us, "
                                      f"emulator {res.emulator_cpu_s / res.requests * 1e6:5.0f}"
                                      f" us{extra}", flush=True)
                        if case in ("mix", "miss"):
                            first = last + THREADS  # the next round sends jobs never seen
                    report(case, results, args, wrapped)
                    for why in failed:
                        print(f"FAILED: {why}", flush=True)
                    everything_failed += failed
    return 1 if everything_failed else 0


def wait_kubeconfig(kubeconfig: Path, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 120  # a busy shared machine starts it slowly
    while not kubeconfig.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"emulator failed:\n{log.read_text()}")
        time.sleep(0.1)


def report(case: str, results: dict[str, list[Result]], args: argparse.Namespace,
           wrapped: bool) -> None:
    """Each round's muster run is compared with the no-op run just before it (paired rounds);
    the median of the per-round ratios is the figure, robust to a neighbour's burst of CPU."""
    noop, muster = results["no-op"], results["muster"]
    rps_ratio = statistics.median(m.rps / n.rps for n, m in zip(noop, muster, strict=True))
    p99_ratio = statistics.median(m.p99_ms / n.p99_ms for n, m in zip(noop, muster, strict=True))
    p50_ratio = statistics.median(m.p50_ms / n.p50_ms for n, m in zip(noop, muster, strict=True))
    print(f"\n{case}: wrk, {args.connections} connections, cpus {os.cpu_count()}, no-op parser "
          f"{args.noop_parser}, {len(noop)} paired rounds"
          + ("; JOBS WRAPPED AROUND: raise --jobs" if wrapped else ""))
    for name, rs in (("no-op", noop), ("muster", muster)):
        print(f"  {name:7s} median {statistics.median(r.rps for r in rs):8.0f} req/s  "
              f"p50 {statistics.median(r.p50_ms for r in rs):6.2f} ms  "
              f"p99 {statistics.median(r.p99_ms for r in rs):6.2f} ms  "
              f"errors {sum(r.errors for r in rs)}  CPU per request: server "
              f"{statistics.median(r.server_cpu_s / r.requests for r in rs) * 1e6:5.0f} us, "
              f"emulator {statistics.median(r.emulator_cpu_s / r.requests for r in rs) * 1e6:5.0f}"
              " us")
    print(f"  throughput ratio {rps_ratio:.2f} (target >= 0.75: "
          f"{'met' if rps_ratio >= 0.75 else 'NOT met'})")
    print(f"  p99 ratio        {p99_ratio:.2f} (target <= 1.5: "
          f"{'met' if p99_ratio <= 1.5 else 'NOT met'})")
    print(f"  p50 ratio        {p50_ratio:.2f}\n", flush=True)


if __name__ == "__main__":
    sys.exit(main())
