"""Time to a Ready node and to a Running pod on the real tier's cluster, per Kubernetes release.

    sudo .venv/bin/python bench/bench_node.py [--versions v1.37.2,v1.34.4] [--rounds 2]

For each release, each round: `NodeCluster.start()` (etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, containerd, kubelet and kube-proxy in namespaces of
their own), then the seconds from the start to the Node's Ready condition, and from a pod's
create to Running (the pause image, `imagePullPolicy: Never`, placed by the real
kube-scheduler). The releases take turns, and each figure of a release is also given as a ratio
to the last release named (the baseline) in the same round.

It checks its work: the node must report Ready with the release's own kubelet version, and the
pod must run on it; otherwise it exits 1 with a line saying which.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from e2e.node import image, versions  # noqa: E402
from e2e.node.assets import binaries, ensure_debian_packages, missing_prerequisites  # noqa: E402
from e2e.node.cluster import NODE_NAME, NodeCluster  # noqa: E402
from e2e.node.image import PAUSE  # noqa: E402
from webhook.kube import NODES, PODS, ApiError, KubeApi, make_api_client  # noqa: E402


class BenchFailed(Exception):
    """The work the bench times did not happen as intended."""


def _ready(node: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (node.get("status") or {}).get("conditions") or ())


async def _until(what: str, check: Any, within: float) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if await check():
            return
        await asyncio.sleep(0.1)
    raise BenchFailed(f"{what} did not happen within {within:.0f} s")


async def _measure(cluster: NodeCluster, started: float) -> tuple[float, float]:
    """(seconds from start to node Ready, seconds from pod create to Running)."""
    client = await make_api_client(str(cluster.kubeconfig))
    kube = KubeApi(client)
    try:
        async def node_ready() -> bool:
            try:
                return _ready(await kube.get(NODES, NODE_NAME))
            except ApiError as exc:
                if exc.not_found:  # not registered yet
                    return False
                raise
        await _until("node Ready", node_ready, 180)
        ready = time.monotonic() - started
        node = await kube.get(NODES, NODE_NAME)
        kubelet = node["status"]["nodeInfo"]["kubeletVersion"]
        if not kubelet.startswith(cluster.version):
            raise BenchFailed(f"the node runs kubelet {kubelet}, not {cluster.version}")
        created = time.monotonic()
        await kube.create(PODS, {"apiVersion": "v1", "kind": "Pod",
                                 "metadata": {"name": "bench-pause"},
                                 "spec": {"containers": [{"name": "pause", "image": PAUSE,
                                                          "imagePullPolicy": "Never"}]}},
                          "default")

        async def running() -> bool:
            pod = await kube.get(PODS, "bench-pause", "default")
            return bool((pod.get("status") or {}).get("phase") == "Running")
        await _until("the pod Running", running, 120)
        pod_s = time.monotonic() - created
        pod = await kube.get(PODS, "bench-pause", "default")
        if pod["spec"].get("nodeName") != NODE_NAME:
            raise BenchFailed(f"the pod ran on {pod['spec'].get('nodeName')!r}, not the node")
        return ready, pod_s
    finally:
        await client.close()


def one(images: image.Images, version: str) -> tuple[float, float]:
    cluster = NodeCluster(images, {}, version=version)
    started = time.monotonic()
    try:
        cluster.start()
        with cluster.netns():
            return asyncio.run(_measure(cluster, started))
    except BaseException:
        print(cluster.logs(), file=sys.stderr)
        raise
    finally:
        cluster.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", type=lambda s: s.split(","),
                        default=[versions.KUBERNETES, versions.KUBERNETES_OLDEST],
                        help="comma-separated releases; the last is the baseline")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    why = missing_prerequisites()
    if why is not None:
        raise SystemExit(f"bench_node: {why}")
    ensure_debian_packages()
    for version in args.versions:
        binaries(version)  # built once, outside the timed part
    images = image.build()
    figures: dict[str, list[tuple[float, float]]] = {v: [] for v in args.versions}
    try:
        for r in range(args.rounds):
            for version in args.versions:
                ready, pod = one(images, version)
                figures[version].append((ready, pod))
                print(f"  round {r + 1} {version}: node Ready {ready:5.1f} s, pod Running "
                      f"{pod:5.1f} s", file=sys.stderr)
    except BenchFailed as exc:
        print(f"bench_node: FAILED: {exc}")
        return 1
    base = figures[args.versions[-1]]
    print(f"node Ready and pod Running on the real tier's node, {args.rounds} rounds, medians; "
          f"ratios to {args.versions[-1]} in the same round")
    for version, runs in figures.items():
        ready = statistics.median(r for r, _ in runs)
        pod = statistics.median(p for _, p in runs)
        ratio_ready = statistics.median(a[0] / b[0] for a, b in zip(runs, base, strict=True))
        ratio_pod = statistics.median(a[1] / b[1] for a, b in zip(runs, base, strict=True))
        print(f"{version:<9} node Ready {ready:5.1f} s ({ratio_ready:.2f}x)   pod Running "
              f"{pod:5.1f} s ({ratio_pod:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
