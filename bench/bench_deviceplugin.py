"""The device plugin's part in starting a GPU pod, over real gRPC on unix sockets, per pod.

    .venv/bin/python bench/bench_deviceplugin.py [--pods 400] [--rounds 5] [--restarts 3]

A fake kubelet (webhook.doubles.fakekubelet: the kubelet device manager's protocol) in this process
admits pods one container of 1 GPU at a time, as the kubelet does: GetPreferredAllocation, then
Allocate. Two plugins, each in its own process and registered with its own fake kubelet:

- `muster`: `muster agent` (node type dgx1-v100) against the API server emulator (its own
  process). Each pod is bound to the node with the binder's `muster.io/gpu-assignment`; the
  plugin lists the node's pods to find the pod being started (one field-selected LIST per pod:
  the Allocate takes the answer of the GetPreferredAllocation before it) and marks it served in
  the background, as deployed.
- `bare`: the least a device plugin does: the same gRPC server, devices and answers (the
  kubelet's own pick, NVIDIA_VISIBLE_DEVICES), no API reads. The baseline.

Pods go in batches of 8 (one per GPU); between batches the pods are deleted and the kubelet
forgets its allocations, untimed. Rounds alternate which plugin goes first; per round the ratio
of median admission times, median over rounds. Then the kubelet restarts (`--restarts` times):
the time until the agent has registered again and listed its 8 GPUs (the agent checks the
kubelet's socket once a second).

Every admission's answer is checked: its NVIDIA_VISIBLE_DEVICES names the device the kubelet
recorded, and for the agent a GPU the binder assigned to one of the batch's pods, each once, so
that a batch hands out exactly the binder's choice. The bench fails with the first answer that
does not.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from webhook import keys  # noqa: E402
from webhook.agent.deviceplugin import api_pb2, api_pb2_grpc  # noqa: E402
from webhook.agent.deviceplugin.plugin import (  # noqa: E402
    API_VERSION,
    KUBELET_SOCKET,
    VISIBLE_DEVICES_ENV,
    device_list,
)
from webhook.binder.assignment import encode_assignment, uuids_of  # noqa: E402
from webhook.doubles.fakekubelet import FakeKubelet  # noqa: E402
from webhook.kube import PODS, KubeApi, make_api_client  # noqa: E402
from webhook.topology import ContainerGpus, GpuAssignment, builtin  # noqa: E402

NODE = "node-a"
NS = "bench"
TOPOLOGY = builtin("dgx1-v100")
SEED = f"""\
apiVersion: v1
kind: Namespace
metadata: {{name: {NS}}}
---
apiVersion: v1
kind: Node
metadata: {{name: {NODE}, labels: {{kubernetes.io/hostname: {NODE}}}}}
"""


# --- the bare plugin (run as `bench_deviceplugin.py --bare DIR`) ----------------------------

class _Bare(api_pb2_grpc.DevicePluginServicer):  # type: ignore[misc]
    async def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:
        return api_pb2.DevicePluginOptions(get_preferred_allocation_available=True)

    async def ListAndWatch(self, request: Any, context: Any) -> AsyncIterator[Any]:
        yield api_pb2.ListAndWatchResponse(devices=device_list(TOPOLOGY))
        await asyncio.Event().wait()

    async def GetPreferredAllocation(self, request: Any, context: Any) -> Any:
        return api_pb2.PreferredAllocationResponse(container_responses=[
            api_pb2.ContainerPreferredAllocationResponse(
                deviceIDs=list(r.available_deviceIDs)[:r.allocation_size])
            for r in request.container_requests])

    async def Allocate(self, request: Any, context: Any) -> Any:
        return api_pb2.AllocateResponse(container_responses=[
            api_pb2.ContainerAllocateResponse(envs={VISIBLE_DEVICES_ENV: ",".join(r.devices_ids)})
            for r in request.container_requests])


async def bare_plugin(directory: Path) -> None:
    server = grpc.aio.server()
    api_pb2_grpc.add_DevicePluginServicer_to_server(_Bare(), server)
    server.add_insecure_port(f"unix://{directory / 'bare.sock'}")
    await server.start()
    async with grpc.aio.insecure_channel(f"unix://{directory / KUBELET_SOCKET}") as channel:
        await api_pb2_grpc.RegistrationStub(channel).Register(api_pb2.RegisterRequest(
            version=API_VERSION, endpoint="bare.sock", resource_name=keys.GPU_RESOURCE,
            options=api_pb2.DevicePluginOptions(get_preferred_allocation_available=True)),
            timeout=5)
    await server.wait_for_termination()


# --- processes -------------------------------------------------------------------------------

@contextlib.asynccontextmanager
async def process(*argv: str, log: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(*argv, stdout=out, stderr=out, cwd=REPO)
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()


def _tail(log: Path) -> str:
    return log.read_text()[-3000:]


async def wait_file(path: Path, proc: asyncio.subprocess.Process, log: Path) -> None:
    for _ in range(300):
        if await asyncio.to_thread(path.exists):
            return
        if proc.returncode is not None:
            raise SystemExit(f"{proc.pid} exited:\n{_tail(log)}")
        await asyncio.sleep(0.1)
    raise SystemExit(f"{path} did not appear:\n{_tail(log)}")


# --- the measurement -------------------------------------------------------------------------

def pod(batch: int, gpu: int) -> dict[str, Any]:
    # as the binder names the GPU (the built-in topology has its UUIDs)
    assignment = GpuAssignment(NODE, {"main": ContainerGpus((gpu,), uuids_of(TOPOLOGY, (gpu,)))})
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"w-{batch}-{gpu}", "namespace": NS,
                         "annotations": {keys.ANN_GPU_ASSIGNMENT: encode_assignment(assignment)}},
            # bound by the binder: the agent honours assignments on its pods only
            "spec": {"nodeName": NODE, "schedulerName": keys.DEFAULT_BINDER_SCHEDULER_NAME,
                     "containers": [{"name": "main", "image": "train:1",
                                     "resources": {"limits": {keys.GPU_RESOURCE: "1"}}}]}}


async def admit_batches(kubelet: FakeKubelet, kube: KubeApi | None, pods: int,
                        batch0: int) -> list[float]:
    """Admit `pods` one-GPU pods in batches of 8; seconds per admission (both RPCs). With
    `kube` (the agent), the pods carry the binder's assignments and every answer must name an
    assigned GPU, each once per batch; SystemExit otherwise."""
    times: list[float] = []
    for b in range(batch0, batch0 + pods // TOPOLOGY.size):
        made = [pod(b, i) for i in range(TOPOLOGY.size)]
        if kube is not None:
            for p in made:
                await kube.create(PODS, p, NS)
        assigned = {g.uuid for g in TOPOLOGY.gpus}  # pod(b, i) is assigned GPU i
        for _ in made:
            t0 = time.perf_counter()
            got = await kubelet.admit(keys.GPU_RESOURCE, 1)
            times.append(time.perf_counter() - t0)
            visible = got.envs.get(VISIBLE_DEVICES_ENV, "")
            if visible.split(",") != got.devices:
                raise SystemExit(f"check: {VISIBLE_DEVICES_ENV}={visible!r}, but the kubelet "
                                 f"allocated {got.devices} (batch {b})")
            if kube is not None:
                if visible not in assigned:
                    raise SystemExit(f"check: the agent answered {VISIBLE_DEVICES_ENV}="
                                     f"{visible!r}, not a GPU the binder assigned and not yet "
                                     f"handed out in batch {b}")
                assigned.discard(visible)
        if kube is not None:
            for p in made:
                await kube.delete(PODS, p["metadata"]["name"], NS)
        kubelet.checkpoint.allocated.clear()  # the pods ended: the kubelet frees their devices
    return times


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run(args: argparse.Namespace, work: Path) -> None:
    seed = work / "seed.yaml"
    seed.write_text(SEED)
    kubeconfig = work / "kubeconfig"
    dirs = {name: work / name for name in ("muster", "bare")}
    kubelets = {name: FakeKubelet(d) for name, d in dirs.items()}
    for k in kubelets.values():
        await k.start()
    py = sys.executable
    async with process(py, "-m", "webhook.doubles.emulator", "--kubeconfig", str(kubeconfig),
                       "--seed", str(seed), "--log-level", "warning",
                       log=work / "emulator.log") as emulator:
        await wait_file(kubeconfig, emulator, work / "emulator.log")
        async with process(py, "-m", "webhook", "--log-level", "warning", "agent",
                           "--node-name", NODE, "--kubeconfig", str(kubeconfig),
                           "--kubelet-dir", str(dirs["muster"]), "--node-type", "dgx1-v100",
                           log=work / "agent.log"), \
                process(py, __file__, "--bare", str(dirs["bare"]), log=work / "bare.log"):
            for k in kubelets.values():
                await k.wait_for(keys.GPU_RESOURCE, count=TOPOLOGY.size, within=60)
            client = await make_api_client(str(kubeconfig))
            kube = KubeApi(client)
            try:
                await measure(args, kubelets, kube)
                await restarts(args, kubelets["muster"])
            finally:
                await client.close()
    for k in kubelets.values():
        await k.stop()


async def measure(args: argparse.Namespace, kubelets: dict[str, FakeKubelet],
                  kube: KubeApi) -> None:
    seen: dict[str, list[list[float]]] = {"bare": [], "muster": []}
    batch = 0
    await admit_batches(kubelets["muster"], kube, 16, 10_000)  # warm-up: imports, connections
    await admit_batches(kubelets["bare"], None, 16, 10_000)
    for r in range(args.rounds):
        for name in (["bare", "muster"] if r % 2 == 0 else ["muster", "bare"]):
            times = await admit_batches(kubelets[name], kube if name == "muster" else None,
                                        args.pods, batch)
            batch += args.pods // TOPOLOGY.size
            seen[name].append(times)
        print(f"  round {r + 1}: bare p50 {statistics.median(seen['bare'][-1]) * 1e3:.3f} ms, "
              f"muster p50 {statistics.median(seen['muster'][-1]) * 1e3:.3f} ms", flush=True)
    ratio = statistics.median(statistics.median(m) / statistics.median(b)
                              for m, b in zip(seen["muster"], seen["bare"], strict=True))
    print(f"\nper-pod admission (GetPreferredAllocation + Allocate, 1 GPU), {args.pods} pods x "
          f"{args.rounds} rounds:")
    for name, rounds in seen.items():
        every = [t for times in rounds for t in times]
        print(f"  {name:7} p50 {statistics.median(every) * 1e3:6.3f} ms   "
              f"p99 {pct(every, 0.99) * 1e3:6.3f} ms")
    print(f"  muster / bare (median of per-round p50 ratios): {ratio:.2f}x")


async def restarts(args: argparse.Namespace, kubelet: FakeKubelet) -> None:
    times = []
    for _ in range(args.restarts):
        await asyncio.sleep(0.3)
        t0 = time.perf_counter()
        await kubelet.restart()
        await kubelet.wait_for(keys.GPU_RESOURCE, count=TOPOLOGY.size, within=30)
        times.append(time.perf_counter() - t0)
    if times:
        print(f"kubelet restart -> agent registered again with its {TOPOLOGY.size} GPUs: "
              f"median {statistics.median(times) * 1e3:.0f} ms, max {max(times) * 1e3:.0f} ms "
              f"over {len(times)} restarts (the agent looks for a new kubelet socket every 1 s)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=400, help="pods per round and plugin "
                        "(a multiple of 8)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--restarts", type=int, default=3)
    parser.add_argument("--bare", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare is not None:
        asyncio.run(bare_plugin(args.bare))
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-dp-") as tmp:
        asyncio.run(run(args, Path(tmp)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
