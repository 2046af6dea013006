"""`muster policy check | test | explain` through the real CLI entry point."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

from webhook.cli import main
from webhook.demo import EXAMPLE_POLICIES
from webhook.policy import load_policies

from .conftest import REPO


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(argv)
    return code, capsys.readouterr().out


def test_the_admins_folder_is_the_packages_examples() -> None:
    """policies/ at the top (where admins edit) and the package's copy (what an installed
    `muster demo` reads) are one folder: a link, so they cannot drift."""
    assert (REPO / "policies").is_symlink()
    assert (REPO / "policies").resolve() == EXAMPLE_POLICIES


def test_readme_command_passes(capsys: pytest.CaptureFixture[str],
                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    code, out = run(["policy", "check", "policies/"], capsys)
    assert code == 0 and "15 policies valid" in out
    code, out = run(["policy", "test", "-p", "policies/", "policies/tests/"], capsys)
    assert code == 0, out
    cases = sum(text.count("kind: PolicyTest")
                for text in map(Path.read_text, (EXAMPLE_POLICIES / "tests").glob("*.yaml")))
    assert cases >= 18 and f"{cases} passed, 0 failed" in out
    assert "PASS  volcano-worker-joins-podgroup" in out
    assert "PASS  lws-worker-joins-its-groups-gang" in out


def test_check_reports_errors_and_exit_code(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run(["policy", "check", str(EXAMPLE_POLICIES)], capsys)
    assert code == 0 and "15 policies valid" in out
    bad = tmp_path / "mpi.yaml"
    bad.write_text("apiVersion: muster.io/v1alpha1\nkind: SchedulingPolicy\nmetadata:\n"
                   "  name: mpi\nspec:\n  gang:\n    backend: volcano\n    minAvailable: 0\n")
    code, out = run(["policy", "check", str(bad)], capsys)
    assert code == 1
    assert f"{bad}:8:19: spec.gang.minAvailable: must be" in out


def test_check_reports_every_problem_of_every_file_in_one_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a.yaml").write_text(
        "apiVersion: muster.io/v1alpha1\nkind: SchedulingPolicy\nmetadata: {name: a}\nspec:\n"
        "  gang: {backend: slurm}\n  match: {gpus: {min: 3, max: 1}}\n---\nspec: [x\n")
    (tmp_path / "b.yaml").write_text(
        "apiVersion: muster.io/v1alpha1\nkind: SchedulingPolicy\nmetadata: {name: a}\n"
        "spec: {istio: {optOut: all}}\n")
    code, out = run(["policy", "check", str(tmp_path)], capsys)
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    assert code == 1
    assert out.splitlines() == [
        f"{a}:5:19: spec.gang.backend: Input should be 'volcano', 'coscheduling', "
        "'muster' or 'kubernetes' (document 1, policy a)",
        f"{a}:6:31: spec.match.gpus.max: max (1) is smaller than min (3) (document 1, policy a)",
        f"{a}:8:7: '[' opened here is not closed: did not find expected ',' or ']' at line 9, "
        "column 1 (document 2)",
        f"{b}:3:18: metadata.name: duplicate policy name 'a', first defined at {a}:3:18 "
        "(document 1, policy a)",
        f"{b}:4:24: spec.istio.optOut: must be sidecar, ambient, both or none (true means "
        "sidecar, false none) (document 1, policy a)",
        "5 problems in 2 files; nothing loaded"]


def test_check_warns_of_an_owner_kind_without_its_group(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Valid, and matching nothing: the warning names the job kind most likely meant; the core
    kinds that do own pods are fine."""
    policy = tmp_path / "p.yaml"
    policy.write_text("apiVersion: muster.io/v1alpha1\nkind: SchedulingPolicy\n"
                      "metadata: {name: a}\nspec:\n  match:\n    ownerKinds: [PyTorchJob, "
                      "batch/Job, Pod, ReplicationController, Jobset, Deployment]\n")
    code, out = run(["policy", "check", str(policy)], capsys)
    assert code == 0
    no_match = "has no group, so it names a core-group kind, and no such kind owns pods: it " \
               "matches no pod;"
    assert out.splitlines() == [
        f"{policy}:6:18: warning: spec.match.ownerKinds.0: 'PyTorchJob' {no_match} did you "
        "mean kubeflow.org/PyTorchJob? (document 1, policy a)",
        f"{policy}:6:69: warning: spec.match.ownerKinds.4: 'Jobset' {no_match} did you mean "
        "jobset.x-k8s.io/JobSet? (document 1, policy a)",
        f"{policy}:6:77: warning: spec.match.ownerKinds.5: 'Deployment' {no_match} write "
        "group/Kind, e.g. kubeflow.org/MPIJob or batch/Job (document 1, policy a)",
        f"ok  a                                priority 0    {policy}:1",
        f"1 policies valid (3 warnings), digest {load_policies([policy]).digest[:12]}"]
    policy.write_text(policy.read_text().replace("{name: a}", "{name: A}"))
    code, out = run(["policy", "check", str(policy)], capsys)
    assert code == 1 and out.splitlines()[-1] == "1 problem in 1 file (3 warnings); nothing loaded"


