"""RFC 6902 / RFC 6901 behaviour of webhook.jsonpatch, including the RFC's Appendix A cases."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.jsonpatch import JsonPatchError, apply_patch, escape, parse_pointer

RFC_CASES: list[tuple[str, Any, list[dict[str, Any]], Any]] = [
    ("A.1 add object member", {"foo": "bar"},
     [{"op": "add", "path": "/baz", "value": "qux"}], {"baz": "qux", "foo": "bar"}),
    ("A.2 add array element", {"foo": ["bar", "baz"]},
     [{"op": "add", "path": "/foo/1", "value": "qux"}], {"foo": ["bar", "qux", "baz"]}),
    ("A.3 remove member", {"baz": "qux", "foo": "bar"},
     [{"op": "remove", "path": "/baz"}], {"foo": "bar"}),
    ("A.4 remove element", {"foo": ["bar", "qux", "baz"]},
     [{"op": "remove", "path": "/foo/1"}], {"foo": ["bar", "baz"]}),
    ("A.5 replace", {"baz": "qux", "foo": "bar"},
     [{"op": "replace", "path": "/baz", "value": "boo"}], {"baz": "boo", "foo": "bar"}),
    ("A.6 move member", {"foo": {"bar": "baz", "waldo": "fred"}, "qux": {"corge": "grault"}},
     [{"op": "move", "from": "/foo/waldo", "path": "/qux/thud"}],
     {"foo": {"bar": "baz"}, "qux": {"corge": "grault", "thud": "fred"}}),
    ("A.7 move element", {"foo": ["all", "grass", "cows", "eat"]},
     [{"op": "move", "from": "/foo/1", "path": "/foo/3"}],
     {"foo": ["all", "cows", "eat", "grass"]}),
    ("A.8 test success", {"baz": "qux", "foo": ["a", 2, "c"]},
     [{"op": "test", "path": "/baz", "value": "qux"}, {"op": "test", "path": "/foo/1", "value": 2}],
     {"baz": "qux", "foo": ["a", 2, "c"]}),
    ("A.10 add nested", {"foo": "bar"},
     [{"op": "add", "path": "/child", "value": {"grandchild": {}}}],
     {"foo": "bar", "child": {"grandchild": {}}}),
    ("A.11 unrecognised members ignored", {"foo": "bar"},
     [{"op": "add", "path": "/baz", "value": "qux", "xyz": 123}], {"foo": "bar", "baz": "qux"}),
    ("A.14 escapes", {"/": 9, "~1": 10},
     [{"op": "test", "path": "/~01", "value": 10}], {"/": 9, "~1": 10}),
    ("A.16 append with -", {"foo": ["bar"]},
     [{"op": "add", "path": "/foo/-", "value": ["abc", "def"]}],
     {"foo": ["bar", ["abc", "def"]]}),
    ("copy", {"a": {"b": 1}}, [{"op": "copy", "from": "/a", "path": "/c"}],
     {"a": {"b": 1}, "c": {"b": 1}}),
    ("replace root", {"a": 1}, [{"op": "replace", "path": "", "value": [1]}], [1]),
    ("annotation key with slash", {"metadata": {"annotations": {}}},
     [{"op": "add", "path": "/metadata/annotations/" + escape("muster.io/policy"), "value": "p"}],
     {"metadata": {"annotations": {"muster.io/policy": "p"}}}),
]


@pytest.mark.parametrize(("name", "doc", "ops", "want"), RFC_CASES, ids=[c[0] for c in RFC_CASES])
def test_rfc_examples(name: str, doc: Any, ops: list[dict[str, Any]], want: Any) -> None:
    before = repr(doc)
    assert apply_patch(doc, ops) == want
    assert repr(doc) == before, "the input document must not be modified"


ERROR_CASES: list[tuple[str, Any, Any, str]] = [
    ("A.9 test failure", {"baz": "qux"}, [{"op": "test", "path": "/baz", "value": "bar"}],
     "differs"),
    ("A.12 add to nonexistent target", {"foo": "bar"},
     [{"op": "add", "path": "/baz/bat", "value": "qux"}], "does not exist"),
    ("A.13 invalid op", {}, [{"op": "jump", "path": "/a"}], "unknown op"),
    ("A.15 string is not number", {"foo": 1}, [{"op": "test", "path": "/foo", "value": "1"}],
     "differs"),
    ("bool is not int", {"foo": 1}, [{"op": "test", "path": "/foo", "value": True}], "differs"),
    ("remove missing", {"a": 1}, [{"op": "remove", "path": "/b"}], "does not exist"),
    ("replace missing", {"a": 1}, [{"op": "replace", "path": "/b", "value": 1}], "does not exist"),
    ("leading zero index", {"a": [1, 2]}, [{"op": "remove", "path": "/a/01"}],
     "not an array index"),
    ("index out of range", {"a": [1]}, [{"op": "add", "path": "/a/2", "value": 0}], "out of range"),
    ("dash only for add", {"a": [1]}, [{"op": "remove", "path": "/a/-"}], "not an array index"),
    ("bad escape", {"a~2": 1}, [{"op": "remove", "path": "/a~2"}], "invalid escape"),
    ("no leading slash", {"a": 1}, [{"op": "remove", "path": "a"}], "must be empty or start"),
    ("missing value", {}, [{"op": "add", "path": "/a"}], "missing 'value'"),
    ("missing from", {}, [{"op": "copy", "path": "/a"}], "missing 'from'"),
    ("move into child", {"a": {"b": 1}}, [{"op": "move", "from": "/a", "path": "/a/b/c"}],
     "own children"),
    ("through scalar", {"a": 1}, [{"op": "add", "path": "/a/b/c", "value": 1}], "scalar"),
    ("not a list", {}, "add", "array of operations"),
    ("op not object", {}, [1], "must be an object"),
]


@pytest.mark.parametrize(("name", "doc", "ops", "message"), ERROR_CASES,
                         ids=[c[0] for c in ERROR_CASES])
def test_errors(name: str, doc: Any, ops: Any, message: str) -> None:
    with pytest.raises(JsonPatchError, match=message):
        apply_patch(doc, ops)


def test_failed_patch_is_atomic() -> None:
    doc = {"a": 1}
    with pytest.raises(JsonPatchError):
        apply_patch(doc, [{"op": "add", "path": "/b", "value": 2}, {"op": "remove", "path": "/x"}])
    assert doc == {"a": 1}


def test_value_is_copied_not_aliased() -> None:
    value = {"x": [1]}
    out = apply_patch({}, [{"op": "add", "path": "/v", "value": value}])
    out["v"]["x"].append(2)
    assert value == {"x": [1]}


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(max_size=6), max_size=4))
def test_escape_roundtrip(keys: list[str]) -> None:
    pointer = "".join("/" + escape(k) for k in keys)
    assert parse_pointer(pointer) == keys
