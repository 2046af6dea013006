"""`muster demo`: the README's main command runs the whole flow and reports what really happened."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from webhook.demo import EXAMPLE_POLICIES
from webhook.demo.outcome import DemoResult, JobOutcome, PodOutcome
from webhook.demo.progress import Progress
from webhook.demo.report import format_result
from webhook.demo.run import run_demo
from webhook.topology import builtin, set_score
from webhook.topology.simulate import images_per_second, predict, reference_scenario

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Run:
    result: DemoResult
    #: the progress lines, as stderr shows them
    steps: list[str]
    text: str


def _run(policies: list[Path]) -> Run:
    steps: list[str] = []
    result = asyncio.run(run_demo(policies, Progress(steps.append, tty=False)))
    return Run(result, steps, format_result(result))


@pytest.fixture(scope="module")
def default() -> Run:
    """One run on the shipped policies, shared by the tests that read it."""
    return _run([EXAMPLE_POLICIES])


@pytest.fixture(scope="module")
def volcano_only() -> Run:
    """The newcomer's run of issue #25: no policy asks for GPU topology."""
    return _run([EXAMPLE_POLICIES / "mpi-volcano.yaml", EXAMPLE_POLICIES / "istio-optout.yaml"])


def test_topology_gangs_bound_whole_on_one_node_with_the_best_ring(default: Run) -> None:
    assert len([line for line in default.steps if " ok (" in line]) == 9, default.steps
    result = default.result
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


def test_coscheduling_job_gets_its_podgroup_and_launchers_opt_out_of_istio(default: Run) -> None:
    gang_job = default.result.jobs[2]
    assert gang_job.pod_group is not None
    assert gang_job.pod_group["apiVersion"] == "scheduling.x-k8s.io/v1alpha1"
    assert gang_job.pod_group["spec"]["minMember"] == 5
    assert gang_job.pod_group["metadata"]["ownerReferences"][0]["kind"] == "MPIJob"
    assert all(p.node is None for p in gang_job.pods)  # nobody here runs that scheduler
    for job in default.result.jobs[:3]:
        launcher = next(p for p in job.pods if p.role == "launcher")
        ops = {(op["op"], op["path"]): op.get("value") for op in launcher.patch}
        assert ops[("add", "/metadata/labels/sidecar.istio.io~1inject")] == "false"
    text = default.text
    assert "speed-up (modelled)" in text
    assert "PodGroup scheduling.x-k8s.io/v1alpha1 vgg16-c" in text
    assert "published by Alibaba ACK: vgg16 991.92 vs 200.47" in text
    assert "the model's error against it: vgg16 Muster " in text


def test_the_shipped_policies_show_a_volcano_podgroup_with_its_key_fields(default: Run) -> None:
    job = default.result.jobs[3]
    assert (job.namespace, job.name, job.kind) == ("team-d", "vgg16-d", "Indexed Job")
    assert job.policies == ["indexed-job-volcano", "istio-optout-batch-jobs"]
    assert job.pod_group is not None
    assert job.pod_group["apiVersion"] == "scheduling.volcano.sh/v1beta1"
    assert job.pod_group["spec"] == {
        "minMember": 4, "queue": "training", "priorityClassName": "batch-high",
        "minResources": {"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": "4"}}
    assert all(p.node is None for p in job.pods)  # Volcano's scheduler is not part of the demo
    shown = ("    PodGroup scheduling.volcano.sh/v1beta1 vgg16-d, created before the first pod was"
             " admitted:\n      minMember: 4\n      queue: training\n      priorityClassName: "
             "batch-high\n      minResources: cpu 16, memory 64Gi, nvidia.com/gpu 4\n")
    assert shown in default.text


def test_annotation_values_print_as_yaml_reads_them(default: Run) -> None:
    """A JSON annotation value keeps its quotes inside single quotes: the line is YAML."""
    line = next(line for line in default.text.splitlines()
                if "muster.io/gpu-topology: " in line)
    value = yaml.safe_load(line.strip())["muster.io/gpu-topology"]
    assert json.loads(value) == {"v": 1, "mode": "required", "singleNode": True,
                                 "minRingGBps": 50.0}
    pod = PodOutcome("p", "worker", [{"op": "add", "path": "/metadata/annotations", "value": {
        "quote": "it's", "newline": "a\nb", "count": 5}}], [])
    text = format_result(DemoResult([JobOutcome("j", "ns", "MPIJob", [], [pod])], {}, "", 0.0))
    assert "quote: 'it''s'\n" in text  # a quote doubled, as YAML single quotes do
    assert 'newline: "a\\nb"\n' in text  # JSON-escaped where single quotes cannot carry it
    assert "count: 5\n" in text


