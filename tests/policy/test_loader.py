"""Loader: every error kind names file, document, line, column and field path; ConfigMap layout."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from webhook.demo import EXAMPLE_POLICIES
from webhook.policy import PolicyError, load_policies, load_policy_texts
from webhook.policy.errors import MAX_LISTED
from webhook.yamlpos import MAX_SYNTAX_ERRORS, YamlProblem, documents

from .conftest import policy

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
    loaded = load_policies([EXAMPLE_POLICIES])
    assert set(loaded.names) == {"mpi-volcano", "mpi-coscheduling", "mpi-topology",
                                 "istio-optout-mpi-jobs", "istio-optout-batch-jobs",
                                 "jobset-volcano", "trainjob-coscheduling",
                                 "leaderworkerset-volcano", "pytorchjob-volcano",
                                 "indexed-job-volcano", "network-rack", "network-block",
                                 "network-nvlink-domain", "network-nvlink-slices",
                                 "network-as-annotated"}
    # highest priority first (network-topology.yaml's are 11, then mpi-topology's 10)
    assert loaded.names[:6] == ("network-rack", "network-block", "network-nvlink-domain",
                                "network-nvlink-slices", "network-as-annotated", "mpi-topology")
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
     "'volcano', 'coscheduling', 'muster' or 'kubernetes'"),
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
    ("gang: {backend: muster}\ntopology: {mode: 'off', preferredModels: [H100]}",
     ":7:20: spec.topology.mode:", "allowedModels, preferredModels and network"),
    ("gang: {backend: muster}\ntopology:\n  mode: required\n  allowedModels: [A100]\n"
     "  preferredModels: [H100, A100]", ":10:22: spec.topology.preferredModels:",
     "H100 not in allowedModels: never preferred"),
    ("gang: {backend: muster}\ntopology:\n  mode: required\n"
     "  preferredModels: [NVIDIA H100, NVIDIA-H100]", ":9:22: spec.topology.preferredModels:",
     "NVIDIA H100, NVIDIA-H100 named twice"),
    ("gang: {backend: coscheduling, queue: q}", ":6:40: spec.gang.queue:",
     "backend coscheduling has no queues"),
    ("gang: {backend: volcano, scheduleTimeoutSeconds: 60}",
     ":6:52: spec.gang.scheduleTimeoutSeconds:", "Volcano PodGroups have no schedule timeout"),
    ("gang: {backend: muster, priorityClass: high}", ":6:42: spec.gang.priorityClass:",
     "Volcano PodGroups only"),
    ("gang: {backend: volcano, preemption: LowerPriority}", ":6:40: spec.gang.preemption:",
     "backend volcano preempts by its own rules"),
    ("gang: {backend: muster, preemption: Always}", ":6:39: spec.gang.preemption:",
     "'Never' or 'LowerPriority'"),
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


@pytest.mark.parametrize(("text", "expected"), [
    # an unclosed flow sequence: the cause is its '[' (line 2), not where the parser gave up
    ("a: 1\nb: [x,\n  y\nc: 3\n",
     "x.yaml:2:4: '[' opened here is not closed: did not find expected ',' or ']' at line 4, "
     "column 2 (document 1)"),
    ("a: 1\nb: {x: 1,\n  y: 2\nc: 3\n",
     "x.yaml:2:4: '{' opened here is not closed: did not find expected ',' or '}' at line 4, "
     "column 2 (document 1)"),
    ('a: 1\nb: "unclosed\nc: 3\nd: 4\n',
     "x.yaml:2:4: '\"' opened here is not closed: found unexpected end of stream at line 5, "
     "column 1 (document 1)"),
    ("a: 1\nb: 'unclosed\n---\n",
     "x.yaml:2:4: \"'\" opened here is not closed: found unexpected document indicator at line "
     "3, column 1 (document 1)"),
    # bad indentation: here the cause is the line that does not fit, the parser's problem mark
    ("spec:\n  gang:\n    backend: volcano\n   queue: x\n",
     "x.yaml:4:4: did not find expected key: this line does not fit the block mapping that "
     "starts at line 2, column 3 (check its indentation) (document 1)"),
    ("metadata:\n  name: x\n spec: {}\n",
     "x.yaml:3:2: did not find expected key: this line does not fit the block mapping that "
     "starts at line 1, column 1 (check its indentation) (document 1)"),
    ("a: 1\nfoo\nb: 2\n",
     "x.yaml:2:1: while scanning a simple key: could not find expected ':' at line 3, column 1 "
     "(document 1)"),
])
def test_yaml_syntax_errors_point_at_their_cause(text: str, expected: str) -> None:
    assert issues_of({"x.yaml": text}) == [expected]


def test_a_broken_document_does_not_hide_the_next_ones() -> None:
    text = (GOOD.replace("good", "first")                          # lines 1-9
            + "---\nspec: [unclosed\n"                             # 10-11: document 2
            + "---\n" + GOOD.replace("backend: volcano", "backend: slurm")  # 12-21
            + "---\nkind: 'x\n"                                    # 22-23: document 4
            + "---\n" + GOOD.replace("good", "last"))             # 24-33: valid
    assert issues_of({"x.yaml": text}) == [
        "x.yaml:11:7: '[' opened here is not closed: did not find expected ',' or ']' at line "
        "12, column 1 (document 2)",
        "x.yaml:21:14: spec.gang.backend: Input should be 'volcano', 'coscheduling', "
        "'muster' or 'kubernetes' (document 3, policy good)",
        "x.yaml:23:7: \"'\" opened here is not closed: found unexpected document indicator at "
        "line 24, column 1 (document 4)",
    ]
    # the documents around the broken ones were read: their own problems are found too
    msgs = issues_of({"x.yaml": text.replace("name: last", "name: first")})
    assert msgs[-1] == ("x.yaml:28:9: metadata.name: duplicate policy name 'first', first "
                        "defined at x.yaml:4:9 (document 5, policy first)")


def test_reading_on_after_syntax_errors_is_bounded() -> None:
    """Each syntax error costs a pass over the rest of the text: a file of garbage stops (the
    error lists the first MAX_LISTED problems and counts the rest)."""
    with pytest.raises(PolicyError) as info:
        load_policy_texts({"g.yaml": "a: [\n---\n" * (MAX_SYNTAX_ERRORS + 50)})
    assert info.value.problem_count == MAX_SYNTAX_ERRORS + 1
    assert str(info.value).splitlines()[-1] == (
        f"... and {MAX_SYNTAX_ERRORS + 1 - MAX_LISTED} more problems (the first {MAX_LISTED} "
        "are listed)")
    found = [p for p in documents("a: \x01\n" * (MAX_SYNTAX_ERRORS + 50))
             if isinstance(p, YamlProblem)]
    assert found[-1].message == ("50 more lines hold characters YAML does not allow (is this a "
                                 "text file in UTF-8?)")
    assert len([p for p in found if "U+0001" in p.message]) == MAX_SYNTAX_ERRORS


EVERYTHING_WRONG = """\
apiVersion: muster.io/v1alpha1
kind: SchedulingPolicy
metadata:
  name: mpi
