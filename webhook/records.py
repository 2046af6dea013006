"""`record`: a dataclass the type checker treats as frozen, and that is cheap to build.

A frozen dataclass's `__init__` assigns every field through `object.__setattr__`. On the
admission path several structs of up to eleven fields are built per request, and that cost was
a tenth of the decision on a memo miss (`bench/bench_engine.py`). A record is built with plain
slot stores. What frozen guaranteed, that nothing assigns to a field, mypy (strict, in
`scripts/test`) now checks: `dataclass_transform(frozen_default=True)` makes an assignment a
type error. Records are hashable by value (like a frozen dataclass) and slotted.
"""

from __future__ import annotations

import dataclasses
from typing import TypeVar, dataclass_transform

T = TypeVar("T")


@dataclass_transform(frozen_default=True, field_specifiers=(dataclasses.field,))
def record(cls: type[T]) -> type[T]:
    return dataclasses.dataclass(slots=True, unsafe_hash=True)(cls)
