"""Loader: every error kind names file, document, line, column and field path; ConfigMap layout."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from webhook.policy import PolicyError, load_policies, load_policy_texts

from .conftest import REPO, policy

GOOD = policy("good", """
match:
  namespaces: [team-a]
gang:
  backend: volcano
""")


def issues_of(texts: dict[str, str]) -> list[str]:
    with pytest.raises(PolicyError) as info:
        load_policy_texts(texts)
    return [str(i) for i in info.value.issues]


def test_shipped_policies_are_valid() -> None:
    loaded = load_policies([REPO / "policies"])
    assert set(loaded.names) == {"mpi-volcano", "mpi-coscheduling", "mpi-topology",
                                 "istio-optout-mpi-jobs", "istio-optout-batch-jobs"}
    assert loaded.names[0] == "mpi-topology"  # highest priority first
    assert len(loaded.digest) == 64


def test_bad_min_available_names_exact_place() -> None:
    text = textwrap.dedent("""\
        # comment line
        apiVersion: muster.io/v1alpha1
        kind: SchedulingPolicy
        metadata:
          name: mpi
        spec:
          gang:
            backend: volcano
            minAvailable: -2
        """)
    [msg] = issues_of({"policies/mpi.yaml": text})
    assert msg.startswith("policies/mpi.yaml:9:19: spec.gang.minAvailable: must be \"auto\", an "
                          "integer ≥ 1 or a percentage")
    assert "(document 1, policy mpi)" in msg


@pytest.mark.parametrize(("bad", "where", "message"), [
    ("gang:\n  backend: slurm", ":7:14: spec.gang.backend:",
     "'volcano', 'coscheduling' or 'muster'"),
    ("gang:\n  backend: volcano\n  minAvailable: 150%", ":8:19: spec.gang.minAvailable:",
     "percentage"),
    ("gang:\n  backend: volcano\n  quue: x", ":8:5: spec.gang.quue:",
     "unknown field (allowed: backend, minAvailable"),
    ("gang:\n  minAvailable: 2", ":6:3: spec.gang.backend:", "required field is missing"),
    ("gang:\n  backend: volcano\n  minResources: {cpu: lots}", ":8:19: spec.gang.minResources:",
     "cpu: 'lots' is not a resource quantity"),
    ("gang:\n  backend: volcano\n  queue: Research", ":8:12: spec.gang.queue:",
     "not a valid queue name"),
    ("match:\n  ownerKinds: [mpijob]", ":7:18: spec.match.ownerKinds.0:", "not an owner kind"),
    ("match:\n  gpus: {min: 4, max: 2}", ":7:25: spec.match.gpus.max:", "smaller than min (4)"),
    ("match:\n  podSelector:\n    matchExpressions:\n    - {key: a, operator: In}",
     ":9:9: spec.match.podSelector.matchExpressions.0.values:", "needs at least one value"),
    ("match:\n  podSelector:\n    matchLabels: {sidecar.istio.io/inject: 'true'}",
     ":8:7: spec.match.podSelector:", "Muster writes that label itself"),
    ("labels:\n  muster.io/gang-name: x", ":7:5: spec.labels.muster.io/gang-name:",
     "written by Muster itself"),
    ("labels:\n  team: 'a b'", ":7:11: spec.labels.team:", "not a valid label value"),
    ("topology:\n  mode: required", ":7:11: spec.topology.mode:",
     "needs gang backend muster (Muster's binder does topology-aware placement), got no gang"),
    ("gang: {backend: volcano}\ntopology: {mode: preferred}", ":7:20: spec.topology.mode:",
     "got backend volcano"),
    ("gang: {backend: muster}\ntopology: {mode: 'off', singleNode: true}",
     ":7:20: spec.topology.mode:", "mode off turns topology placement off"),
    ("gang: {backend: coscheduling, queue: q}", ":6:40: spec.gang.queue:",
     "backend coscheduling has no queues"),
    ("gang: {backend: volcano, scheduleTimeoutSeconds: 60}",
     ":6:52: spec.gang.scheduleTimeoutSeconds:", "Volcano PodGroups have no schedule timeout"),
    ("gang: {backend: muster, priorityClass: high}", ":6:42: spec.gang.priorityClass:",
     "Volcano PodGroups only"),
    ("topology: {mode: required, minRingGBps: -1}\ngang: {backend: muster}",
     ":6:43: spec.topology.minRingGBps:", "greater than 0"),
    ("priority: high", ":6:13: spec.priority:", "valid integer"),
    ("istio: {optOut: maybe}", ":6:19: spec.istio.optOut:",
     "must be sidecar, ambient, both or none (true means sidecar, false none)"),
    ("labels:\n  istio.io/dataplane-mode: none", ":7:5: spec.labels.istio.io/dataplane-mode:",
     "written by Muster itself"),
    ("match:\n  podSelector:\n    matchLabels: {istio.io/dataplane-mode: ambient}",
     ":8:7: spec.match.podSelector:", "Muster writes that label itself"),
])
def test_each_error_kind(bad: str, where: str, message: str) -> None:
    msgs = issues_of({"p.yaml": policy("broken", bad)})
    assert any(m.startswith("p.yaml" + where) and message in m for m in msgs), msgs


def test_yaml_syntax_error_has_position() -> None:
    [msg] = issues_of({"x.yaml": GOOD + "---\nspec: [unclosed\n"})
    # the unclosed flow sequence opens on line 12 of the file; the parser notices at its end
    assert msg.startswith(("x.yaml:12:", "x.yaml:13:")), msg
    assert "did not find expected ',' or ']'" in msg
    assert "document 2" in msg


def test_duplicate_key_and_wrong_kind_and_api_version() -> None:
    text = GOOD.replace("  name: good\n", "  name: good\n  name: again\n")
    assert any(":5:3: metadata.name: duplicate key 'name'" in m for m in issues_of({"d": text}))
    msgs = issues_of({"k": GOOD.replace("kind: SchedulingPolicy", "kind: PolicyTest")})
    assert msgs == ["k:2:7: kind: must be 'SchedulingPolicy', got 'PolicyTest' (document 1, "
                    "policy good)"]
    msgs = issues_of({"v": GOOD.replace("muster.io/v1alpha1", "muster.io/v2")})
    assert msgs[0].startswith("v:1:13: apiVersion: must be 'muster.io/v1alpha1', got")


def test_the_fixture_configmap_stub_is_refused(shared_dir: Path) -> None:
    review = json.loads((shared_dir / "fixtures/admission/configmap-create-policies.json")
                        .read_text())
    msgs = issues_of(review["request"]["object"]["data"])
    assert msgs == ["policy.yaml:1:1: apiVersion: must be 'muster.io/v1alpha1', it is missing "
                    "(document 1)"]


def test_not_a_mapping_and_not_utf8(tmp_path: Path) -> None:
    assert issues_of({"l.yaml": "- a\n- b\n"})[0].startswith("l.yaml:1:1: a policy document must "
                                                             "be a mapping, got a list")
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"apiVersion: muster.io/v1alpha1\nkind: \xff\xfe\n")
    with pytest.raises(PolicyError) as info:
        load_policies([bad])
    assert str(info.value.issues[0]) == f"{bad}:2:7: not UTF-8 text (byte 0xff)"


def test_duplicate_policy_names_across_files() -> None:
    msgs = issues_of({"a.yaml": GOOD, "b.yaml": GOOD})
    assert msgs == ["b.yaml:4:9: metadata.name: duplicate policy name, first defined at a.yaml:1 "
                    "(document 1, policy good)"]


CONFLICT_A = policy("queue-a", """
match:
  namespaces: [team-a, team-b]
