"""The admins' workflow with the chart: `muster policy pack policies/` writes the values file that
`helm upgrade -f` takes, and `muster policy check` reads that file or what `helm template`
renders from it, so a broken policy fails before install, offline (helm itself renders it)."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest
import yaml
from chart_helpers import CHART, NAMESPACE, REPO, one, run_helm

from webhook.cli import main
from webhook.policy import chart, helmvalues, load_policies
from webhook.policy.chart import MAX_CHART_BYTES
from webhook.policy.loader import MAX_SET_BYTES
from webhook.yamlpos import MAX_BYTES

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
        f"{values}:4:11: policies.a.yaml: must be a policy file's text, got a mapping (document 1)",
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


#: a policy naming the level `rack`: a level of the binder's only as an alias
RACK = ("apiVersion: muster.io/v1alpha1\nkind: SchedulingPolicy\nmetadata: {name: a}\n"
        "spec:\n  match: {ownerKinds: [batch/Job]}\n  gang: {backend: muster}\n"
        "  topology: {mode: preferred, network: {required: rack}}\n")
LEVELS = [{"nodeLabel": "example.com/block"}, {"nodeLabel": "example.com/rack", "alias": "rk"}]
KNOWN = "example.com/block, example.com/rack, rk"


def _level_warnings(capsys: pytest.CaptureFixture[str], *args: str) -> list[str]:
    assert main(["policy", "check", *args]) == 0
    return [line for line in capsys.readouterr().out.splitlines() if ": warning: " in line]


def _rack_warning(policy_at: str, source: str) -> list[str]:
    return [f"{policy_at}:1: warning: spec.topology.network.required: 'rack' is no level of the "
            f"binder's ({KNOWN}; from {source}): a gang is placed by a node label 'rack' alone; "
            "did you mean example.com/rack? (policy a)"]


@pytest.mark.parametrize("binder", [
    {"networkLevels": LEVELS},
    # rendered after networkLevels, so the binder's parser keeps this one
    {"networkLevels": ["x.io/zone"], "extraArgs": ["--network-levels=example.com/block,"
                                                   "rk=example.com/rack"]},
])
def test_check_warns_of_levels_by_the_binders_levels_in_the_values_and_what_helm_renders(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], binder: dict[str, object]) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"binder": binder, "policies": {"a.yaml": RACK}}))
    field = "extraArgs" if "extraArgs" in binder else "networkLevels"
    assert _level_warnings(capsys, str(values)) == _rack_warning(
        f"{values}[a.yaml]", f"{values} binder.{field}")
    rendered = _render(tmp_path, values)
    assert _level_warnings(capsys, str(rendered)) == _rack_warning(
        f"{rendered}[ConfigMap muster-policies/a.yaml]",
        f"{rendered}[Deployment muster-binder] --network-levels")
    for path in (values, rendered):  # --network-levels beats both
        assert _level_warnings(capsys, str(path), "--network-levels",
                               "rack=example.com/rack") == []


def test_without_levels_check_takes_the_charts_default_none(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The chart ships no levels: its binder then places a gang by the label a policy names,
    so no level is unknown to it and check says nothing."""
    shipped = yaml.safe_load((CHART / "values.yaml").read_text())["binder"]["networkLevels"]
    assert list(chart.DEFAULT_NETWORK_LEVELS) == shipped
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"policies": {"a.yaml": RACK}}))
    rendered = _render(tmp_path, values)
    assert "--network-levels" not in rendered.read_text()
    for path in (values, rendered):
        assert _level_warnings(capsys, str(path)) == []
    given = chart.binder_levels([(str(values), values.read_bytes())])
    assert given == chart.BinderLevels(None, f"{values} binder.networkLevels (the chart's "
                                       "default)", explicit=False)


def test_levels_in_the_values_that_the_binder_refuses_are_a_warning(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"binder": {"networkLevels": [
        {"nodeLabel": "example.com/rack", "alias": "example.com/rack"}]},
        "policies": {"a.yaml": RACK}}))
    assert _level_warnings(capsys, str(values)) == [
        f"{values} binder.networkLevels: warning: level 1: alias example.com/rack is a level's "
        "node label: the binder refuses these levels (it would not start)"]