spec:
  match:
    podSelector:
      matchLabels: {sidecar.istio.io/inject: "true"}
      matchExpressions:
      - {key: role, operator: In}
    gpus: {min: 4, max: 2}
  gang:
    backend: slurm
    queue: Research
  istio: {optOut: maybe}
  labels: {team: vision}
---
apiVersion: muster.io/v1alpha1
kind: SchedulingPolicy
metadata:
  name: reader
spec:
  match:
    podSelector: {matchLabels: {team: nlp}}
  gang: {backend: coscheduling, minAvailable: 0, queue: q}
  topology: {mode: preferred}
"""


def test_every_problem_of_every_document_in_one_run() -> None:
    """Type errors do not hide the checks across fields (selectors, ranges, contradictions)
    nor those across documents (a label another policy writes, a duplicate name)."""
    msgs = issues_of({"a.yaml": EVERYTHING_WRONG,
                      "b.yaml": policy("mpi", "priority: high")})
    assert msgs == [
        "a.yaml:8:7: spec.match.podSelector: cannot select on 'sidecar.istio.io/inject': Muster "
        "writes that label itself, so the result would change when the pod is evaluated again "
        "(document 1, policy mpi)",
        "a.yaml:10:9: spec.match.podSelector.matchExpressions.0.values: operator In needs at "
        "least one value (document 1, policy mpi)",
        "a.yaml:11:25: spec.match.gpus.max: max (2) is smaller than min (4) (document 1, "
        "policy mpi)",
        "a.yaml:13:14: spec.gang.backend: Input should be 'volcano', 'coscheduling', "
        "'muster' or 'kubernetes' (document 1, policy mpi)",
        "a.yaml:14:12: spec.gang.queue: 'Research' is not a valid queue name (lowercase DNS-1123 "
        "subdomain) (document 1, policy mpi)",
        "a.yaml:15:19: spec.istio.optOut: must be sidecar, ambient, both or none (true means "
        "sidecar, false none) (document 1, policy mpi)",
        "a.yaml:24:18: spec.match.podSelector: selects on label 'team', which policy mpi writes: "
        "the result would change when the pod is evaluated again (document 2, policy reader)",
        "a.yaml:25:47: spec.gang.minAvailable: must be \"auto\", an integer ≥ 1 or a percentage "
        "such as \"80%\" (document 2, policy reader)",
        "a.yaml:25:57: spec.gang.queue: queue is a Volcano setting; backend coscheduling has no "
        "queues (document 2, policy reader)",
        "a.yaml:26:20: spec.topology.mode: topology mode preferred needs gang backend muster "
        "(Muster's binder does topology-aware placement), got backend coscheduling (document 2, "
        "policy reader)",
        "b.yaml:4:9: metadata.name: duplicate policy name 'mpi', first defined at a.yaml:4:9 "
        "(document 1, policy mpi)",
        "b.yaml:6:13: spec.priority: Input should be a valid integer (document 1, policy mpi)",
    ]


def test_a_check_that_needs_an_invalid_field_waits_for_it() -> None:
    """The topology check needs the gang's backend: an invalid one is not taken for none."""
    assert issues_of({"t": policy("t", "gang: {backend: slurm}\ntopology: {mode: required}")}) == [
        "t:6:19: spec.gang.backend: Input should be 'volcano', 'coscheduling', "
        "'muster' or 'kubernetes' (document 1, policy t)"]


