"""`muster bind` pieces: the metrics endpoint over HTTP, and the CLI wiring."""

from __future__ import annotations

import asyncio
import gc
import socket

import aiohttp
import pytest
from binder_objects import job, node

from e2e.probes import eventually
from webhook.binder.controller import Binder, BinderConfig
from webhook.binder.service import BinderService, ServiceConfig
from webhook.cli import build_parser
from webhook.doubles.emulator import ApiServerEmulator
from webhook.kube import KubeApi
from webhook.kube.api import PODS
from webhook.topology.gpu_choice import ClassTables


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_metrics_endpoint_reports_placements_and_gpus(apiserver: ApiServerEmulator,
                                                            kube: KubeApi) -> None:
    apiserver.seed(node("dgx-a"))
    port = free_port()
    service = BinderService(kube, ServiceConfig(BinderConfig(), metrics_port=port,
                                                metrics_host="127.0.0.1"))
    task = asyncio.create_task(service.run())
    try:
        for p in job("j1"):
            await kube.create(PODS, p)
        for p in job("big", workers=6):  # 6 more GPUs do not fit next to j1's 4
            await kube.create(PODS, p)
        await eventually(lambda: sum(bool(p["spec"].get("nodeName"))
                                     for p in apiserver.objects("pods")) == 5)
        async with aiohttp.ClientSession() as http:
            async def scrape() -> str:
                async with http.get(f"http://127.0.0.1:{port}/metrics") as resp:
                    assert resp.status == 200
                    return await resp.text()
            text = await scrape()
            for _ in range(50):
                if 'muster_binder_pending_gangs{state="unplaceable"} 1.0' in text:
                    break
                await asyncio.sleep(0.05)
                text = await scrape()
            async with http.get(f"http://127.0.0.1:{port}/healthz") as resp:
                assert resp.status == 200
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert 'muster_binder_node_gpus_assigned{node="dgx-a"} 4.0' in text
    assert 'muster_binder_node_gpus{node="dgx-a"} 8.0' in text
    assert 'muster_binder_placements_total{outcome="placed"} 1.0' in text
    assert 'muster_binder_bindings_total{path="placed"} 5.0' in text
    assert "muster_binder_gang_bind_duration_seconds_count 1.0" in text
    for stage in ("queued", "plan", "bind"):  # the placed gang's, once each
        assert f'muster_binder_gang_stage_duration_seconds_count{{stage="{stage}"}} 1.0' in text
    assert 'muster_binder_pending_gangs{state="unplaceable"} 1.0' in text
    assert "muster_binder_leader 1.0" in text


def test_cli_parses_the_chart_arguments() -> None:
    args = build_parser().parse_args([
        "bind", "--scheduler-name=muster-binder", "--metrics-port=9090", "--leader-elect",
        "--lease-name=muster-binder", "--lease-namespace=muster-system", "--identity=pod-1"])
    assert (args.scheduler_name, args.metrics_port, args.leader_elect, args.lease_name,
            args.lease_namespace, args.identity) == (
        "muster-binder", 9090, True, "muster-binder", "muster-system", "pod-1")
    assert callable(args.func)


async def test_a_node_types_choice_tables_are_made_when_its_nodes_are_seen(
        apiserver: ApiServerEmulator, kube: KubeApi, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not during the first placement on them, which would wait as long (88 ms, DGX-1)."""
    made: list[str] = []
    warm = ClassTables.warm

    def counted(self: ClassTables) -> None:
        made.append(self.topology.name)
        warm(self)

    monkeypatch.setattr(ClassTables, "warm", counted)
    for name in ("dgx-a", "dgx-b"):
        apiserver.seed(node(name))
    b = Binder(kube)
    task = asyncio.create_task(b.run())
    try:
        await asyncio.wait_for(b.synced.wait(), 5)
        assert made == ["dgx1-v100"]  # one class, two nodes: made once, before any pod
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_terms_synced_caches_are_frozen_for_the_gc_until_it_ends(
        apiserver: ApiServerEmulator, kube: KubeApi) -> None:
    """A full collection would otherwise scan every cached node and pod (50 ms at 500 nodes);
    after the term its caches are garbage and must be collectable again."""
    apiserver.seed(node("dgx-a"))
    gc.unfreeze()
    service = BinderService(kube, ServiceConfig(BinderConfig()))
    task = asyncio.create_task(service.run())
    try:
        await eventually(lambda: service.binder is not None and service.binder.synced.is_set())
        await eventually(lambda: gc.get_freeze_count() > 0)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert gc.get_freeze_count() == 0