def test_a_policy_that_loses_a_field_says_to_whom(default: Run) -> None:
    text = default.text
    head = "  team-a/vgg16-a (MPIJob): policies istio-optout-batch-jobs, istio-optout-mpi-jobs, " \
           "mpi-topology, mpi-volcano\n"
    assert head + "    mpi-volcano: gang.backend overridden by mpi-topology (higher precedence)\n" \
        in text
    # the batch-Job opt-out matches only the launcher (a Job's pod) and loses there
    assert ("    istio-optout-batch-jobs: istio.optOut overridden by istio-optout-mpi-jobs (higher"
            " precedence) [launcher only]\n") in text
    # the shipped policies warn no one (their override is no mistake)
    assert "warning" not in text


def test_an_urgent_job_preempts_the_gang_that_loses_least_and_gets_its_gpus(
        default: Run) -> None:
    """After the reference scenario: the filler takes the free node; the urgent job, which only
    a whole node holds, has it evicted whole (one young gang, not the two older reference jobs
    on the other node) and is handed exactly the GPUs the binder assigned, a moment before the
    filler's."""
    pe = default.result.preemption
    assert pe is not None
    assert pe.evicted == ["filler"] and pe.urgent_node == pe.filler_node
    assert pe.urgent_gpus == tuple(range(8)) and pe.exact
    assert pe.preempting.startswith("gang team-a/urgent of priority 100000 preempts 1 gang(s) "
                                    "of lower priority (team-a/filler; 8 GPUs)")
    assert pe.preempted.startswith("preempted by gang team-a/urgent of priority 100000: gang "
                                   "team-a/filler (priority 0) is evicted whole")
    steps = "".join(default.steps)
    assert "[9] an urgent MPIJob of 8 workers (priority 100000): the binder evicts a gang " \
        "whole and binds it in its place ... ok" in steps
    text = default.text
    assert "  Priority and preemption (the binder's --preemption LowerPriority):" in text
    assert "    evicted whole: team-a/filler\n" in text
    assert f"placed on {pe.urgent_node}, GPUs 0,1,2,3,4,5,6,7; device plugin: exactly these " \
        "GPUs" in text


def test_a_policy_set_without_topology_skips_the_binder_and_shows_volcano(
        volcano_only: Run) -> None:
    steps = "".join(volcano_only.steps)
    assert "[6] binder: skipped — no policy asks for GPU topology" in steps
    assert "[7] kubelets: skipped — no GPU pod was bound" in steps
    assert "[8] preemption: skipped — no gang is the binder's" in steps
    assert "FAILED" not in steps and steps.count(" ok (") == 5
    assert volcano_only.result.preemption is None
    assert "Priority and preemption" not in volcano_only.text
    result = volcano_only.result
    assert result.seconds < 15
    assert result.skipped[0].startswith("binder: no policy asks for GPU topology")
    for job in result.jobs[:2]:  # mpi-volcano: team-a's MPIJobs, in the job's own queue
        assert job.pod_group is not None
        assert job.pod_group["apiVersion"] == "scheduling.volcano.sh/v1beta1"
        assert job.pod_group["spec"]["minMember"] == 5
        assert job.pod_group["spec"]["queue"] == "research"
        assert all(p.node is None for p in job.pods)
    assert [j.pod_group for j in result.jobs[2:]] == [None, None]  # no gang policy there
    text = volcano_only.text
    assert "PodGroup scheduling.volcano.sh/v1beta1 vgg16-a" in text
    assert "Modelled training throughput: none, no job was placed by Muster's binder" in text


