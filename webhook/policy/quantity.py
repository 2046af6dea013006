"""Kubernetes resource quantities ("500m", "16Gi", "1e3"): exact parsing, summing, formatting."""

from __future__ import annotations

import re
from fractions import Fraction

_QUANTITY = re.compile(
    r"^(?P<num>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?P<suffix>[KMGTPE]i|[numkMGTPE]|[eE][+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))?$"
)
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000),
            "": Fraction(1), "k": Fraction(10**3), "M": Fraction(10**6), "G": Fraction(10**9),
            "T": Fraction(10**12), "P": Fraction(10**15), "E": Fraction(10**18)}


class QuantityError(ValueError):
    pass


def parse_quantity(text: object) -> tuple[Fraction, bool]:
    """(value, binary) where binary says the quantity used a power-of-two suffix."""
    if isinstance(text, bool) or not isinstance(text, str | int):
        raise QuantityError(f"{text!r} is not a resource quantity")
    s = str(text)
    m = _QUANTITY.match(s)
    if not m:
        raise QuantityError(f"{s!r} is not a resource quantity (e.g. 500m, 4, 16Gi)")
    num = Fraction(m["num"])
    suffix = m["suffix"] or ""
    if suffix in _BINARY:
        return num * _BINARY[suffix], True
    if suffix in _DECIMAL:
        return num * _DECIMAL[suffix], False
    exponent = Fraction(suffix[1:])
    if exponent.denominator != 1 or abs(exponent) > 30:
        raise QuantityError(f"{s!r}: exponent out of range")
    return num * Fraction(10) ** int(exponent), False


def format_quantity(value: Fraction, binary: bool) -> str:
    """Canonical form: the largest suffix that keeps the value an integer (milli at least)."""
    if value < 0:
        return "-" + format_quantity(-value, binary)
    if binary and value.denominator == 1 and value:
        for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
            if value % _BINARY[suffix] == 0:
                return f"{value // _BINARY[suffix]}{suffix}"
    for suffix in ("E", "P", "T", "G", "M", "k", "", "m", "u", "n"):
        scaled = value / _DECIMAL[suffix]
        if scaled.denominator == 1 and (scaled or suffix == ""):
            return f"{scaled.numerator}{suffix}"
    # below a nano: Kubernetes rounds up to the next representable value
    return f"{-(-value.numerator * 10**9 // value.denominator)}n"


def add_quantities(total: dict[str, tuple[Fraction, bool]], name: str, text: object,
                   times: int = 1) -> None:
    value, binary = parse_quantity(text)
    old, old_binary = total.get(name, (Fraction(0), binary))
    total[name] = (old + value * times, old_binary and binary if name in total else binary)
