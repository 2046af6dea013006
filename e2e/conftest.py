"""End-to-end fixtures: a whole Muster installation per test.

By default the components run as local processes around the API server emulator (CI). With
`pytest e2e --real-cluster` and KUBECONFIG pointing at a cluster, the Helm chart is installed there
and the same tests drive it through the same Kubernetes API calls. The scenarios assume that
cluster's shape: two 8-GPU DGX-1 V100 nodes labelled muster.io/gpu-topology=enabled, the MPIJob,
Volcano and coscheduling CRDs installed, and the image the chart names pullable. The kubelet side
(device plugin handing out GPUs) is checked only locally, where the test drives the kubelet.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Generator
from pathlib import Path

import pytest

from e2e.cluster import LocalCluster, RealCluster

FAILED = pytest.StashKey[bool]()
SHARED = Path(__file__).resolve().parents[1].parent / "shared"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.when == "call" and report.failed:
        item.stash[FAILED] = True
    return report


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--real-cluster", action="store_true",
                     help="run e2e against the cluster in KUBECONFIG, installing the Helm chart")


@pytest.fixture
async def cluster(request: pytest.FixtureRequest, tmp_path: Path
                  ) -> AsyncIterator[LocalCluster | RealCluster]:
    c: LocalCluster | RealCluster
    if request.config.getoption("--real-cluster"):
        if not os.environ.get("KUBECONFIG"):
            pytest.fail("--real-cluster needs KUBECONFIG pointing at the cluster")
        c = RealCluster(tmp_path)
    else:
        c = LocalCluster(tmp_path, SHARED)
    try:
        await c.start()
        yield c
    except BaseException:
        print(c.logs())  # the start failed: the components' logs say why
        raise
    else:
        if request.node.stash.get(FAILED, False):
            print(c.logs())  # shown by pytest with the failure
    finally:
        await c.stop()