def test_apiversion_and_kind_do_not_hide_the_fields_of_a_policy() -> None:
    msgs = issues_of({"v.yaml": GOOD.replace("muster.io/v1alpha1", "muster.io/v2")
                      .replace("volcano", "slurm")})
    assert msgs == [
        "v.yaml:1:13: apiVersion: must be 'muster.io/v1alpha1', got 'muster.io/v2' (document 1, "
        "policy good)",
        "v.yaml:9:14: spec.gang.backend: Input should be 'volcano', 'coscheduling', "
        "'muster' or 'kubernetes' (document 1, policy good)"]
    # another kind of object: its fields (and its name) mean something else, only its kind is
    # named
    assert issues_of({"a.yaml": GOOD, "cm.yaml": "apiVersion: v1\nkind: ConfigMap\n"
                      "metadata: {name: good}\ndata: {a: b}\n"}) == [
        "cm.yaml:1:13: apiVersion: must be 'muster.io/v1alpha1', got 'v1' (document 1, policy "
        "good)",
        "cm.yaml:2:7: kind: must be 'SchedulingPolicy', got 'ConfigMap' (document 1, policy good)"]


def test_empty_documents_are_skipped() -> None:
    assert load_policy_texts({"a": "---\n" + GOOD + "---\n# nothing\n---\n"}).names == ("good",)


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
                    "(document 1)",
                    "policy.yaml:1:1: metadata: required field is missing (document 1)",
                    "policy.yaml:1:1: spec: required field is missing (document 1)"]


def test_not_a_mapping_and_not_utf8(tmp_path: Path) -> None:
    assert issues_of({"l.yaml": "- a\n- b\n"})[0].startswith("l.yaml:1:1: a policy document must "
                                                             "be a mapping, got a list")
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"apiVersion: muster.io/v1alpha1\nkind: \xff\xfe\n")
    with pytest.raises(PolicyError) as info:
        load_policies([bad])
    assert str(info.value.issues[0]) == f"{bad}:2:7: not UTF-8 text (byte 0xff)"


def test_duplicate_policy_names_give_both_places() -> None:
    msgs = issues_of({"a.yaml": GOOD, "b.yaml": "# the same policy again\n" + GOOD})
    assert msgs == ["b.yaml:5:9: metadata.name: duplicate policy name 'good', first defined at "
                    "a.yaml:4:9 (document 1, policy good)"]
    # within a file, and when the second definition has problems of its own
    msgs = issues_of({"a.yaml": GOOD + "---\n" + GOOD.replace("volcano", "slurm")})
    assert msgs == ["a.yaml:14:9: metadata.name: duplicate policy name 'good', first defined at "
                    "a.yaml:4:9 (document 2, policy good)",
                    "a.yaml:19:14: spec.gang.backend: Input should be 'volcano', 'coscheduling', "
                    "'muster' or 'kubernetes' (document 2, policy good)"]


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
        "cm:1:1: apiVersion: must be 'muster.io/v1alpha1', it is missing (document 1)",
        "cm:2:7: kind: must be 'SchedulingPolicy', got 'x' (document 1)",
        "cm:2:8: character U+0000 is not allowed in YAML (document 1)"]
    # every line that holds one, each in its document; the documents are still checked
    msgs = issues_of({"cm": GOOD.replace("team-a", "team-\x01\x02") + "---\n"
                      + GOOD.replace("good", "\x7fgood")})
    assert msgs == ["cm:7:18: spec.match.namespaces.0: 'team-' is not a valid namespace name "
                    "(lowercase DNS-1123 subdomain) (document 1, policy good)",
                    "cm:7:23: character U+0001 is not allowed in YAML (document 1)",
                    "cm:14:9: character U+007F is not allowed in YAML (document 2)",
                    "cm:14:10: metadata.name: duplicate policy name 'good', first defined at "
                    "cm:4:9 (document 2, policy good)"]


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