def test_cli_prints_json_and_exits_zero_outside_the_repository(tmp_path: Path) -> None:
    """The shipped policies are package data: the default needs no checkout in the cwd."""
    proc = subprocess.run([sys.executable, "-m", "webhook", "demo", "--json"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert [j["name"] for j in doc["jobs"]] == ["vgg16-a", "vgg16-b", "vgg16-c", "vgg16-d"]
    assert doc["jobs"][3]["podGroup"]["spec"]["queue"] == "training"
    assert "[7] kubelets start the 8 bound GPU pods" in proc.stderr
    assert doc["preemption"]["evicted"] == ["filler"] and doc["preemption"]["devicePluginExact"]


@pytest.mark.parametrize(("policy", "message"), [
    (None, "no such policy path: "),
    ("apiVersion: muster.io/v1alpha1\nkind: SchedulingPolicy\nmetadata: {name: x}\n"
     "spec: {gang: {backend: nope}}\n", "bad.yaml:4:24: spec.gang.backend: Input should be"),
])
def test_cli_refuses_bad_policies_in_one_line(tmp_path: Path, policy: str | None,
                                               message: str) -> None:
    path = tmp_path / "bad.yaml"
    if policy is not None:
        path.write_text(policy)
    proc = subprocess.run([sys.executable, "-m", "webhook", "demo", "--policies", str(path)],
                          cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and proc.stdout == ""


def test_cli_without_the_emulator_says_how_to_run_it() -> None:
    """As in the image, which leaves the test doubles out (the Dockerfile)."""
    code = ("import sys; sys.modules['webhook.doubles.emulator'] = None; "
            "from webhook.cli import main; sys.exit(main(['demo']))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 1, proc.stderr
    assert "pip install . && muster demo" in proc.stderr and "Traceback" not in proc.stderr


def test_a_step_cancelled_by_ctrl_c_says_interrupted_not_failed() -> None:
    lines: list[str] = []

    async def cut_short() -> None:
        async with Progress(lines.append, tty=False).step("binder"):
            raise asyncio.CancelledError  # what asyncio.run does to the demo on Ctrl-C

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(cut_short())
    assert lines[-1].startswith("\r  [1] binder ... interrupted (")


@pytest.mark.parametrize("after", [
    "muster demo: starting the components",
    "[2] node agents: NVML discovery, device plugins registered ... ok",
    "[4] binder: waiting for gangs ... ok",
    "[6] binder: 2 gangs placed and bound (10 pods) ... ok",
    # then the demo reads what happened and stops what it started (gRPC servers, the webhook)
    "[7] kubelets start the 8 bound GPU pods: device plugin Allocate; all 10 bound pods "
    "Running ... ok",
])
def test_ctrl_c_at_any_point_ends_the_demo_with_one_line(after: str) -> None:
    # after step 7 the demo has about 0.4 s left: a signal sent from a descheduled test can
    # land after its end (exit 0), so that run is tried again rather than judged
    for _ in range(3):
        code, out, said = _interrupted_after(after)
        if code != 0:
            break
    assert code == 130 and out == b"", said
    lines = said.replace("\r", "").splitlines()  # a step's line starts with \r
    # the step cut short says so, or the command does when it was between steps
    assert len(lines) == 1 and (lines[0] == "muster demo: interrupted" or re.fullmatch(
        r"  \[\d\] .* \.\.\. interrupted \(\d+\.\d\d s\)", lines[0])), lines
    assert "Error in sys.excepthook" not in said and "Traceback" not in said


def _interrupted_after(after: str) -> tuple[int, bytes, str]:
    """SIGINT to a real `muster demo` once `after` is on its stderr: its exit code, its stdout
    and what its stderr said after that line."""
    proc = subprocess.Popen([sys.executable, "-m", "webhook", "demo"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    before = b""
    while after.encode() not in before or not before.endswith(b"\n"):
        chunk = os.read(proc.stderr.fileno(), 65536)
        assert chunk, f"the demo ended before {after!r}: {before.decode()}"
        before += chunk
    proc.send_signal(signal.SIGINT)
    out, rest = proc.communicate(timeout=60)
    return proc.returncode, out, rest.decode()


def test_cli_warns_when_it_runs_with_no_policies(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "webhook", "demo", "--policies", str(tmp_path)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.startswith(
        f"muster demo: {tmp_path}: warning: no policy files (.yaml, .yml, .json) in this "
        "directory\nmuster demo: warning: no policies: the webhook would admit every pod "
        "unchanged (no gang, no Istio opt-out, nothing for the binder)\n")
