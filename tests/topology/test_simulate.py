"""The throughput model behind `muster simulate`: its structure, not its agreement with the
published reference (which it must not be fitted to)."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.cli import main
from webhook.topology import builtin, encode, set_score
from webhook.topology import simulate as sim
from webhook.topology.simulate import (
    Links,
    Model,
    Scenario,
    bottleneck_gbps,
    images_per_second,
    predict,
    reference_scenario,
)

EIGHT_GPU = ("dgx1-v100", "dgx1-p100", "hgx-a100", "hgx-h100", "pcie8-dual-socket",
             "pcie8-nvlink-pairs")

models = st.builds(Model, name=st.just("m"), params_millions=st.floats(1, 2000),
                   gpu_images_per_s=st.floats(1, 5000), batch=st.integers(1, 512))
links = st.builds(Links, network_gbps=st.floats(0.01, 400), efficiency=st.floats(0.01, 1),
                  overlap=st.floats(0, 1))
gbps = st.floats(0.01, 1000)


def test_a_step_is_compute_plus_the_nccl_tests_allreduce_time() -> None:
    # 250 M parameters are 1e9 bytes; nccl-tests: t = S / busbw * 2(n-1)/n
    m = Model("m", 250, gpu_images_per_s=100, batch=64)
    got = images_per_second(m, 4, 10.0, Links(efficiency=0.5, overlap=0))
    assert got == pytest.approx(4 * 64 / (0.64 + 1e9 / 5e9 * 1.5))
    hidden = images_per_second(m, 4, 10.0, Links(efficiency=0.5, overlap=0.25))
    assert hidden == pytest.approx(4 * 64 / (0.64 + 0.3 - 0.25 * 0.64))


@given(models, links, st.integers(2, 512), gbps, gbps)
def test_more_bandwidth_is_never_slower(m: Model, li: Links, n: int, a: float, b: float) -> None:
    lo, hi = sorted((a, b))
    assert images_per_second(m, n, lo, li) <= images_per_second(m, n, hi, li) * (1 + 1e-12)


@given(models, links, st.integers(2, 512), gbps, st.tuples(st.floats(0.01, 1), st.floats(0.01, 1)))
def test_higher_efficiency_and_overlap_are_never_slower(m: Model, li: Links, n: int, b: float,
                                                        shares: tuple[float, float]) -> None:
    lo, hi = sorted(shares)
    for field in ("efficiency", "overlap"):
        slow = images_per_second(m, n, b, dataclasses.replace(li, **{field: lo}))
        fast = images_per_second(m, n, b, dataclasses.replace(li, **{field: hi}))
        assert slow <= fast * (1 + 1e-12)


@given(models, links, gbps, st.integers(2, 256))
def test_scaling_is_at_most_linear_and_more_gpus_never_lose_throughput(
        m: Model, li: Links, b: float, n: int) -> None:
    one = images_per_second(m, 1, b, li)
    assert one == pytest.approx(m.gpu_images_per_s)
    now, more = images_per_second(m, n, b, li), images_per_second(m, n + 1, b, li)
    assert now <= n * one * (1 + 1e-12)
    assert more >= now * (1 - 1e-12)  # total: from 2 GPUs on, a rank more never hurts
    assert more / (n + 1) <= now / n * (1 + 1e-12)  # per GPU: never better


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(EIGHT_GPU), st.integers(2, 7), st.data(), models, links)
def test_a_worse_gpu_set_is_never_faster(name: str, k: int, data: st.DataObject, m: Model,
                                         li: Links) -> None:
    t = builtin(name)
    sets = st.lists(st.integers(0, 7), min_size=k, max_size=k, unique=True)
    a, b = data.draw(sets), data.draw(sets)
    ga = bottleneck_gbps({"n": a}, {"n": t}, li.network_gbps)
    gb = bottleneck_gbps({"n": b}, {"n": t}, li.network_gbps)
    assert ga == set_score(t, a).allreduce_gbps  # one node: the network plays no part
    if ga >= gb:
        assert images_per_second(m, k, ga, li) >= images_per_second(m, k, gb, li) * (1 - 1e-12)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(EIGHT_GPU), st.integers(2, 8), st.data(), links)
def test_a_split_job_is_bounded_by_the_network_and_by_each_node(
        name: str, k: int, data: st.DataObject, li: Links) -> None:
    t = builtin(name)
    a = data.draw(st.lists(st.integers(0, 7), min_size=1, max_size=k - 1, unique=True))
    b = data.draw(st.lists(st.integers(0, 7), min_size=k - len(a), max_size=k - len(a),
                           unique=True))
    got = bottleneck_gbps({"x": a, "y": b}, {"x": t, "y": t}, li.network_gbps)
    assert got <= li.network_gbps
    for gpus in (a, b):
        if len(gpus) > 1:
            assert got <= set_score(t, gpus).allreduce_gbps


@settings(max_examples=25, deadline=None)
@given(st.floats(0.05, 50), st.floats(0.05, 50), st.sampled_from(["vgg16", "resnet50"]))
def test_the_whole_prediction_is_monotone_in_the_network(a: float, b: float, name: str) -> None:
    lo, hi = (predict(reference_scenario(Links(network_gbps=v))) for v in sorted((a, b)))
    for placed in ("muster", "regular"):
        slow = getattr(lo, placed).images_per_s[name]
        fast = getattr(hi, placed).images_per_s[name]
        assert slow <= fast * (1 + 1e-12)


def test_reference_placements() -> None:
    r = predict(reference_scenario())
    dgx1 = builtin("dgx1-v100")
    best4 = max(set_score(dgx1, c).allreduce_gbps for c in itertools.combinations(range(8), 4))
    assert len(r.muster.gpus) == 1 and not r.muster.over_network
    assert r.muster.bottleneck_gbps == best4
    assert sorted(len(g) for g in r.regular.gpus.values()) == [2, 2]  # 2 + 2 over the network
    assert r.regular.bottleneck_gbps == Links().network_gbps
    for name in ("vgg16", "resnet50"):
        assert r.muster.images_per_s[name] > r.regular.images_per_s[name]


def test_the_published_reference_is_only_compared_with(monkeypatch: pytest.MonkeyPatch) -> None:
    before = predict(reference_scenario())
    monkeypatch.setattr(sim, "REFERENCE", {k: (v[0] * 3, v[1] / 3)
                                           for k, v in sim.REFERENCE.items()})
    after = predict(reference_scenario())
    assert after.muster == before.muster and after.regular == before.regular
    assert after.in_node == before.in_node and after.sensitivity == before.sensitivity
    assert [c.published for c in after.checks] != [c.published for c in before.checks]
    for c in after.checks:
        assert c.predicted == getattr(after, c.placement).images_per_s[c.model]
        assert c.error_pct == pytest.approx(100 * (c.predicted / c.published - 1))
    assert {(c.model, c.placement) for c in after.checks} == {
        (m, p) for m in ("vgg16", "resnet50") for p in ("muster", "regular")}


def test_no_check_outside_the_reference_scenario() -> None:
    s = dataclasses.replace(reference_scenario(), workers=3)
    assert predict(s).checks == ()
    assert predict(dataclasses.replace(reference_scenario(), topology=builtin("hgx-a100"))
                   ).checks == ()


def test_other_gpu_sets_in_one_node_are_ordered_and_never_faster() -> None:
    r = predict(reference_scenario())
    dgx1 = builtin("dgx1-v100")
    levels = {set_score(dgx1, c).allreduce_gbps for c in itertools.combinations(range(8), 4)}
    assert [c.allreduce_gbps for c in r.in_node] == sorted(levels, reverse=True)
    assert r.in_node[0].images_per_s == r.muster.images_per_s
    for better, worse in itertools.pairwise(r.in_node):
        assert set_score(dgx1, worse.gpus).allreduce_gbps == worse.allreduce_gbps
        for name, v in worse.images_per_s.items():
            assert v <= better.images_per_s[name]


def test_sensitivity_brackets_the_prediction() -> None:
    r = predict(reference_scenario())
    assert [v.name for v in r.sensitivity] == ["network GB/s", "per-GPU images/s, times",
                                                "allreduce efficiency", "overlap"]
    for v in r.sensitivity:
        assert v.low < v.high
        for name, ((m_lo, r_lo), (m_hi, r_hi)) in v.images_per_s.items():
            assert m_lo <= r.muster.images_per_s[name] <= m_hi
            assert r_lo <= r.regular.images_per_s[name] <= r_hi
    network = r.sensitivity[0].images_per_s["vgg16"]
    assert network[0][0] == network[1][0]  # Muster's job never crosses the network here
    assert network[0][1] < network[1][1]


@pytest.mark.parametrize("bad", [
    {"workers": 0}, {"nodes": 0}, {"models": ()},
    {"links": Links(network_gbps=0)}, {"links": Links(efficiency=1.5)},
    {"links": Links(overlap=-0.1)}, {"workers": 40},
])
def test_scenarios_that_cannot_be_modelled(bad: dict[str, object]) -> None:
    with pytest.raises(sim.ScenarioError):
        predict(dataclasses.replace(reference_scenario(), **bad))  # type: ignore[arg-type]


def test_cli_simulate_reference(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate"]) == 0
    out = capsys.readouterr().out
    assert "Modelled training throughput" in out and "published   991.92" in out
    assert "error" in out and "Sensitivity" in out
    assert main(["simulate", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    r = predict(reference_scenario())
    assert doc["muster"]["modelledImagesPerSecond"] == dict(r.muster.images_per_s)
    assert len(doc["checks"]) == 4 and len(doc["sensitivity"]) == 4


def test_cli_simulate_a_users_own_case(capsys: pytest.CaptureFixture[str],
                                       tmp_path: Path) -> None:
    f = tmp_path / "node.json"
    f.write_text(encode(builtin("hgx-a100")))
    assert main(["simulate", "--topology-file", str(f), "--nodes", "3", "--workers", "2",
                 "--gpus-per-worker", "8", "--params-millions", "350",
                 "--gpu-images-per-second", "120", "--batch", "16", "--network-gbps", "25",
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    want = predict(Scenario(topology=builtin("hgx-a100"), nodes=3, workers=2, gpus_per_worker=8,
                            models=(Model("custom", 350, 120, 16),),
                            links=Links(network_gbps=25)))
    assert doc["regular"]["modelledImagesPerSecond"] == dict(want.regular.images_per_s)
    assert doc["checks"] == [] and doc["scenario"]["models"][0]["batch"] == 16


def test_cli_simulate_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--model", "alexnet"]) == 2
    assert "unknown model 'alexnet'" in capsys.readouterr().err
    assert main(["simulate", "--params-millions", "10"]) == 2
    assert "go together" in capsys.readouterr().err
    assert main(["simulate", "--workers", "17"]) == 2
    assert "do not fit 2 x dgx1-v100" in capsys.readouterr().err
    assert main(["simulate", "--node-type", "dgx9"]) == 2
