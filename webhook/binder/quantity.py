"""Kubernetes resource quantities ("500m", "2Gi", "1e3") as integers the binder can add up."""

from __future__ import annotations

import math
import re
from fractions import Fraction

_SUFFIX: dict[str, Fraction] = {
    "": Fraction(1),
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
    "Ki": Fraction(2**10),
    "Mi": Fraction(2**20),
    "Gi": Fraction(2**30),
    "Ti": Fraction(2**40),
    "Pi": Fraction(2**50),
    "Ei": Fraction(2**60),
}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([eE][+-]?[0-9]+|[KMGTPE]i|[numkMGTPE]|)$")


class QuantityError(ValueError):
    pass


def parse_quantity(value: str | int | float) -> Fraction:
    """Exact value of a quantity; raises QuantityError on anything the API server would refuse."""
    if isinstance(value, bool):
        raise QuantityError(f"invalid quantity {value!r}")
    if isinstance(value, int | float):
        return Fraction(value)
    match = _QUANTITY.match(value.strip())
    if not match or match.group(1) in {".", "+", "-", ""}:
        raise QuantityError(f"invalid quantity {value!r}")
    try:
        number = Fraction(match.group(1))
    except ValueError as exc:
        raise QuantityError(f"invalid quantity {value!r}") from exc
    suffix = match.group(2)
    if suffix[:1] in {"e", "E"}:
        return number * Fraction(10) ** int(suffix[1:])
    return number * _SUFFIX[suffix]


def cpu_milli(value: str | int | float) -> int:
    """CPU in millicores, rounded up as the scheduler does."""
    return math.ceil(parse_quantity(value) * 1000)


def whole(value: str | int | float) -> int:
    """Bytes, pods or device counts, rounded up."""
    return math.ceil(parse_quantity(value))
