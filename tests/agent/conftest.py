"""Fixtures for the node agent: a short socket directory, a fake kubelet, a DGX-1 topology."""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from webhook.agent.discovery import discover
from webhook.doubles.fakekubelet import FakeKubelet
from webhook.doubles.fakenvml import FakeNvml
from webhook.topology.model import Topology

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    # unix socket paths are limited to 107 bytes: pytest's tmp_path can be longer
    path = Path(tempfile.mkdtemp(prefix="dp-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def kubelet(sock_dir: Path) -> AsyncIterator[FakeKubelet]:
    k = FakeKubelet(sock_dir)
    await k.start()
    yield k
    await k.stop()


@pytest.fixture(scope="session")
def dgx1() -> Topology:
    topo = discover(FakeNvml.profile("dgx1-v100")).topology
    assert topo is not None
    return topo
