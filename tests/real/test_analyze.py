"""`muster analyze` against the real node with Muster installed: what is healthy says nothing,
and what depends on real behaviour fires (no scheduler ever looks at the coscheduling pods: the
shipped policy names scheduler-plugins, which this node does not run)."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import io
import json
from pathlib import Path
from typing import Any

from jobs import ensure_namespace, mpijob
from real_helpers import chart_reader, kubectl

from e2e.node.cluster import NODE_NAME, NodeCluster
from e2e.probes import eventually
from webhook.analyze.collect import collect
from webhook.analyze.findings import analyze
from webhook.cli import main
from webhook.kube import MPIJOBS, PODS, KubeApi, make_api_client
from webhook.policy import operators


def _analyze(cluster: NodeCluster) -> tuple[int, list[dict[str, Any]]]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["analyze", "--kubeconfig", str(cluster.kubeconfig), "--output", "json",
                     "--stuck-after", "5"])
    return code, json.loads(out.getvalue())


async def test_analyze_names_what_is_wrong_on_the_real_node_and_nothing_else(
        kube: KubeApi, node_cluster: NodeCluster) -> None:
    ns = await ensure_namespace(kube, "team-b")  # policy mpi-coscheduling
    made = await kube.create(MPIJOBS, mpijob("analyzed", ns, workers=2), namespace=ns)
    await kube.create(PODS, operators.mpi_worker_pods(made)[0], namespace=ns)
    found: list[dict[str, Any]] = []
    code = 0

    async def fired() -> bool:
        nonlocal found, code
        code, found = await asyncio.to_thread(_analyze, node_cluster)
        return any(f["code"] == "SchedulerNotRunning" for f in found)
    await eventually(fired, within=60, what="SchedulerNotRunning for the coscheduling pods")
    codes = {(f["code"], f["object"]) for f in found}
    assert ("SchedulerNotRunning", "Scheduler/scheduler-plugins-scheduler") in codes
    assert code == 1  # an error: a pipeline gating on it stops
    # the node is labelled for topology placement without the dedicated taint: true here
    assert ("TopologyNodeNotTainted", f"Node/{NODE_NAME}") in codes
    # what is healthy on this node says nothing: Ready endpoints, a caBundle that verifies
    # the serving certificate, the backends' CRDs, a binder leader, a published topology, the
    # Ready agent pod the node's record names
    healthy = {"WebhookNotInstalled", "WebhookNotReady", "CaBundleMismatch",
               "BackendNotInstalled", "BinderNotLeading", "TopologyNotPublished",
               "WebhookFailsClosed", "SystemNamespacesNotExcluded", "WebhookAfterIstio",
               "GpuAgentGone", "GpuAgentNotServing"}
    assert not healthy & {c for c, _ in codes}, found


async def test_analyze_reads_as_the_charts_reader_and_nothing_the_server_warns_about(
        node_cluster: NodeCluster, tmp_path: Path) -> None:
    """Run as a ServiceAccount bound to the chart's reader ClusterRole, analyze reads all it
    reads (a read the role lacked would be refused and fail it) and finds what the admin finds;
    no read draws a warning (the webhook's endpoints come from its EndpointSlices: v1 Endpoints
    draw a deprecation warning since 1.33, which would reach the admin's screen)."""
    kubeconfig, rbac = chart_reader(node_cluster, tmp_path, "muster-analyze-reader")
    try:
        client = await make_api_client(str(kubeconfig))
        try:
            read = KubeApi(client)
            snapshot = await collect(read, "muster-system", "muster", stuck_after=5)
        finally:
            await client.close()
        assert len(read.warnings) == 0
        assert any(e.get("addresses") for es in snapshot.endpoint_slices
                   for e in es.get("endpoints") or ())
        assert snapshot.serving_cert is not None and snapshot.leases and snapshot.nodes
        _, as_admin = await asyncio.to_thread(_analyze, node_cluster)
        found = analyze(snapshot, dt.datetime.now(dt.UTC))
        assert {f.code for f in found} == {f["code"] for f in as_admin}
    finally:
        with node_cluster.netns():
            kubectl(node_cluster, "delete", "--ignore-not-found", "-f", str(rbac))
