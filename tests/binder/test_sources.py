"""A CRD installed after the binder started is read from then on, with no restart
(webhook.binder.sources): the binder through the emulator, and the looking for it against an
API whose answers are given."""

from __future__ import annotations

import asyncio
import copy
import logging
from typing import Any, cast

import pytest
from binder_objects import SCHED, node, pod
from binder_run import bound, serving

from e2e.probes import eventually
from webhook import keys
from webhook.binder.controller import Binder, BinderConfig
from webhook.binder.sources import Source, Sources
from webhook.doubles.emulator import ApiServerEmulator
from webhook.kube import KubeApi
from webhook.kube.api import (
    COSCHEDULING_PODGROUPS,
    CRDS,
    PODS,
    RESOURCE_SLICES,
    ApiError,
    Resource,
)
from webhook.kube.informer import Informer

PODGROUP_CRD = "podgroups.scheduling.x-k8s.io"
API = "/".join(keys.COSCHEDULING_API[:2])


def crd(shared_crds: list[dict[str, Any]], name: str) -> dict[str, Any]:
    [found] = [c for c in shared_crds if c["metadata"]["name"] == name]
    return copy.deepcopy(found)


async def test_a_podgroup_crd_installed_after_the_binder_started_is_read(
        apiserver: ApiServerEmulator, kube: KubeApi, shared_crds: list[dict[str, Any]],
        caplog: pytest.LogCaptureFixture) -> None:
    """Two pods of a coscheduling PodGroup wait while the CRD is not installed (the group is
    not found); once it is, and the PodGroup is made, the binder binds them whole."""
    await kube.delete(CRDS, PODGROUP_CRD)
    apiserver.seed(node("n-0"))
    b = Binder(kube, BinderConfig(backoff_initial=0.05, backoff_max=0.2,
                                  crd_probe_seconds=0.1))
    caplog.set_level(logging.INFO, logger="webhook.binder")
    async with serving(b):
        for i in range(2):
            await kube.create(PODS, pod(f"co-{i}", gpus=1, topology=None, labels={
                keys.COSCHEDULING_GROUP_LABEL: "pg"}))

        def waits() -> list[str]:
            return [w.reason for w in b.last_plan.waits] if b.last_plan else []
        [reason] = await eventually(waits, within=5)
        assert "PodGroup team-a/pg not found" in reason, reason

        await kube.create(CRDS, crd(shared_crds, PODGROUP_CRD))
        await kube.create(COSCHEDULING_PODGROUPS, {
            "apiVersion": API, "kind": "PodGroup",
            "metadata": {"name": "pg", "namespace": "team-a"},
            "spec": {"minMember": 2}}, namespace="team-a")
        assert await eventually(lambda: bound(apiserver, "co-"), within=5) == {"n-0"}
    said = [r.getMessage() for r in caplog.records]
    assert "coscheduling PodGroup CRD not installed: only muster.io gang annotations until it " \
        "is" in said and "resource now served: reading it" in said, said


async def test_a_podgroup_crd_installed_later_holds_its_gang_to_its_min_member(
        apiserver: ApiServerEmulator, kube: KubeApi, shared_crds: list[dict[str, Any]]) -> None:
    """The PodGroup read late is obeyed: with minMember 3, two pods are not bound."""
    await kube.delete(CRDS, PODGROUP_CRD)
    apiserver.seed(node("n-0"))
    b = Binder(kube, BinderConfig(backoff_initial=0.05, backoff_max=0.2,
                                  crd_probe_seconds=0.1))
    async with serving(b):
        await kube.create(CRDS, crd(shared_crds, PODGROUP_CRD))
        await kube.create(COSCHEDULING_PODGROUPS, {
            "apiVersion": API, "kind": "PodGroup",
            "metadata": {"name": "pg", "namespace": "team-a"},
            "spec": {"minMember": 3}}, namespace="team-a")
        for i in range(2):
            await kube.create(PODS, pod(f"co-{i}", gpus=1, topology=None, scheduler=SCHED,
                                        labels={keys.COSCHEDULING_GROUP_LABEL: "pg"}))

        def short() -> list[str]:
            return [w.reason for w in b.last_plan.waits if "2 of minMember 3 exist" in w.reason] \
                if b.last_plan else []
        await eventually(short, within=5, what="the gang to wait for its third member")
        assert not bound(apiserver, "co-")


class Answers:
    """An API whose list answers, call after call, are given: an error or a list."""

    def __init__(self, *answers: ApiError | None) -> None:
        self.answers = list(answers)
        self.asked = 0

    async def list(self, _resource: Resource, **_: Any) -> dict[str, Any]:
        self.asked += 1
        answer = self.answers.pop(0)
        if answer is not None:
            raise answer
        return {"items": []}


async def test_a_crd_is_asked_for_again_after_an_error_until_it_is_served(
        caplog: pytest.LogCaptureFixture) -> None:
    """Not served, then the API server fails the question, then not served, then served: the
    informer starts at the fourth question, the failure logged, and the looking stops."""
    api = Answers(ApiError(404, "NotFound", ""), ApiError(503, "ServiceUnavailable", "down"),
                  ApiError(404, "NotFound", ""), None)
    sources = Sources(cast(KubeApi, api), interval=0.01)
    found: list[str] = []
    assert await sources.informers([Source((COSCHEDULING_PODGROUPS,), lambda *_: None,
                                           "absent", found=lambda: found.append("found"))]) == []
    started: list[Informer] = []
    await asyncio.wait_for(sources.await_late(started.append), timeout=5)
    assert [i.resource for i in started] == [COSCHEDULING_PODGROUPS]
    assert (api.asked, found, sources.awaited) == (4, ["found"], [])
    assert any(r.getMessage() == "could not ask whether a resource is served"
               for r in caplog.records)


async def test_a_resource_built_into_the_api_server_is_not_asked_for_again() -> None:
    """DRA's resources (late=False) not served at start are not awaited."""
    api = Answers(ApiError(404, "NotFound", ""))
    sources = Sources(cast(KubeApi, api), interval=0.01)
    assert await sources.informers([Source((RESOURCE_SLICES,), lambda *_: None, "absent",
                                           late=False)]) == []
    await asyncio.wait_for(sources.await_late(lambda _: None), timeout=5)
    assert (api.asked, sources.awaited) == (1, [])


async def test_asked_again_the_sources_await_each_missing_crd_once() -> None:
    api = Answers(*[ApiError(404, "NotFound", "")] * 2)
    sources = Sources(cast(KubeApi, api), interval=0.01)
    missing = Source((COSCHEDULING_PODGROUPS,), lambda *_: None, "absent")
    for _ in range(2):
        assert await sources.informers([missing]) == []
    assert sources.awaited == [missing]
