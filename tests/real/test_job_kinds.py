"""Every job kind on the real node, with Muster installed by Helm and the shipped policies:
JobSet, TrainJob (TrainJob -> JobSet -> Job -> Pod), LeaderWorkerSet (a gang per group), elastic
PyTorchJob and Indexed Job. The test creates what each operator would (no operator runs here:
test_job_operators.py runs the released operators themselves); the real Job and StatefulSet
controllers create the pods, and the real API server validates every object against its
upstream CRD."""

from __future__ import annotations

import pytest
from jobs import ensure_namespace

from e2e import jobkind_scenarios as scenarios
from e2e.node import image
from webhook import keys
from webhook.kube import KubeApi

CONTAINER = {"name": "main", "image": f"{image.IMAGE_REPOSITORY}:{image.IMAGE_TAG}",
             "imagePullPolicy": "Never", "command": ["python", "-c", "pass"],
             "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}}}


@pytest.mark.parametrize("kind", sorted(scenarios.SCENARIOS))
async def test_each_job_kind_is_one_gang_per_job(kind: str, kube: KubeApi) -> None:
    for ns in (scenarios.VOLCANO_NS, scenarios.COSCHEDULING_NS):
        await ensure_namespace(kube, ns)
    tier = scenarios.Tier(kube, controllers=True, container=CONTAINER)
    for gang in await scenarios.SCENARIOS[kind](tier, kind):
        ns = scenarios.COSCHEDULING_NS if gang.resource is scenarios.COSCHEDULING_PODGROUPS \
            else scenarios.VOLCANO_NS
        group = await scenarios.check(kube, ns, gang)
        assert group["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "muster"
    if kind == "trainjob":
        # the initializer runs before the gang and outside it (the default scheduler runs it)
        (init,) = await scenarios.initializer_pods(kube, kind)
        assert keys.COSCHEDULING_GROUP_LABEL not in (init["metadata"].get("labels") or {})
