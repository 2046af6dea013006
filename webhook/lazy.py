"""A package's lazy exports: each name imports its module on first use (PEP 562).

The CLI imports every area's package to build its parser, so a package that imported its
modules eagerly would load pydantic, the Kubernetes client or NVML for `muster --help`.
Imports nothing of Muster, so that every layer may use it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_getattr(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """The module `__getattr__` of `package`: `exports` maps each name to the module defining it."""

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(exports[name]), name)

    return __getattr__
