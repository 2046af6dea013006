"""One rank of a real training job, in the training image (`e2e.node.train_image`).

    python3 rank.py mpi            # under mpirun: an MPI allreduce (mpi4py, TCP)
    python3 rank.py ddp [STEPS] [--step-seconds S] [--save-every N]
                                   # a PyTorchJob's pod: DDP steps with gloo (env:// rendezvous),
                                   # one each S seconds at most; rank 0 saves the model and
                                   # says so on its pod every N steps, and when its steps are done
    python3 rank.py launch ARGS    # the MPI launcher: waits for the hostfile's workers, execs
                                   # `mpirun ARGS`

Each rank contributes a vector of (rank + 1) to an allreduce (sum), checks every element is
1 + 2 + ... + world, and prints ONE JSON line: its rank, host, node, the GPUs its container was
given (NVIDIA_VISIBLE_DEVICES; the CDI devices' own MUSTER_GPU_* entries under DRA), the sum,
and the time from its start to the first allreduce done. A wrong sum exits 1, so a job that
ends Succeeded summed right.

A DDP job's rank 0 saves the model when its steps are done (and every N steps with
`--save-every N`), then says when on its own pod, as docs/binder.md asks of a job that
checkpoints: `muster.io/last-checkpoint-time`, patched through the API server as the pod's
ServiceAccount (its line's `checkpoint_said`: the last time said, or why it could not be).
A job paced by `--step-seconds` trains for as long as it is let run, as a long job does, at
a CPU cost a test cluster can bear.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import ssl
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

STARTED = time.monotonic()
VISIBLE = "NVIDIA_VISIBLE_DEVICES"
CDI_PREFIX = "MUSTER_GPU_"
VECTOR = 1024
DEFAULT_HOSTFILE = "/etc/mpi/hostfile"
#: the environment the container was started with, as `rank.py sshd` keeps it before it becomes
#: sshd: a rank mpirun starts over ssh has sshd's session environment, and sshd writes its
#: process title over its own (so /proc/1/environ holds no NODE_NAME, no GPUs)
CONTAINER_ENV = Path("/run/muster-container-env.json")


def container_env(raw: bytes | None, own: Mapping[str, str]) -> dict[str, str]:
    """The environment the container was started with (its first process's, `raw` as
    /proc/1/environ holds it): a rank mpirun started over ssh has sshd's, without the kubelet's
    and CDI's entries. `own` where that cannot be read."""
    if raw is None:
        return dict(own)
    items = (item.split("=", 1) for item in raw.decode(errors="replace").split("\0"))
    return {pair[0]: pair[1] for pair in items if len(pair) == 2}


def seen(env: Mapping[str, str]) -> dict[str, Any]:
    """What the container was given: its node (downward API) and its GPUs."""
    return {"node": env.get("NODE_NAME", ""), "visible": env.get(VISIBLE, ""),
            "cdi": sorted(v for k, v in env.items() if k.startswith(CDI_PREFIX))}


def expected_sum(world: int) -> float:
    return world * (world + 1) / 2


def summed_right(values: Sequence[float], world: int) -> bool:
    return len(values) == VECTOR and all(v == expected_sum(world) for v in values)


def line(rank: int, world: int, values: Sequence[float], elapsed: float,
         env: Mapping[str, str]) -> dict[str, Any]:
    return {"rank": rank, "world": world, "host": socket.gethostname(), **seen(env),
            "sum": values[0] if values else None, "expected": expected_sum(world),
            "ok": summed_right(values, world), "first_allreduce_s": round(elapsed, 3),
            "first_allreduce_at": round(time.time(), 3)}


def _env() -> dict[str, str]:
    try:
        kept: dict[str, str] = json.loads(CONTAINER_ENV.read_text())
        return kept
    except (OSError, ValueError):
        pass
    try:
        raw: bytes | None = Path("/proc/1/environ").read_bytes()
    except OSError:
        raw = None
    return container_env(raw, os.environ)


def sshd() -> None:
    """A worker: its environment kept for the ranks, then sshd in this process's place."""
    CONTAINER_ENV.write_text(json.dumps(dict(os.environ)))
    os.execv("/usr/sbin/sshd", ["/usr/sbin/sshd", "-De"])


def mpi() -> dict[str, Any]:
    import numpy as np  # noqa: PLC0415 - in the image only
    from mpi4py import MPI  # noqa: PLC0415 - in the image only

    comm = MPI.COMM_WORLD
    rank, world = comm.Get_rank(), comm.Get_size()
    send = np.full(VECTOR, rank + 1, dtype=np.float64)
    total = np.empty_like(send)
    comm.Allreduce(send, total, op=MPI.SUM)
    return line(rank, world, [float(v) for v in total], time.monotonic() - STARTED, _env())


def saves_after(step: int, steps: int, save_every: int) -> bool:
    """Whether rank 0 saves the model after `step` (1-based) of `steps`."""
    return step == steps or (save_every > 0 and step % save_every == 0)