def _sized(total: int, count: int = 5) -> list[tuple[str, str]]:
    """`count` policy files, each within a file's limit, whose texts hold `total` bytes together
    (padded with comment lines)."""
    files = []
    for i in range(count):
        text = BAD.replace("slurm", "volcano").replace("{name: a}", f"{{name: p{i}}}")
        lines, rest = divmod(total // count + (total % count) * (i == count - 1) - len(text), 64)
        if rest == 1:  # a line of one byte would be an empty line: one longer line instead
            lines, rest = lines - 1, 65
        text += ("#" * 63 + "\n") * lines + ("#" * (rest - 1) + "\n") * (rest > 0)
        files.append((f"p{i}.yaml", text))
    assert sum(len(t) for _, t in files) == total and max(len(t) for _, t in files) <= MAX_BYTES
    return files


def test_a_values_file_holds_a_set_up_to_what_a_configmap_takes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """1 MiB of policies (a ConfigMap's data) make a larger values file: pack indents them."""
    values = tmp_path / "values.yaml"
    values.write_text(chart.pack(_sized(MAX_SET_BYTES), ["p/"]))
    assert values.stat().st_size > MAX_SET_BYTES
    assert main(["policy", "check", str(values)]) == 0
    assert "5 policies valid" in capsys.readouterr().out
    values.write_text(chart.pack(_sized(MAX_SET_BYTES + 1), ["p/"]))
    assert main(["policy", "check", str(values)]) == 1
    assert capsys.readouterr().out.splitlines()[0] == (
        f"{values}[p4.yaml]: the files of the set hold more than 1024 KiB, the most a policy set "
        "may hold; nothing was checked")


def test_a_chart_file_is_read_up_to_its_limit_a_policy_file_up_to_its_own(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    values = tmp_path / "values.yaml"
    packed = chart.pack(_sized(100_000, count=1), ["p/"])
    pad = MAX_CHART_BYTES - len(packed)  # comment lines outside the policies
    values.write_text(packed + ("#" * 99 + "\n") * (pad // 100) + "#" * (pad % 100 - 1) + "\n")
    assert values.stat().st_size == MAX_CHART_BYTES
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(values.read_bytes())))
    assert main(["policy", "check", str(values), "-"]) == 0  # both read whole: the last wins
    assert "<stdin>[p0.yaml]:" in capsys.readouterr().out
    too_large = (f"larger than {MAX_BYTES // 1024} KiB, the most a policy file may hold (a "
                 f"values file or helm template's output: {MAX_CHART_BYTES // 1024} KiB)")
    values.write_text(values.read_text() + "#\n")
    plain = tmp_path / "plain.yaml"
    plain.write_text(BAD.replace("slurm", "volcano") + "#" * MAX_BYTES + "\n")
    for path in (values, plain):
        assert main(["policy", "check", str(path)]) == 1
        assert capsys.readouterr().out.splitlines()[0] == f"{path}: {too_large}"
    # inside a values file, each policy file keeps its own limit (the webhook's)
    values.write_text(chart.pack([("big.yaml", plain.read_text())], ["p/"]))
    assert main(["policy", "check", str(values)]) == 1
    assert capsys.readouterr().out.splitlines()[0] == (
        f"{values}[big.yaml]: larger than {MAX_BYTES // 1024} KiB, the most a file may hold")


def test_what_helm_renders_of_a_full_set_is_read_whole(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The rendered set is written twice (the ConfigMap, the check hook's copy), indented: more
    than 2 MiB for the 1 MiB the ConfigMap takes, which then has no room for the chart's own
    `helm test` policy."""
    values = tmp_path / "values.yaml"
    values.write_text(chart.pack(_sized(MAX_SET_BYTES), ["p/"]))
    rendered = _render(tmp_path, values)
    assert rendered.stat().st_size > 2 * MAX_SET_BYTES
    assert main(["policy", "check", str(rendered)]) == 1
    assert "the files of the set hold more than 1024 KiB" in capsys.readouterr().out
    proc = run_helm("template", "muster", str(CHART), "--namespace", NAMESPACE, "-f",
                    str(values), "--set", "tests.selftestPolicy=false")
    assert proc.returncode == 0, proc.stderr
    rendered.write_text(proc.stdout)
    assert main(["policy", "check", str(rendered)]) == 0
    assert "5 policies valid" in capsys.readouterr().out


def _values(tmp: Path, name: str, values: object) -> Path:
    path = tmp / name
    path.write_text(yaml.safe_dump(values))
    return path


def _render_all(tmp: Path, *values: Path) -> Path:
    """`helm template` with `-f` for each values file, in order."""
    proc = run_helm("template", "muster", str(CHART), "--namespace", NAMESPACE,
                    *(arg for v in values for arg in ("-f", str(v))))
    assert proc.returncode == 0, proc.stderr
    out = tmp / "rendered.yaml"
    out.write_text(proc.stdout)
    return out


def _ok_lines(capsys: pytest.CaptureFixture[str], *args: str) -> list[str]:
    assert main(["policy", "check", *args]) == 0
    return [line.split()[1] for line in capsys.readouterr().out.splitlines()
            if line.startswith("ok  ")]


#: RACK naming the binder's label itself: no warning by any levels that hold it
RACK_LABEL = RACK.replace("required: rack", "required: example.com/rack")
OTHER = RACK_LABEL.replace("{name: a}", "{name: b}")


def test_values_files_merge_their_policies_as_helm_does(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`helm -f base.yaml -f team.yaml`: a later file's entry replaces the earlier one of that
    name, the others stay; each is named by the file that set it."""
    base = _values(tmp_path, "base.yaml", {"binder": {"networkLevels": LEVELS},
                                           "policies": {"a.yaml": RACK, "b.yaml": OTHER}})
    team = _values(tmp_path, "team.yaml", {"policies": {"a.yaml": RACK_LABEL}})
    assert main(["policy", "check", str(base), str(team)]) == 0
    out = capsys.readouterr().out
    assert f"{team}[a.yaml]:1" in out and f"{base}[b.yaml]:1" in out
    assert "2 policies valid, digest" in out  # the rack warning went with base's a.yaml
    rendered = _render_all(tmp_path, base, team)
    assert sorted(_ok_lines(capsys, str(base), str(team))) == \
        sorted(n for n in _ok_lines(capsys, str(rendered)) if n != "muster-selftest")
    # `policies: null` clears them, as Helm's null removes a value
    cleared = _values(tmp_path, "cleared.yaml", {"policies": None})
    assert _ok_lines(capsys, str(base), str(cleared)) == []


def test_a_later_values_file_sets_the_binders_levels_without_policies(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = _values(tmp_path, "base.yaml", {"binder": {"networkLevels": LEVELS},
                                           "policies": {"a.yaml": RACK}})
    rack = [{"nodeLabel": "example.com/rack", "alias": "rack"}]
    levels = _values(tmp_path, "levels.yaml", {"binder": {"networkLevels": rack}})
    assert _level_warnings(capsys, str(base), str(levels)) == []
    assert _level_warnings(capsys, str(_render_all(tmp_path, base, levels))) == []
    # the other way round, base's levels win
    assert _level_warnings(capsys, str(levels), str(base)) == _rack_warning(
        f"{base}[a.yaml]", f"{base} binder.networkLevels")
    # a values file of other values changes nothing of them
    other = _values(tmp_path, "other.yaml", {"webhook": {"replicas": 3}})
    assert _level_warnings(capsys, str(base), str(other)) == _rack_warning(
        f"{base}[a.yaml]", f"{base} binder.networkLevels")


def test_a_later_values_files_list_replaces_the_earlier_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """binder.extraArgs is a list: a later file's replaces it whole, so the --network-levels
    of base's extraArgs go and base's networkLevels (merged into binder) apply."""
    base = _values(tmp_path, "base.yaml", {"binder": {
        "networkLevels": LEVELS, "extraArgs": ["--network-levels=rack=example.com/rack"]},
        "policies": {"a.yaml": RACK}})
    assert _level_warnings(capsys, str(base)) == []
    no_args = _values(tmp_path, "no-args.yaml", {"binder": {"extraArgs": []}})
    rendered = _render_all(tmp_path, base, no_args)
    assert _level_warnings(capsys, str(rendered)) == _rack_warning(
        f"{rendered}[ConfigMap muster-policies/a.yaml]",
        f"{rendered}[Deployment muster-binder] --network-levels")
    assert _level_warnings(capsys, str(base), str(no_args)) == _rack_warning(
        f"{base}[a.yaml]", f"{base} binder.networkLevels")


def test_a_values_file_that_is_no_map_is_a_problem(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = _values(tmp_path, "base.yaml", {"policies": {"a.yaml": RACK}})
    listed = _values(tmp_path, "listed.yaml", {"policies": ["a.yaml"]})
    whole = tmp_path / "whole.yaml"
    whole.write_text("- policies\n")
    assert main(["policy", "check", str(base), str(listed)]) == 1
    assert capsys.readouterr().out.splitlines() == [
        f"{listed}:2:1: policies: must be a map of file names to policy texts, got a list "
        "(document 1)", "1 problem in 1 file; nothing loaded"]
    assert main(["policy", "check", str(base), str(whole)]) == 1
    assert capsys.readouterr().out.splitlines() == [
        f"{whole}:1:1: a Helm values file or a policy document must be a mapping, got a list "
        "(document 1)", "1 problem in 1 file; nothing loaded"]


def test_a_values_file_is_told_by_the_values_the_chart_takes() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert set(schema["properties"]) == helmvalues.VALUE_KEYS
    assert schema["additionalProperties"] is False  # so a values file sets only these
