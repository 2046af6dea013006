"""Load against `muster serve` vs. a no-op aiohttp TLS webhook: same machine, run and client.

    .venv/bin/python bench/bench_serve.py [--duration 8] [--connections 50] [--client auto]

Both servers run as their own processes with the same certificate; the client is `wrk` when it
is installed (a C client, so the client's own CPU cost distorts less), else an aiohttp client;
both keep 50 connections open, as kube-apiserver does. The request is the real captured MPI worker
AdmissionReview. `muster serve` runs against the API server emulator (MPIJob present, so the
decision includes the owner lookup and the PodGroup check from its caches) with the shipped
example policies plus 40 generated ones that do not match. The no-op parses the JSON and answers
allowed:true with the uid, the least any correct webhook does; with `--noop-parser msgspec` it
reads only apiVersion and uid with msgspec and encodes with it, the cheapest there is (muster
uses msgspec for both too, so this shows what is left of muster's own cost). Rounds alternate
(no-op, muster, no-op, muster, ...) so that drift on a shared machine hits both; each muster
round is compared with the no-op round just before it and the median of those ratios is
reported.
Targets (issue 3): throughput >= 75 % of the no-op, p99 latency <= 1.5x the no-op.
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

import aiohttp
import msgspec
from aiohttp import web

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from webhook.admission.tls import server_context  # noqa: E402
from webhook.certs import generate_ca, issue_serving_cert, write_pair  # noqa: E402

FIXTURES = REPO.parent / "shared" / "fixtures"
JOB = "tensorflow-topo-4-vgg16"
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
    # context, runner without access log, listen backlog.
    app = web.Application(client_max_size=8 * 1024 * 1024)
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

_WRK_LUA = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = io.open("{body}", "rb")
wrk.body = f:read("*a")
f:close()
"""


def _ms(text: str) -> float:
    m = re.match(r"([\d.]+)(us|ms|s)", text)
    if m is None:
        raise ValueError(f"unexpected wrk latency {text!r}")
    return float(m[1]) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[m[2]]


def run_wrk(url: str, body_file: Path, connections: int, duration: float,
            work: Path) -> Result:
    lua = work / "post.lua"
    lua.write_text(_WRK_LUA.format(body=body_file))
    out = subprocess.run(
        ["wrk", "-t2", f"-c{connections}", f"-d{int(duration)}s", "--latency", "-s", str(lua),
         url], capture_output=True, text=True, check=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out)[1])  # type: ignore[index]
    p50 = _ms(re.search(r"\s50%\s+(\S+)", out)[1])  # type: ignore[index]
    p99 = _ms(re.search(r"\s99%\s+(\S+)", out)[1])  # type: ignore[index]
    errors = 0
    if m := re.search(r"Non-2xx or 3xx responses: (\d+)", out):
        errors += int(m[1])
    if m := re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)",
                      out):
        errors += sum(int(x) for x in m.groups())
    return Result(rps, p50, p99, errors)


async def _aiohttp_load(url: str, body: bytes, connections: int, duration: float,
                        cafile: Path) -> Result:
    ctx = ssl.create_default_context(cafile=str(cafile))
    latencies: list[float] = []
    errors = 0
    conn = aiohttp.TCPConnector(ssl=ctx, limit=connections)
    async with aiohttp.ClientSession(connector=conn) as session:
        end = time.perf_counter() + duration

        async def worker() -> None:
            nonlocal errors
            while time.perf_counter() < end:
                start = time.perf_counter()
                try:
                    async with session.post(url, data=body, headers={
                            "Content-Type": "application/json"}) as resp:
                        await resp.read()
                        ok = resp.status == 200
                except aiohttp.ClientError:
                    ok = False
                latencies.append(time.perf_counter() - start)
                errors += not ok

        begin = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(connections)))
        elapsed = time.perf_counter() - begin
    qs = statistics.quantiles(latencies, n=100)
    return Result(len(latencies) / elapsed, qs[49] * 1000, qs[98] * 1000, errors)


# --- processes -------------------------------------------------------------------------------

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
    """The API server emulator as a process, seeded with namespace team-a and the MPIJob."""
    kubeconfig = work / "kubeconfig"
    seed = work / "seed.yaml"
    seed.write_text("apiVersion: v1\nkind: Namespace\nmetadata: {name: team-a}\n---\n"
                    + (FIXTURES / "jobs" / "mpijob-vgg16-4workers.yaml").read_text())
    cmd = [sys.executable, "-m", "webhook.doubles.emulator", "--port", str(free_port()),
           "--kubeconfig", str(kubeconfig), "--crds", str(REPO.parent / "shared" / "crds"),
           "--seed", str(seed), "--log-level", "warning"]
    return cmd, kubeconfig


def owned_review(kubeconfig: Path) -> bytes:
    """The captured worker request, its ownerReference pointing at the emulator's MPIJob."""
    import urllib.request  # noqa: PLC0415

    import yaml  # noqa: PLC0415

    server = yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    url = f"{server}/apis/kubeflow.org/v2beta1/namespaces/team-a/mpijobs/{JOB}"
    with urllib.request.urlopen(url, timeout=5) as resp:
        job = json.loads(resp.read())
    review = json.loads((FIXTURES / "admission" / "pod-create-worker.json").read_text())
    review["request"]["object"]["metadata"]["ownerReferences"][0]["uid"] = job["metadata"]["uid"]
    return json.dumps(review).encode()