def test_check_warns_of_an_owner_kind_in_another_case(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text("apiVersion: muster.io/v1alpha1\nkind: SchedulingPolicy\n"
                      "metadata: {name: a}\nspec:\n  match:\n    ownerKinds: [kubeflow.org/MpiJob, "
                      "apps/Statefulset, apps/StatefulSet, example.com/Mine]\n")
    code, out = run(["policy", "check", str(policy)], capsys)
    exact = "matches no pod: groups and kinds are compared exactly, case included; did you mean"
    assert code == 0 and out.splitlines()[:2] == [
        f"{policy}:6:18: warning: spec.match.ownerKinds.0: 'kubeflow.org/MpiJob' {exact} "
        "kubeflow.org/MPIJob? (document 1, policy a)",
        f"{policy}:6:39: warning: spec.match.ownerKinds.1: 'apps/Statefulset' {exact} "
        "apps/StatefulSet? (document 1, policy a)"]
    assert "1 policies valid (2 warnings)" in out  # a kind Muster does not know is no mistake


def test_check_warns_of_an_empty_file_and_an_empty_set(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty.yaml").write_text("# nothing yet\n")
    (tmp_path / "dir").mkdir()
    code, out = run(["policy", "check", str(tmp_path / "empty.yaml"), str(tmp_path / "dir")],
                    capsys)
    assert code == 0
    assert out.splitlines()[:3] == [
        f"{tmp_path}/dir: warning: no policy files (.yaml, .yml, .json) in this directory",
        f"{tmp_path}/empty.yaml: warning: holds no policy (empty, or comments only)",
        "warning: no policies: the webhook would admit every pod unchanged (no gang, no Istio "
        "opt-out, nothing for the binder)"]
    assert out.splitlines()[3].startswith("0 policies valid (3 warnings), digest ")


def test_check_reads_stdin_for_a_dash(monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    """As the topology commands do; problems there are named <stdin>."""
    bad = ("apiVersion: muster.io/v1alpha1\nkind: SchedulingPolicy\nmetadata: {name: a}\n"
           "spec: {gang: {backend: slurm}}\n")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(bad.encode())))
    code, out = run(["policy", "check", "-", str(EXAMPLE_POLICIES / "mpi-volcano.yaml")], capsys)
    assert code == 1
    assert out.splitlines()[0] == ("<stdin>:4:24: spec.gang.backend: Input should be 'volcano', "
                                   "'coscheduling', 'muster' or 'kubernetes' (document 1, "
                                   "policy a)")
    good = (EXAMPLE_POLICIES / "mpi-volcano.yaml").read_bytes()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(good)))
    code, out = run(["policy", "check", "-"], capsys)
    assert code == 0 and "ok  mpi-volcano" in out and "<stdin>:" in out


def test_check_of_a_missing_path_is_a_usage_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["policy", "check", str(EXAMPLE_POLICIES), str(tmp_path / "nope.yaml")])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert captured.err == f"muster policy: no such file or directory: {tmp_path}/nope.yaml\n"