def ddp(steps: int, step_seconds: float = 0.0, save_every: int = 0) -> dict[str, Any]:
    import torch  # noqa: PLC0415 - in the image only
    import torch.distributed as dist  # noqa: PLC0415 - in the image only
    from torch.nn.parallel import DistributedDataParallel  # noqa: PLC0415 - in the image only

    dist.init_process_group("gloo")  # env://: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
    rank, world = dist.get_rank(), dist.get_world_size()
    total = torch.full((VECTOR,), float(rank + 1), dtype=torch.float64)
    dist.all_reduce(total)
    out = line(rank, world, total.tolist(), time.monotonic() - STARTED, _env())
    torch.manual_seed(0)  # the same initial model on every rank
    model = DistributedDataParallel(torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(rank)  # each rank its own batches
    loss = torch.zeros(())
    said = None
    for step in range(1, steps + 1):
        began = time.monotonic()
        x = torch.randn(32, 16, generator=data)
        opt.zero_grad()
        loss = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
        loss.backward()  # DDP averages the gradients over the ranks (gloo allreduce)
        opt.step()
        # the model is the same on every rank: one saves it, and says so
        if rank == 0 and saves_after(step, steps, save_every):
            torch.save(model.module.state_dict(), "/tmp/checkpoint.pt")
            said = say_checkpointed(time.time())
        time.sleep(max(0.0, step_seconds - (time.monotonic() - began)))
    # averaged gradients keep the replicas equal: every rank ends with the same parameters
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    everyone = [torch.empty_like(params) for _ in range(world)]
    dist.all_gather(everyone, params)
    dist.destroy_process_group()
    in_sync = all(torch.equal(p, params) for p in everyone)
    out.update(steps=steps, loss=round(float(loss), 6), in_sync=in_sync,
               ok=out["ok"] and in_sync)
    if said is not None:
        out["checkpoint_said"] = said
    return out


#: the annotation a job that checkpoints writes on its pods (webhook.keys.ANN_LAST_CHECKPOINT:
#: the image holds no Muster code)
LAST_CHECKPOINT = "muster.io/last-checkpoint-time"
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


def say_checkpointed(at: float, env: Mapping[str, str] = os.environ,
                     account: Path = SERVICE_ACCOUNT) -> str:
    """Write `at` (epoch seconds) as LAST_CHECKPOINT on this pod (POD_NAME, POD_NAMESPACE from
    the Downward API) through the API server, as the pod's ServiceAccount: the time written,
    or "error: ..." when it could not be."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))
    try:
        url = (f"https://{env['KUBERNETES_SERVICE_HOST']}:{env['KUBERNETES_SERVICE_PORT']}"
               f"/api/v1/namespaces/{env['POD_NAMESPACE']}/pods/{env['POD_NAME']}")
        body = json.dumps({"metadata": {"annotations": {LAST_CHECKPOINT: stamp}}}).encode()
        request = urllib.request.Request(url, data=body, method="PATCH", headers={
            "Authorization": f"Bearer {(account / 'token').read_text().strip()}",
            "Content-Type": "application/merge-patch+json"})
        tls = ssl.create_default_context(cafile=str(account / "ca.crt"))
        with urllib.request.urlopen(request, context=tls, timeout=10):
            return stamp
    except (KeyError, OSError) as exc:  # urllib's HTTPError and URLError are OSErrors
        detail = exc.read().decode(errors="replace")[:300] if hasattr(exc, "read") else ""
        return f"error: {exc!r} {detail}".strip()


def hostfile_hosts(text: str) -> list[str]:
    """The hosts of an OpenMPI hostfile ("name slots=N" lines)."""
    return [ln.split()[0] for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]


def _reachable(host: str, port: int = 22) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:  # not resolvable yet (no Endpoints) or sshd not listening yet
        return False


def launch(args: list[str], within: float = 300) -> None:
    """The workers' sshd reachable (their pods start beside the launcher's, in one gang), then
    mpirun in this process's place."""
    hostfile = os.environ.get("OMPI_MCA_orte_default_hostfile",  # noqa: SIM112 - its name
                              DEFAULT_HOSTFILE)
    waiting = hostfile_hosts(Path(hostfile).read_text())
    deadline = time.monotonic() + within
    while waiting := [h for h in waiting if not _reachable(h)]:
        if time.monotonic() > deadline:
            sys.exit(f"workers not reachable over ssh within {within:.0f} s: {waiting}")
        time.sleep(1)
    os.execvp("mpirun", ["mpirun", *args])


def ddp_args(argv: list[str]) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="rank.py ddp")
    parser.add_argument("steps", type=int, nargs="?", default=5)
    parser.add_argument("--step-seconds", type=float, default=0.0)
    parser.add_argument("--save-every", type=int, default=0)
    return vars(parser.parse_args(argv))


def main(argv: list[str]) -> int:
    if argv[:1] == ["launch"]:
        launch(argv[1:])
    if argv[:1] == ["sshd"]:
        sshd()
    if argv[:1] not in (["mpi"], ["ddp"]):
        sys.exit("usage: rank.py mpi | ddp [STEPS] [--step-seconds S] [--save-every N]"
                 " | launch MPIRUN-ARGS... | sshd")
    out = mpi() if argv[0] == "mpi" else ddp(**ddp_args(argv[1:]))
    print(json.dumps(out, sort_keys=True), flush=True)
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