def plain_review(raw: bytes) -> bytes:
    review = json.loads(raw)
    meta = review["request"]["object"]["metadata"]
    meta["labels"] = {"app": "web"}
    meta.pop("ownerReferences", None)
    return json.dumps(review).encode()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--connections", type=int, default=50)
    parser.add_argument("--client", choices=["auto", "wrk", "aiohttp"], default="auto")
    parser.add_argument("--request", choices=["worker", "plain"], default="worker",
                        help="worker: the captured MPI worker (gang, PodGroup check, patch); "
                             "plain: the same pod without owner or MPI labels (no policy "
                             "matches: the server's own cost without the decision)")
    parser.add_argument("--no-cluster", action="store_true",
                        help="run muster serve without the emulator (no owner/PodGroup work)")
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
    client = args.client
    if client == "auto":
        client = "wrk" if shutil.which("wrk") else "aiohttp"

    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        work = Path(tmp)
        cafile = local_tls(work)
        policies = work / "policies"
        shutil.copytree(REPO / "policies", policies,
                        ignore=shutil.ignore_patterns("tests", "*.md"))
        for i in range(40):
            (policies / f"generated-{i:02d}.yaml").write_text(EXTRA_POLICY.format(i=i))
        body_file = work / "review.json"
        body_file.write_bytes((FIXTURES / "admission" / "pod-create-worker.json").read_bytes())
        emulator = None if args.no_cluster else emulator_cmd(work)
        muster_port, noop_port = free_port(), free_port()
        serve_cmd = [sys.executable, "-m", "webhook", "--log-level", "warning", "serve",
                     "--host", "127.0.0.1", "--port", str(muster_port),
                     "--policies", str(policies), "--tls-cert-file", str(work / "tls.crt"),
                     "--tls-key-file", str(work / "tls.key")]
        noop_cmd = [sys.executable, __file__, "--noop-server", str(noop_port),
                    str(work / "tls.crt"), str(work / "tls.key"), args.noop_parser]
        with contextmanager_chain(emulator, work) as kubeconfig:
            if kubeconfig is not None:
                serve_cmd += ["--kubeconfig", str(kubeconfig)]
                body_file.write_bytes(owned_review(kubeconfig))
            if args.request == "plain":
                body_file.write_bytes(plain_review(body_file.read_bytes()))
            body = body_file.read_bytes()
            with process(serve_cmd, work / "serve.log") as serve, \
                    process(noop_cmd, work / "noop.log") as noop:
                targets = {"no-op": (f"https://127.0.0.1:{noop_port}", noop, "noop.log"),
                           "muster": (f"https://127.0.0.1:{muster_port}", serve, "serve.log")}
                for url, proc, log in targets.values():
                    wait_ready(url, cafile, proc, work / log)
                results: dict[str, list[Result]] = {"no-op": [], "muster": []}
                for round_no in range(args.rounds + 1):  # round 0 warms both up
                    for name, (url, _, _) in targets.items():
                        target = f"{url}/mutate/pods?timeout=10s"
                        duration = 2.0 if round_no == 0 else args.duration
                        if client == "wrk":
                            res = run_wrk(target, body_file, args.connections, duration, work)
                        else:
                            res = asyncio.run(_aiohttp_load(target, body, args.connections,
                                                            duration, cafile))
                        if round_no:
                            results[name].append(res)
                            print(f"round {round_no} {name:7s} {res.rps:8.0f} req/s  "
                                  f"p50 {res.p50_ms:7.2f} ms  p99 {res.p99_ms:7.2f} ms  "
                                  f"errors {res.errors}", flush=True)
        print(f"request: {args.request}, no-op parser: {args.noop_parser}")
        report(results, client, args.connections, emulator is not None)
    return 0


@contextmanager
def contextmanager_chain(emulator: tuple[list[str], Path] | None,
                         work: Path) -> Iterator[Path | None]:
    if emulator is None:
        yield None
        return
    cmd, kubeconfig = emulator
    with process(cmd, work / "emulator.log") as proc:
        deadline = time.monotonic() + 30
        while not kubeconfig.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"emulator failed:\n{(work / 'emulator.log').read_text()}")
            time.sleep(0.1)
        yield kubeconfig


def report(results: dict[str, list[Result]], client: str, connections: int,
           cluster: bool) -> None:
    """Each round's muster run is compared with the no-op run just before it (paired rounds);
    the median of the per-round ratios is the figure, robust to a neighbour's burst of CPU."""
    noop, muster = results["no-op"], results["muster"]
    rps_ratio = statistics.median(m.rps / n.rps for n, m in zip(noop, muster, strict=True))
    p99_ratio = statistics.median(m.p99_ms / n.p99_ms for n, m in zip(noop, muster, strict=True))
    p50_ratio = statistics.median(m.p50_ms / n.p50_ms for n, m in zip(noop, muster, strict=True))
    print()
    print(f"client {client}, {connections} connections, cpus {os.cpu_count()}, "
          f"muster with {'emulator (owner + PodGroup caches)' if cluster else 'no cluster'}, "
          f"{len(noop)} paired rounds")
    for name, rs in (("no-op", noop), ("muster", muster)):
        print(f"{name:7s} median {statistics.median(r.rps for r in rs):8.0f} req/s  "
              f"p50 {statistics.median(r.p50_ms for r in rs):6.2f} ms  "
              f"p99 {statistics.median(r.p99_ms for r in rs):6.2f} ms  "
              f"errors {sum(r.errors for r in rs)}")
    print(f"throughput ratio {rps_ratio:.2f} (target >= 0.75: "
          f"{'met' if rps_ratio >= 0.75 else 'NOT met'})")
    print(f"p99 ratio        {p99_ratio:.2f} (target <= 1.5: "
          f"{'met' if p99_ratio <= 1.5 else 'NOT met'})")
    print(f"p50 ratio        {p50_ratio:.2f}")
    if client == "aiohttp":
        print("note: the Python client can saturate before the servers on few cores (then both "
              "show its rate); install wrk for figures")


if __name__ == "__main__":
    sys.exit(main())
