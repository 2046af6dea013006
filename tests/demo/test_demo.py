"""`muster demo`: the README's main command runs the whole flow and reports what really happened."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

from webhook.demo import EXAMPLE_POLICIES
from webhook.demo.report import format_result
from webhook.demo.run import DemoResult, Progress, run_demo
from webhook.topology import builtin, set_score
from webhook.topology.simulate import images_per_second, predict, reference_scenario

REPO = Path(__file__).resolve().parents[2]


async def _run() -> DemoResult:
    lines: list[str] = []
    result = await run_demo([EXAMPLE_POLICIES], Progress(lines.append, tty=False))
    assert len([line for line in lines if " ok (" in line]) == 7, lines
    return result


async def test_topology_gangs_bound_whole_on_one_node_with_the_best_ring() -> None:
    result = await _run()
    dgx1 = builtin("dgx1-v100")
    best_4 = max(set_score(dgx1, c).allreduce_gbps for c in itertools.combinations(range(8), 4))
    used: set[tuple[str, int]] = set()
    for job in result.jobs[:2]:
        assert job.gang == {"muster.io/gang-name": job.name, "muster.io/gang-min-member": "5",
                            "muster.io/gang-timeout-seconds": "600"}
        assert {p.node for p in job.pods} != {None} and len({p.node for p in job.pods}) == 1
        workers = [p for p in job.pods if p.role == "worker"]
        assert [len(p.gpus) for p in workers] == [1, 1, 1, 1]
        assert job.bus_gbps == best_4
        for p in workers:
            assert p.visible_devices is not None and sorted(p.visible_devices) == sorted(p.uuids)
            assert p.uuids == tuple(dgx1.gpus[i].uuid for i in p.gpus)
            for gpu in p.gpus:
                assert (p.node, gpu) not in used  # no GPU handed out twice
                used.add((p.node or "", gpu))
        # modelled from the GPUs the binder gave it, never from the published figures
        links = reference_scenario().links
        for model in reference_scenario().models:
            assert job.images_per_s[model.name] == images_per_second(model, 4, best_4, links)
            assert job.images_per_s[model.name] > result.regular_images_per_s[model.name]
    assert result.regular_images_per_s == predict(reference_scenario()).regular.images_per_s


async def test_coscheduling_job_gets_its_podgroup_and_launchers_opt_out_of_istio() -> None:
    result = await _run()
    gang_job = result.jobs[2]
    assert gang_job.pod_group is not None
    assert gang_job.pod_group["apiVersion"] == "scheduling.x-k8s.io/v1alpha1"
    assert gang_job.pod_group["spec"]["minMember"] == 5
    assert gang_job.pod_group["metadata"]["ownerReferences"][0]["kind"] == "MPIJob"
    assert all(p.node is None for p in gang_job.pods)  # nobody here runs that scheduler
    for job in result.jobs:
        launcher = next(p for p in job.pods if p.role == "launcher")
        ops = {(op["op"], op["path"]): op.get("value") for op in launcher.patch}
        assert ops[("add", "/metadata/labels/sidecar.istio.io~1inject")] == "false"
    text = format_result(result)
    assert "speed-up (modelled)" in text and "PodGroup scheduling.x-k8s.io/v1alpha1 vgg16-c" in text
    assert "published by Alibaba ACK: vgg16 991.92 vs 200.47" in text
    assert "the model's error against it: vgg16 Muster " in text


def test_cli_prints_json_and_exits_zero_outside_the_repository(tmp_path: Path) -> None:
    """The shipped policies are package data: the default needs no checkout in the cwd."""
    proc = subprocess.run([sys.executable, "-m", "webhook", "demo", "--json"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert [j["name"] for j in doc["jobs"]] == ["vgg16-a", "vgg16-b", "vgg16-c"]
    assert "[7] kubelets start the workers" in proc.stderr


def test_cli_refuses_a_missing_policy_path(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "webhook", "demo", "--policies",
                           str(tmp_path / "nope")], cwd=REPO, capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 2 and "no such policy path" in proc.stderr


def test_cli_without_the_emulator_says_how_to_run_it() -> None:
    """As in the image, which leaves the test doubles out (the Dockerfile)."""
    code = ("import sys; sys.modules['webhook.doubles.emulator'] = None; "
            "from webhook.cli import main; sys.exit(main(['demo']))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 1, proc.stderr
    assert "pip install . && muster demo" in proc.stderr and "Traceback" not in proc.stderr
