"""apimachinery's name checks (IsQualifiedName for label keys, IsValidLabelValue,
IsDNS1123Label and -Subdomain), each giving every message the real server gives, in order."""

from __future__ import annotations

import re

_QNAME = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_QNAME_MSG = ("must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
              "with an alphanumeric character")
_LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_SUBDOMAIN = rf"{_LABEL}(\.{_LABEL})*"


def _regex_error(msg: str, fmt: str, *examples: str) -> str:
    """validation.RegexError: the examples each followed by "', " and joined by " or "."""
    shown = " or ".join(f"'{e}', " for e in examples)
    return f"{msg} (e.g. {shown}regex used for validation is '{fmt}')"


def _full(pattern: str, value: str) -> bool:
    return re.fullmatch(pattern, value) is not None


def dns1123_label_errors(value: str) -> list[str]:
    errs = ["must be no more than 63 characters"] if len(value) > 63 else []
    if not _full(_LABEL, value):
        # a subdomain that is no label has dots, and is told so
        errs.append("must not contain dots" if _full(_SUBDOMAIN, value) else _regex_error(
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or "
            "'-', and must start and end with an alphanumeric character", _LABEL, "my-name",
            "123-abc"))
    return errs


def dns1123_subdomain_errors(value: str) -> list[str]:
    errs = ["must be no more than 253 characters"] if len(value) > 253 else []
    if not _full(_SUBDOMAIN, value):
        errs.append(_regex_error("a lowercase RFC 1123 subdomain must consist of lower case "
                                 "alphanumeric characters, '-' or '.', and must start and end "
                                 "with an alphanumeric character", _SUBDOMAIN, "example.com"))
    return errs


def label_key_errors(value: str) -> list[str]:
    """IsQualifiedName: an optional DNS subdomain prefix and '/', then a name of 1-63
    characters (for label and annotation keys, selector keys and topologyKey; with more than
    one '/', 1.34 still called it "a qualified name")."""
    parts = value.split("/")
    shape = _regex_error(_QNAME_MSG, _QNAME, "MyName", "my.name", "123-abc")
    if len(parts) > 2:
        return [f"a valid label key {shape} with an optional DNS subdomain prefix and '/' (e.g. "
                "'example.com/MyName')"]
    errs = []
    if len(parts) == 2:
        prefix = parts[0]
        errs += ["prefix part must be non-empty"] if not prefix else [
            f"prefix part {m}" for m in dns1123_subdomain_errors(prefix)]
    name = parts[-1]
    if not name:
        errs.append("name part must be non-empty")
    elif len(name) > 63:
        errs.append("name part must be no more than 63 characters")
    if not _full(_QNAME, name):
        errs.append(f"name part {shape}")
    return errs


def label_value_errors(value: str) -> list[str]:
    errs = ["must be no more than 63 characters"] if len(value) > 63 else []
    if not _full(f"({_QNAME})?", value):
        errs.append(_regex_error(
            "a valid label must be an empty string or consist of alphanumeric characters, '-', "
            "'_' or '.', and must start and end with an alphanumeric character", f"({_QNAME})?",
            "MyValue", "my_value", "12345"))
    return errs
