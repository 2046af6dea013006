"""Replay every recorded NVML fixture (tests/agent/fixtures/nvml/*.json) through the fake NVML.

Files recorded on real GPU nodes with `muster agent discover --record FILE` go in that
directory; each must replay to a valid topology and re-record identically. EXPECTED names the
built-in node type a fixture must equal (same class hash) where one applies.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from webhook.agent.discovery import discover
from webhook.agent.nvmlrecord import record_nvml
from webhook.doubles.fakenvml import FakeNvml
from webhook.topology import builtin, decode, encode, topology_class

FIXTURES = sorted((Path(__file__).parent / "fixtures" / "nvml").glob("*.json"))
EXPECTED = {
    "dgx1-v100-r418-fake.json": "dgx1-v100",
    "hgx-a100-fake.json": "hgx-a100",
}


def test_there_are_fixtures() -> None:
    assert {p.name for p in FIXTURES} >= set(EXPECTED)


@pytest.mark.parametrize("path", FIXTURES, ids=[p.name for p in FIXTURES])
def test_recorded_fixture_replays(path: Path) -> None:
    nvml = FakeNvml.from_file(path)
    found = discover(nvml)
    assert found.topology is not None, found.degradations
    assert decode(encode(found.topology)) == found.topology
    assert nvml.initialised == 0
    # the record format keeps everything discovery reads: re-recording the replay is lossless
    assert record_nvml(FakeNvml.from_file(path), source=nvml.record.source) == nvml.record
    if path.name in EXPECTED:
        assert topology_class(found.topology) == topology_class(builtin(EXPECTED[path.name]))
        assert not found.degraded