def test_failing_policy_test_exits_1_with_diff(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    objects = EXAMPLE_POLICIES / "tests/objects"
    (tmp_path / "t.yaml").write_text(f"""
apiVersion: muster.io/v1alpha1
kind: PolicyTest
metadata: {{name: wrong-queue}}
spec:
  podFile: {objects}/worker-team-a.yaml
  ownerFiles: [{objects}/mpijob-team-a.yaml]
  expect:
    podContains:
      metadata: {{annotations: {{scheduling.volcano.sh/queue-name: training}}}}
    podGroup: {{spec: {{minMember: 4}}}}
""")
    code, out = run(["policy", "test", "-p", str(EXAMPLE_POLICIES), str(tmp_path)], capsys)
    assert code == 1
    assert "FAIL  wrong-queue" in out
    assert ('pod metadata.annotations.scheduling.volcano.sh/queue-name: expected "training", '
            'found "research"') in out
    assert "podGroup spec.minMember: expected 4, found 5" in out


def test_an_empty_warnings_list_expects_no_warning(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    objects = EXAMPLE_POLICIES / "tests/objects"
    (tmp_path / "t.yaml").write_text(f"""
apiVersion: muster.io/v1alpha1
kind: PolicyTest
metadata: {{name: quiet}}
spec:
  podFile: {objects}/worker-team-a.yaml
  expect: {{warnings: []}}
""")
    code, out = run(["policy", "test", "-p", str(EXAMPLE_POLICIES), str(tmp_path)], capsys)
    assert code == 1 and "FAIL  quiet" in out
    # the owners were not given
    assert 'warnings: expected none, got ["owner kubeflow.org/MPIJob tensorflow-topo-4-vgg16 not ' \
           'available' in out


def test_pod_mode_prints_decision_patch_and_mutated_pod(
        shared_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    objects = EXAMPLE_POLICIES / "tests/objects"
    code, out = run(["policy", "test", "-p", str(EXAMPLE_POLICIES),
                     str(shared_dir / "fixtures/admission/pod-create-worker.json"),
                     "--namespace-labels", "muster.io/gpu-topology=enabled",
                     "--owner", str(objects / "mpijob-team-a.yaml")], capsys)
    assert code == 0, out
    assert "match mpi-topology" in out and "## JSON Patch" in out and "## mutated pod" in out
    assert '"path": "/metadata/annotations"' in out
    assert "muster.io/gang-min-member: '5'" in out
    # the worker leaves Istio's ambient data plane with its launcher (istio-optout-mpi-jobs)
    assert '"path": "/metadata/labels/istio.io~1dataplane-mode"' in out
    assert "    istio.io/dataplane-mode: none\n" in out
    assert "  mpi-volcano: gang.backend overridden by mpi-topology (higher precedence)\n" in out
    assert "idempotent" in out


def test_explain_lists_every_condition(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run(["policy", "explain", "-p", str(EXAMPLE_POLICIES),
                     str(EXAMPLE_POLICIES / "tests/objects/worker-team-a.yaml")], capsys)
    assert code == 0
    assert "no     mpi-coscheduling" in out
    assert "✗ namespace team-a not in ['team-b']" in out
    assert "MATCH  mpi-volcano" in out
    # what admission does about the queue, which no offline check can know: said, not guessed
    assert "gang: minAvailable auto needs the kubeflow.org/MPIJob object" in out  # no --owner
    owner = EXAMPLE_POLICIES / "tests/objects/mpijob-team-a.yaml"
    code, out = run(["policy", "explain", "-p", str(EXAMPLE_POLICIES), "--owner", str(owner),
                     str(EXAMPLE_POLICIES / "tests/objects/worker-team-a.yaml")], capsys)
    assert code == 0
    assert "checked at admission against the cluster's Queues" in out
    assert "queue 'default' instead (gang.unavailableQueue)" in out
    assert "overridden" not in out  # mpi-topology does not match: nothing to override


def test_explain_says_which_policy_overrides_which(capsys: pytest.CaptureFixture[str]) -> None:
    """The override comes from `evaluate`, the Decision admission applies."""
    objects = EXAMPLE_POLICIES / "tests/objects"
    code, out = run(["policy", "explain", "-p", str(EXAMPLE_POLICIES),
                     "--namespace-labels", "muster.io/gpu-topology=enabled",
                     "--owner", str(objects / "mpijob-team-a.yaml"),
                     str(objects / "worker-team-a.yaml")], capsys)
    assert code == 0
    assert "MATCH  mpi-topology" in out and "MATCH  mpi-volcano" in out
    assert "\n  mpi-volcano: gang.backend overridden by mpi-topology (higher precedence)\n" in out


def test_explain_and_test_show_a_policy_not_enforced_and_what_it_would_do(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The lines come from the decision admission makes (`evaluate`), not a second reading."""
    shipped = (REPO / "webhook/demo/policies/mpi-volcano.yaml").read_text()
    (tmp_path / "mpi-volcano.yaml").write_text(
        shipped.replace("\nspec:\n", "\nspec:\n  enforcement: audit\n", 1))
    (tmp_path / "istio.yaml").write_text(
        (REPO / "webhook/demo/policies/istio-optout.yaml").read_text())
    objects = REPO / "webhook/demo/policies/tests/objects"
    owner, worker = objects / "mpijob-team-a.yaml", objects / "worker-team-a.yaml"
    code, out = run(["policy", "check", str(tmp_path)], capsys)
    assert code == 0 and [line for line in out.splitlines() if "[audit]" in line] == [
        f"ok  mpi-volcano                      priority 0    {tmp_path}/mpi-volcano.yaml:8  "
        "[audit]"]
    code, out = run(["policy", "explain", "-p", str(tmp_path), "--owner", str(owner),
                     str(worker)], capsys)
    assert code == 0
    lines = out.splitlines()
    at = lines.index("  MATCH  mpi-volcano  [audit]")
    assert lines[at + 3:at + 6] == [
        "         → not applied (audit, records it): would set",
        "             PodGroup team-a/tensorflow-topo-4-vgg16 (volcano, minMember 5, queue "
        "research)",
        "             schedulerName volcano"]
    assert "  MATCH  istio-optout-mpi-jobs" in lines  # enforced: no mark
    assert "gang tensorflow-topo-4-vgg16" not in out  # no gang is formed
    code, out = run(["policy", "test", "-p", str(tmp_path), str(worker), "--owner", str(owner)],
                    capsys)
    assert code == 0
    assert "  match mpi-volcano  [audit]: ✓ namespace team-a" in out
    assert "  not applied: policy mpi-volcano (audit) would set PodGroup " in out
    assert "scheduling.k8s.io/group-name" not in out.split("## JSON Patch")[1]


def test_policytest_file_problems_are_one_line_each_with_their_place(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    head = "apiVersion: muster.io/v1alpha1\nkind: PolicyTest\nmetadata: {name: t}\nspec:\n"
    (tmp_path / "a.yaml").write_text(head + "  podFile: [pod.yaml\n")
    (tmp_path / "b.yaml").write_text(head + "  podFile: pod.yaml\n  expect: {polcies: []}\n")
    code, out = run(["policy", "test", "-p", str(EXAMPLE_POLICIES), str(tmp_path)], capsys)
    assert code == 1
    assert out.splitlines() == [
        f"ERROR {tmp_path}/a.yaml:5:12: '[' opened here is not closed: did not find expected ',' "
        "or ']' at line 6, column 1 (document 1)",
        f"ERROR {tmp_path}/b.yaml:6:12: spec.expect.polcies: unknown field (allowed: policies, "
        "podContains, patchedPod, patchedPodFile, podGroup, warnings) (document 1)"]


def test_a_policytest_typo_reads_as_a_policy_typo(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The same words as `policy check` for the same mistakes: an unknown field names the
    allowed ones, a missing one says so, a rule across fields has no pydantic prefix."""
    head = "apiVersion: muster.io/v1alpha1\nkind: PolicyTest\n"
    (tmp_path / "t.yaml").write_text(
        head + "metadata: {nme: t}\nspec: {pod: {}, namespaceLabel: {}}\n---\n"
        + head + "metadata: {name: t}\nspec: {pod: {}, podFile: p.yaml}\n")
    code, out = run(["policy", "test", "-p", str(EXAMPLE_POLICIES), str(tmp_path)], capsys)
    assert code == 1
    t = tmp_path / "t.yaml"
    assert out.splitlines() == [
        f"ERROR {t}:3:1: metadata.name: required field is missing (document 1)",
        f"ERROR {t}:3:12: metadata.nme: unknown field (allowed: name) (document 1)",
        f"ERROR {t}:4:17: spec.namespaceLabel: unknown field (allowed: pod, podFile, "
        "jobFile, jobPod, namespaceLabels, owners, ownerFiles, expect) (document 1)",
        f"ERROR {t}:9:7: spec: give exactly one of pod, podFile and jobFile (document 2)"]


def test_check_and_test_refuse_aliases_at_their_place(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An alias bomb (10**7 leaves once expanded) is one error line, at once."""
    rows = ["    a0: &a0 [x, x, x, x, x, x, x, x, x, x]",
            *(f"    a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 7))]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("apiVersion: muster.io/v1alpha1\nkind: SchedulingPolicy\nmetadata: {name: b}\n"
                    "spec:\n  labels:\n" + "\n".join(rows) + "\n")
    code, out = run(["policy", "check", str(bomb)], capsys)
    assert code == 1
    assert out.splitlines()[0] == (
        f"{bomb}:7:14: alias *a0: aliases are not accepted (write the value out) (document 1)")
    cases = tmp_path / "cases"
    cases.mkdir()
    (cases / "t.yaml").write_text(
        "apiVersion: muster.io/v1alpha1\nkind: PolicyTest\nmetadata: {name: t}\nspec:\n"
        "  pod: &pod {metadata: {name: p}}\n  owners: [*pod]\n")
    code, out = run(["policy", "test", "-p", str(EXAMPLE_POLICIES), str(cases)], capsys)
    assert code == 1
    assert out.splitlines() == [f"ERROR {cases}/t.yaml:6:12: alias *pod: aliases are not "
                                "accepted (write the value out) (document 1)"]


def manifest_bomb(levels: int) -> str:
    """A pod whose labels expand to 10**levels leaves through aliases (656 bytes at 7 levels
    took 31 s and all memory in `muster policy test | explain`, security review #54)."""
    rows = ["    a0: &a0 [x, x, x, x, x, x, x, x, x, x]",
            *(f"    a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, levels))]
    return ("apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  namespace: team-a\n"
            "  annotations:\n" + "\n".join(rows) + "\nspec:\n  containers: [{name: c}]\n")


@pytest.mark.parametrize("command", [["test"], ["explain"]])
@pytest.mark.parametrize("as_owner", [False, True])
def test_an_alias_bomb_in_a_manifest_is_refused_at_its_first_alias(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str],
        as_owner: bool) -> None:
    """Manifests are read as policies are: aliases refused before anything expands them (a
    small bomb here, so that the command without the limit ends too)."""
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(manifest_bomb(5))
    pod = EXAMPLE_POLICIES / "tests/objects/mpijob-team-a.yaml"
    target, flags = (pod, ["--owner", str(bomb)]) if as_owner else (bomb, [])
    code = main(["policy", *command, "-p", str(EXAMPLE_POLICIES), str(target), *flags])
    out, err = capsys.readouterr()
    assert (code, out) == (2, "")
    flag = "--owner " if as_owner else ""
    assert f"{flag}{bomb} is not valid YAML: {bomb}:8:14: alias *a0: aliases are not accepted " \
           "(write the value out)" in err


def test_explain_a_job_explains_each_pod_its_operator_creates(
        capsys: pytest.CaptureFixture[str]) -> None:
    """As `kyverno apply` takes resources: an MPIJob is the launcher (through its Job) and the
    workers, each explained as a pod, headed by its name and what owns it."""
    job = EXAMPLE_POLICIES / "tests/objects/mpijob-team-a.yaml"
    code, out = run(["policy", "explain", "-p", str(EXAMPLE_POLICIES), str(job)], capsys)
    assert code == 0
    name = "tensorflow-topo-4-vgg16"
    headings = [line for line in out.splitlines() if not line.startswith(" ")]
    assert headings == [
        f"{job}: pod team-a/{name}-launcher-* (owned by Job {name}-launcher, MPIJob {name})",
        *(f"{job}: pod team-a/{name}-worker-{i} (owned by MPIJob {name})" for i in range(4))]
    blocks = out.split(f"{job}: pod ")[1:]
    assert all("MATCH  mpi-volcano" in b and f"gang {name}: Volcano queue 'research'" in b
               for b in blocks)
    assert "✓ owned by batch/Job" in blocks[0] and "owned by batch/Job" not in blocks[1]
    # the same worker, captured from a cluster and given with its owner, reads the same
    worker = EXAMPLE_POLICIES / "tests/objects/worker-team-a.yaml"
    code, alone = run(["policy", "explain", "-p", str(EXAMPLE_POLICIES), "--owner", str(job),
                       str(worker)], capsys)
    assert alone.split("\n", 1)[1] == blocks[1].split("\n", 1)[1]


def test_policy_test_on_a_job_tests_each_pod(capsys: pytest.CaptureFixture[str],
                                             tmp_path: Path) -> None:
    """A PyTorchJob written by hand (no uid, as before `kubectl apply`): each of its pods gets
    the decision, PodGroup, patch and idempotency check of a pod."""
    text = (EXAMPLE_POLICIES / "tests/objects/pytorchjob-elastic.yaml").read_text()
    job = tmp_path / "job.yaml"
    job.write_text("\n".join(line for line in text.splitlines() if "uid:" not in line))
    code, out = run(["policy", "test", "-p", str(EXAMPLE_POLICIES), str(job)], capsys)
    assert code == 0
    headings = [line for line in out.splitlines() if line.startswith("# ")]
    assert headings == [f"# {job}: pod team-d/elastic-bert-worker-{i} (owned by PyTorchJob "
                        "elastic-bert)" for i in range(4)]
    assert out.count("match pytorchjob-volcano") == 4
    assert out.count("  minMember: 2\n") == 4  # the elastic minimum, in each pod's PodGroup
    assert out.count("idempotent: evaluating the mutated pod again gives an empty patch") == 4


NAMESPACE_A = ("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: team-a\n"
               "  labels: {muster.io/gpu-topology: enabled}\n")
DEPLOYMENT = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web, namespace: team-a}\n"
KNOWN = "give a Pod, or a job of a kind Muster knows (MPIJob, PyTorchJob, TFJob, Job, JobSet, " \
        "TrainJob, LeaderWorkerSet)"


def test_every_document_of_a_manifest_is_read(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """`kubectl apply -f` files: the Namespace gives its labels to the job's pods, the job is
    explained, a kind Muster does not know is named and skipped."""
    job = (EXAMPLE_POLICIES / "tests/objects/mpijob-team-a.yaml").read_text()
    manifest = tmp_path / "all.yaml"
    manifest.write_text(f"{NAMESPACE_A}---\n{job}---\n{DEPLOYMENT}")
    for command in ("explain", "test"):
        code, out = run(["policy", command, "-p", str(EXAMPLE_POLICIES), str(manifest)], capsys)
        assert code == 0, out
        lead = "# " if command == "test" else ""
        assert out.startswith(f"{lead}{manifest}: skipped document 3: apps/Deployment web is "
                              f"not supported: {KNOWN}\n")
        assert out.count(f"{manifest}: pod team-a/tensorflow-topo-4-vgg16-") == 5
    # the Namespace's label selects mpi-topology (the binder) over mpi-volcano
    assert "  MATCH  mpi-topology\n         ✓ namespaceSelector: matches" in \
        run(["policy", "explain", "-p", str(EXAMPLE_POLICIES), str(manifest)], capsys)[1]
    manifest.write_text(job)
    assert "MATCH  mpi-topology" not in \
        run(["policy", "explain", "-p", str(EXAMPLE_POLICIES), str(manifest)], capsys)[1]


@pytest.mark.parametrize(("text", "says"), [
    ("apiVersion: ray.io/v1\nkind: RayJob\nmetadata: {name: r}\n",
     f"r.yaml: ray.io/RayJob r is not supported: {KNOWN}"),
    (DEPLOYMENT, f"r.yaml: apps/Deployment web is not supported: {KNOWN}"),
    (f"{NAMESPACE_A}---\n{DEPLOYMENT}", "r.yaml: nothing to explain: document 2: apps/Deployment "
     f"web is not supported: {KNOWN}"),
    ("metadata: {name: p}\nspec: {containers: []}\n", "r.yaml: not a Kubernetes object (no kind)"),
])
def test_a_kind_muster_does_not_know_is_never_taken_for_a_pod(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, says: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("r.yaml").write_text(text)
    for command in ("explain", "test"):
        assert main(["policy", command, "-p", str(EXAMPLE_POLICIES), "r.yaml"]) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err == f"muster policy: {says}\n"


def test_a_policytest_job_file_names_each_failing_pod(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    objects = EXAMPLE_POLICIES / "tests/objects"
    name = "tensorflow-topo-4-vgg16"
    case = ("apiVersion: muster.io/v1alpha1\nkind: PolicyTest\nmetadata: {{name: {n}}}\n"
            "spec:\n  jobFile: {job}\n{more}  expect: {{policies: [istio-optout-mpi-jobs, "
            "mpi-volcano]}}\n")
    (tmp_path / "ray.yaml").write_text("apiVersion: ray.io/v1\nkind: RayJob\nmetadata: {name: r}\n")
    job = objects / "mpijob-team-a.yaml"
    (tmp_path / "t.yaml").write_text("---\n".join([
        case.format(n="all", job=job, more=""),
        case.format(n="one", job=job, more=f"  jobPod: {name}-worker-3\n"),
        case.format(n="none", job=job, more="  jobPod: nope\n"),
        case.format(n="ray", job="ray.yaml", more="")]))
    code, out = run(["policy", "test", "-p", str(EXAMPLE_POLICIES), str(tmp_path / "t.yaml")],
                    capsys)
    assert code == 1
    # the launcher is a batch Job's pod too: only it fails
    assert (f"      pod {name}-launcher-*: policies: expected ['istio-optout-mpi-jobs', "
            "'mpi-volcano'], applied ['istio-optout-mpi-jobs', 'istio-optout-batch-jobs', "
            "'mpi-volcano']\n") in out
    assert out.count("policies: expected") == 1 and "PASS  one " in out
    assert (f"      cannot read test input: jobPod nope: the job creates no such pod (its pods: "
            f"{name}-launcher-*, {name}-worker-0, {name}-worker-1, {name}-worker-2, "
            f"{name}-worker-3)\n") in out
    assert (f"      cannot read test input: jobFile ray.yaml: ray.io/RayJob r is not supported: "
            f"{KNOWN}\n") in out


def test_check_warns_of_a_network_level_the_binder_does_not_name(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text("apiVersion: muster.io/v1alpha1\nkind: SchedulingPolicy\n"
                      "metadata: {name: a}\nspec:\n  gang: {backend: muster}\n"
                      "  topology:\n    mode: required\n    network: {required: rack, "
                      "preferred: kubernetes.io/hostname,\n      slice: {level: example.com/nvl, "
                      "size: 4}}\n")
    levels = "example.com/block,example.com/rack,nvl=example.com/nvlink"
    code, out = run(["policy", "check", str(policy), "--network-levels", levels], capsys)
    known = "example.com/block, example.com/rack, example.com/nvlink, nvl"
    assert code == 0 and out.splitlines()[:2] == [
        f"{policy}:1: warning: spec.topology.network.required: 'rack' is no level of the "
        f"binder's ({known}): a gang is placed by a node label 'rack' alone; did you mean "
        "example.com/rack? (policy a)",
        f"{policy}:1: warning: spec.topology.network.slice.level: 'example.com/nvl' is no level "
        f"of the binder's ({known}): a gang is placed by a node label 'example.com/nvl' alone; "
        "did you mean nvl? (policy a)"]
    assert "1 policies valid (2 warnings)" in out  # the node is always a level
    # the alias, the label: nothing to say; the levels the cluster holds are not known here
    for fine in ("rack=example.com/rack,example.com/nvl", "topograph", "kueue:default"):
        code, out = run(["policy", "check", str(policy), "--network-levels", fine], capsys)
        assert code == 0 and "warning" not in out, (fine, out)


def test_the_shipped_network_policies_name_the_levels_their_comments_give(
        capsys: pytest.CaptureFixture[str]) -> None:
    levels = ("network.topology.nvidia.com/spine,network.topology.nvidia.com/leaf,"
              "nvidia.com/gpu.clique")
    code, out = run(["policy", "check", str(EXAMPLE_POLICIES), "--network-levels", levels],
                    capsys)
    assert code == 0 and "warning" not in out
