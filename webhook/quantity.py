"""Kubernetes resource quantities ("500m", "16Gi", "1e3"): exact parsing, summing, formatting;
shared by the policy engine (minResources) and the binder (fit).

Values are integers in nano-units (the API server's finest precision), which keeps sums exact
and is several times faster than fractions; parsing is memoised since requests repeat the same
few quantity strings.
"""

from __future__ import annotations

import re
from functools import lru_cache

_QUANTITY = re.compile(
    r"^(?P<sign>[+-]?)(?P<int>[0-9]*)(?:\.(?P<frac>[0-9]*))?"
    r"(?P<suffix>[KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
)
_NANO = 10**9
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
#: decimal suffix → power of ten
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


class QuantityError(ValueError):
    pass


@lru_cache(maxsize=1024)
def _parse(text: str) -> tuple[int, bool]:
    m = _QUANTITY.match(text)
    if not m or not (m["int"] or m["frac"]):
        raise QuantityError(f"{text!r} is not a resource quantity (e.g. 500m, 4, 16Gi)")
    digits = (m["int"] or "") + (m["frac"] or "")
    mantissa = int(digits) * (-1 if m["sign"] == "-" else 1)
    exp10 = -len(m["frac"] or "")
    suffix = m["suffix"] or ""
    if suffix in _BINARY:
        return _scale(mantissa * _BINARY[suffix], exp10 + 9), True
    if suffix in _DECIMAL:
        return _scale(mantissa, exp10 + _DECIMAL[suffix] + 9), False
    exponent = int(suffix[1:])
    if abs(exponent) > 30:
        raise QuantityError(f"{text!r}: exponent out of range")
    return _scale(mantissa, exp10 + exponent + 9), False


def _scale(value: int, exp10: int) -> int:
    """value × 10^exp10 as an integer, rounded up (the API server rounds sub-nano values up)."""
    scale: int = pow(10, abs(exp10))
    return value * scale if exp10 >= 0 else -(-value // scale)


def parse_quantity(text: object) -> tuple[int, bool]:
    """(value in nano-units, binary) where binary says the quantity used a power-of-two suffix."""
    if isinstance(text, bool) or not isinstance(text, str | int):
        raise QuantityError(f"{text!r} is not a resource quantity")
    return _parse(str(text))


def milli(nanos: int) -> int:
    """Thousandths of a value, rounded up as the scheduler does (Quantity.MilliValue)."""
    return -(-nanos // 10**6)


def units(nanos: int) -> int:
    """Whole units of a value (bytes, pods, devices), rounded up (Quantity.Value)."""
    return -(-nanos // _NANO)


def cpu_milli(text: object) -> int:
    """CPU in millicores, rounded up as the scheduler does ("100u" is 1)."""
    return milli(parse_quantity(text)[0])


def whole(text: object) -> int:
    """Bytes, pods or device counts, rounded up."""
    return units(parse_quantity(text)[0])


@lru_cache(maxsize=1024)
def format_quantity(nanos: int, binary: bool) -> str:
    """Canonical form: the largest suffix that keeps the value an integer."""
    if nanos < 0:
        return "-" + format_quantity(-nanos, binary)
    if binary and nanos and nanos % _NANO == 0:
        units = nanos // _NANO
        for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
            if units % _BINARY[suffix] == 0:
                return f"{units // _BINARY[suffix]}{suffix}"
    for suffix in ("E", "P", "T", "G", "M", "k", "", "m", "u", "n"):
        div = 10 ** (_DECIMAL[suffix] + 9)
        if nanos % div == 0 and (nanos or suffix == ""):
            return f"{nanos // div}{suffix}"
    return f"{nanos}n"  # unreachable: every integer is a whole number of nanos


def add_value(total: dict[str, tuple[int, bool]], name: str, value: tuple[int, bool],
              times: int = 1) -> None:
    """Add a parsed quantity `times` over; the sum keeps a binary suffix only when all do."""
    nanos, binary = value
    if name in total:
        old, old_binary = total[name]
        total[name] = (old + nanos * times, old_binary and binary)
    else:
        total[name] = (nanos * times, binary)
