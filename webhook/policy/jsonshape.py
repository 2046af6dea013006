"""Reading JSON of any shape without raising: admission sees user input before the API server
has validated it, so a field may hold anything. Each reader returns the value when it has the
expected type, else an empty or default one."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def as_map(value: Any) -> Mapping[str, Any]:
    if type(value) is dict:  # the common case, without the slower ABC check
        return value
    return value if isinstance(value, Mapping) else {}


def as_list(value: Any) -> Sequence[Any]:
    return value if type(value) is list or isinstance(value, tuple) else ()


def as_str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def as_int(value: Any, default: int | None = None) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def type_name(value: object) -> str:
    """What a value is, for a message: `got a list`."""
    names = {"dict": "a mapping", "list": "a list", "str": "a string"}
    return names.get(type(value).__name__, type(value).__name__)
