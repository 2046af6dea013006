"""The admins' workflow with the chart: `muster policy pack policies/` writes the values file that
`helm upgrade -f` takes, and `muster policy check` reads that file or what `helm template`
renders from it, so a broken policy fails before install, offline (helm itself renders it)."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest
import yaml
from chart_helpers import CHART, NAMESPACE, REPO, one, run_helm

from webhook.cli import main
from webhook.policy import load_policies

POLICIES = REPO / "policies"
BAD = ("apiVersion: muster.io/v1alpha1\nkind: SchedulingPolicy\nmetadata: {name: a}\n"
       "spec: {gang: {backend: slurm}}\n")


def _render(tmp: Path, values: Path) -> Path:
    """`helm template` of the chart with this values file, written where check reads it."""
    proc = run_helm("template", "muster", str(CHART), "--namespace", NAMESPACE, "-f",
                    str(values))
    assert proc.returncode == 0, proc.stderr
    out = tmp / "rendered.yaml"
    out.write_text(proc.stdout)
    return out


def _pack(tmp: Path, capsys: pytest.CaptureFixture[str], *paths: str) -> Path:
    assert main(["policy", "pack", *paths]) == 0
    values = tmp / "values-policies.yaml"
    values.write_text(capsys.readouterr().out)
    return values


def test_packed_policies_render_as_written_and_check_as_the_folder_does(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    values = _pack(tmp_path, capsys, "policies/")
    rendered = _render(tmp_path, values)
    configmap = one([d for d in yaml.safe_load_all(rendered.read_text()) if d], "ConfigMap",
                    "muster-policies")
    files = sorted(POLICIES.glob("*.yaml"))
    for file in files:  # the chart writes each text as a `|-` block: the last newline goes
        assert configmap["data"][file.name] == file.read_text().rstrip("\n"), file.name
    folder = load_policies([POLICIES])
    assert main(["policy", "check", str(values)]) == 0
    said = capsys.readouterr().out
    assert said.endswith(f"{len(folder)} policies valid, digest {folder.digest[:12]}\n")
    assert f"ok  mpi-volcano                      priority 0    {values}[mpi-volcano.yaml]:8" \
        in said
    assert main(["policy", "check", str(rendered)]) == 0
    # the rendered ConfigMap also holds the chart's `helm test` policy (tests.selftestPolicy)
    assert f"{len(folder) + 1} policies valid" in capsys.readouterr().out


def test_a_broken_policy_that_helm_renders_fails_check_at_its_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"policies": {"team-a.yaml": BAD}}))
    rendered = _render(tmp_path, values)  # helm (and its schema) let it through
    message = "spec.gang.backend: Input should be 'volcano'"
    assert main(["policy", "check", str(rendered)]) == 1
    out = capsys.readouterr().out
    assert f"{rendered}[ConfigMap muster-policies/team-a.yaml]:4:24: {message}" in out
    assert out.endswith("1 problem in 1 file; nothing loaded\n")
    assert main(["policy", "check", str(values)]) == 1
    assert f"{values}[team-a.yaml]:4:24: {message}" in capsys.readouterr().out
    # `helm template ... | muster policy check -`
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(rendered.read_bytes())))
    assert main(["policy", "check", "-"]) == 1
    assert f"<stdin>[ConfigMap muster-policies/team-a.yaml]:4:24: {message}" in \
        capsys.readouterr().out


def test_values_entries_the_chart_refuses_are_problems_at_their_place(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    values = tmp_path / "values.yaml"
    values.write_text("webhook: {replicas: 2}\npolicies:\n  bad name.yaml: x\n"
                      "  a.yaml: {kind: SchedulingPolicy}\n")
    assert main(["policy", "check", str(values)]) == 1
    assert capsys.readouterr().out.splitlines() == [
        f"{values}:3:18: policies.bad name.yaml: the chart takes file names of letters, digits, "
        "'-', '_' and '.', ending in .yaml or .yml (document 1)",
        f"{values}:4:11: policies.a.yaml: must be a policy file's text, got dict (document 1)",
        "2 problems in 1 file; nothing loaded"]


def test_pack_writes_nothing_for_policies_with_problems(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a.yaml").write_text(BAD)
    assert main(["policy", "pack", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.endswith("1 problem; nothing packed\n")
    assert f"{tmp_path}/a.yaml:4:24: spec.gang.backend" in captured.err


@pytest.mark.parametrize(("files", "says"), [
    ({"a.json": '{"apiVersion": "muster.io/v1alpha1", "kind": "SchedulingPolicy", '
                '"metadata": {"name": "a"}, "spec": {}}'},
     "a.json: the chart takes file names of letters, digits, '-', '_' and '.', ending in .yaml "
     "or .yml: rename it"),
    ({"a.yaml": BAD.replace("slurm", "muster"),
      "sub/a.yaml": BAD.replace("slurm", "muster").replace("{name: a}", "{name: b}")},
     "the chart keys policies by file name, and both have this one: rename one"),
])
def test_pack_refuses_what_the_chart_cannot_key(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], files: dict[str, str],
        says: str) -> None:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    paths = sorted({str((tmp_path / n).parent) for n in files})
    assert main(["policy", "pack", *paths]) == 2
    err = capsys.readouterr().err
    assert err.startswith("muster policy: ") and says in err and len(err.splitlines()) == 1
