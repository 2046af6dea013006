"""LeaderWorkerSet's own gang scheduling on the real node: its controller (v0.9.0, built from
the Go module proxy) run with `gangSchedulingManagement.schedulerProvider: volcano`, in the
namespace of policy leaderworkerset-volcano.

LWS's pod webhook runs after Muster's (Muster's configuration is named `0-<release>`) and
overwrites the group key Muster gave the pod, so the API server calls Muster again: Muster stands
aside there. Each group's pods join the one PodGroup LWS made, no PodGroup of Muster's is left
for them, and the pods carry no record of a gang Muster did not join them to. The LWS controller
of test_job_operators (no provider) is a module fixture there: it is stopped before this
module's starts.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from jobs import ensure_namespace
from operator_runs import delete_all, delete_and_wait, module_controller

from e2e import jobkind_scenarios as scenarios
from e2e import jobkinds
from e2e.node import image, operators
from e2e.node.cluster import NodeCluster
from e2e.probes import eventually
from webhook import keys
from webhook.kube import EVENTS, PODS, VOLCANO_PODGROUPS, KubeApi
from webhook.policy.operators import LWS_NAME_LABEL
from webhook.policy.podgroup import MANAGED_BY

CONTAINER = {"name": "main", "image": f"{image.IMAGE_REPOSITORY}:{image.IMAGE_TAG}",
             "imagePullPolicy": "Never",
             "command": ["python", "-c", "import time; time.sleep(3600)"],
             "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}}}
#: the labels LWS's pod webhook and its Volcano provider put on a group's pods and PodGroup
GROUP_INDEX = "leaderworkerset.sigs.k8s.io/group-index"
REVISION = "leaderworkerset.sigs.k8s.io/template-revision-hash"


@pytest.fixture(scope="module")
def lws_volcano(node_cluster: NodeCluster, tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[None]:
    yield from module_controller(
        node_cluster, operators.LWS, tmp_path_factory.mktemp("lws-volcano"), 19473,
        config_extra={"gangSchedulingManagement": {"schedulerProvider": "volcano"}})


def _made_by_muster(obj: dict[str, Any]) -> bool:
    labels = obj["metadata"].get("labels") or {}
    return all(labels.get(k) == v for k, v in MANAGED_BY.items())


async def test_lws_own_volcano_gangs_are_the_only_ones_and_muster_stands_aside(
        kube: KubeApi, lws_volcano: None) -> None:
    ns = await ensure_namespace(kube, scenarios.VOLCANO_NS)  # policy leaderworkerset-volcano
    await delete_all(kube, scenarios.LEADERWORKERSETS, ns)
    lws = jobkinds.leaderworkerset("lws-own", ns, groups=2, size=3, container=CONTAINER)
    await kube.create(scenarios.LEADERWORKERSETS, lws, namespace=ns)

    async def all_pods() -> list[dict[str, Any]] | None:
        pods = (await kube.list(PODS, namespace=ns,
                                label_selector=f"{LWS_NAME_LABEL}=lws-own"))["items"]
        return pods if len(pods) == 6 else None
    pods: list[dict[str, Any]] = await eventually(all_pods, within=120, interval=0.5,
                                                  what="the 6 pods of LWS lws-own")
    theirs: dict[int, str] = {}
    for pod in pods:
        meta = pod["metadata"]
        group, ann = int(meta["labels"][GROUP_INDEX]), meta["annotations"]
        # LWS's name for the group's PodGroup (volcano_provider.go GetPodGroupName)
        wanted = f"lws-own-{group}-{meta['labels'][REVISION]}"
        assert ann[keys.VOLCANO_GROUP_ANNOTATION] == wanted, (meta["name"], ann)
        theirs[group] = wanted
        # Muster's record names no gang: it joined the pod to none that held
        assert keys.ANN_JOINED_GANG not in ann, (meta["name"], ann)
        assert ann[keys.ANN_POLICY] == "leaderworkerset-volcano"
    assert sorted(theirs) == [0, 1]

    async def one_group_each() -> dict[str, dict[str, Any]] | None:
        groups = {g["metadata"]["name"]: g for g in
                  (await kube.list(VOLCANO_PODGROUPS, namespace=ns))["items"]
                  if g["metadata"]["name"].startswith("lws-own-")}
        return groups if set(groups) == set(theirs.values()) else None
    groups = await eventually(one_group_each, within=30, interval=0.5,
                              what="LWS's PodGroup per group and no other")
    for group in groups.values():
        assert not _made_by_muster(group), group["metadata"]
        assert group["spec"]["minMember"] == 3
        (owner,) = group["metadata"]["ownerReferences"]
        assert owner["kind"] == "Pod"  # LWS's provider: owned by the group's leader
    assert set(groups) == set(theirs.values())  # still none of Muster's (`lws-own-<g>`)

    async def stood_aside() -> list[dict[str, Any]] | None:  # said on the LWS, where users look
        found = [e for e in (await kube.list(EVENTS, namespace=ns))["items"]
                 if e.get("reason") == "GangStoodAside"
                 and e["involvedObject"].get("kind") == "LeaderWorkerSet"
                 and e["involvedObject"].get("name") == "lws-own"]
        return found or None
    said = await eventually(stood_aside, within=30, interval=0.5, what="Event GangStoodAside")
    for g in range(2):
        assert any(f"PodGroup {ns}/lws-own-{g} deleted" in e["message"] for e in said), said

    await delete_and_wait(kube, scenarios.LEADERWORKERSETS, "lws-own", ns,
                          *((VOLCANO_PODGROUPS, name) for name in theirs.values()))