gang:
  backend: volcano
  queue: alpha
""")


def test_conflict_equal_priority_same_field_overlapping_match() -> None:
    other = policy("queue-b", """
match:
  namespaces: [team-b]
gang:
  backend: volcano
  queue: beta
""")
    msgs = issues_of({"a.yaml": CONFLICT_A, "b.yaml": other})
    assert len(msgs) == 1
    assert msgs[0].startswith("b.yaml:10:12: spec.gang.queue: conflicts with policy queue-a "
                              "(a.yaml:10): both set gang.queue to different values at priority 0")


@pytest.mark.parametrize("resolution", [
    "priority: 5\nmatch:\n  namespaces: [team-b]",                # higher priority wins
    "match:\n  namespaces: [team-c]",                             # disjoint namespaces
    "match:\n  namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: team-z}}",
    "match:\n  gpus: {min: 9}\n  namespaces: [team-a]",            # disjoint with the range below
])
def test_conflict_resolutions_load(resolution: str) -> None:
    base = CONFLICT_A.replace("namespaces: [team-a, team-b]",
                              "namespaces: [team-a, team-b]\n    gpus: {max: 8}")
    other = policy("queue-b", resolution + "\ngang:\n  backend: volcano\n  queue: beta")
    assert len(load_policy_texts({"a.yaml": base, "b.yaml": other})) == 2


def test_disjoint_pod_selectors_do_not_conflict_but_overlapping_do() -> None:
    def sel(name: str, expr: str) -> str:
        return policy(name, f"match:\n  podSelector:\n    {expr}\nistio:\n  optOut: "
                      f"{'true' if name == 'x' else 'false'}")
    assert len(load_policy_texts({"a": sel("x", "matchLabels: {role: launcher}"),
                                  "b": sel("y", "matchExpressions: [{key: role, operator: "
                                                "NotIn, values: [launcher]}]")})) == 2
    msgs = issues_of({"a": sel("x", "matchLabels: {role: launcher}"),
                      "b": sel("y", "matchExpressions: [{key: team, operator: Exists}]")})
    assert "conflicts with policy x" in msgs[0]


def test_selecting_on_a_label_another_policy_writes_is_refused() -> None:
    writer = policy("writer", "labels:\n  team: vision")
    reader = policy("reader", "match:\n  podSelector:\n    matchLabels: {team: nlp}\n"
                              "istio: {optOut: true}")
    msgs = issues_of({"a": writer, "b": reader})
    assert msgs[0].startswith("b:8:7: spec.match.podSelector: selects on label 'team', which "
                              "policy writer writes")


def test_configmap_directory_layout(tmp_path: Path) -> None:
    """A mounted ConfigMap: files are symlinks into ..data, a timestamped dot-directory."""
    stamp = tmp_path / "..2026_11_21_05_38_09.123"
    stamp.mkdir()
    (stamp / "volcano.yaml").write_text(GOOD)
    (stamp / "notes.txt").write_text("not a policy")
    (tmp_path / "..data").symlink_to(stamp.name)
    (tmp_path / "volcano.yaml").symlink_to("..data/volcano.yaml")
    (tmp_path / "notes.txt").symlink_to("..data/notes.txt")
    loaded = load_policies([tmp_path])
    assert loaded.names == ("good",)
    assert loaded.origins == (f"{tmp_path}/volcano.yaml:1",)


def test_missing_path_is_an_error_not_a_crash(tmp_path: Path) -> None:
    with pytest.raises(PolicyError) as info:
        load_policies([tmp_path / "nope.yaml"])
    assert str(info.value.issues[0]).endswith("nope.yaml: No such file or directory")


def test_digest_changes_with_content_only() -> None:
    a = load_policy_texts({"a": GOOD})
    assert load_policy_texts({"renamed-key": GOOD}).digest == a.digest
    assert load_policy_texts({"a": GOOD.replace("team-a", "team-b")}).digest != a.digest


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=400))
def test_random_bytes_never_crash_the_loader(raw: bytes) -> None:
    text = raw.decode("utf-8", "surrogateescape")
    try:
        load_policy_texts({"fuzz.yaml": text})
    except PolicyError as exc:
        assert exc.issues and all(i.file == "fuzz.yaml" for i in exc.issues)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=200))
def test_random_text_never_crashes_the_loader(text: str) -> None:
    """ConfigMap data arrives as JSON strings: any code point, lone surrogates included."""
    try:
        load_policy_texts({"cm": text})
    except PolicyError as exc:
        assert exc.issues and all(i.file == "cm" for i in exc.issues)


def test_lone_surrogate_and_control_characters_are_reported_with_position() -> None:
    assert issues_of({"cm": "a: b\nkind: \ud800"}) == ["cm:2:7: not UTF-8 text (byte 0xed)"]
    assert issues_of({"cm": "a: b\nkind: x\x00"}) == [
        "cm:2:8: character U+0000 is not allowed in YAML (document 1)"]


_yamlish = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8)
    | st.sampled_from(["auto", "none", "50%", "volcano", "muster", "required", "In"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["apiVersion", "kind", "metadata", "name", "spec", "match", "gang",
                         "backend", "minAvailable", "topology", "mode", "labels", "podSelector",
                         "matchExpressions", "key", "operator", "values", "namespaces", "x"]),
        inner, max_size=4),
    max_leaves=12)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_yamlish)
def test_random_structures_never_crash_the_loader(doc: object) -> None:
    text = yaml.safe_dump({"apiVersion": "muster.io/v1alpha1", "kind": "SchedulingPolicy",
                           "metadata": {"name": "f"}, "spec": doc})
    try:
        load_policy_texts({"f.yaml": text})
    except PolicyError as exc:
        assert all(i.line >= 1 for i in exc.issues), exc
