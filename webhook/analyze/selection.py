"""Which of `muster analyze`'s findings an admin sees and gates on, as istioctl analyze does:
suppressions (a finding accepted on purpose, by code and object), an output threshold (what
is printed) and a failure threshold (what makes the command exit 1). Pure over the findings.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from webhook.failures import UsageError

if TYPE_CHECKING:  # the CLI reads SEVERITIES at start; the checks load only when they run
    from webhook.analyze.findings import Finding, Severity

#: from the least to the most severe
SEVERITIES: tuple[Severity, ...] = ("info", "warning", "error")


@dataclass(frozen=True)
class Suppression:
    """`CODE` or `CODE=OBJECT`, each a shell pattern (`*`, `?`, `[...]`), matched whole."""

    code: str
    object: str = "*"

    @classmethod
    def parse(cls, text: str) -> Suppression:
        code, _, obj = text.partition("=")
        code, obj = code.strip(), obj.strip()
        if not code or ("=" in text and not obj):
            raise UsageError(f"--suppress {text!r}: give CODE or CODE=OBJECT, e.g. "
                             "'TopologyNodeNotTainted=Node/gpu-*' (shell patterns)")
        return cls(code, obj or "*")

    def matches(self, finding: Finding) -> bool:
        return (fnmatch.fnmatchcase(finding.code, self.code)
                and fnmatch.fnmatchcase(finding.object, self.object))


def at_least(severity: Severity, threshold: Severity) -> bool:
    return SEVERITIES.index(severity) >= SEVERITIES.index(threshold)


@dataclass(frozen=True)
class Selected:
    kept: list[Finding]  # not suppressed
    shown: list[Finding]  # kept, at or above the output threshold
    suppressed: int

    def failed(self, threshold: Severity) -> bool:
        """A kept finding, shown or not, at or above the failure threshold."""
        return any(at_least(f.severity, threshold) for f in self.kept)


def select(findings: Sequence[Finding], suppressions: Sequence[Suppression],
           output_threshold: Severity = "info") -> Selected:
    kept = [f for f in findings if not any(s.matches(f) for s in suppressions)]
    return Selected(kept, [f for f in kept if at_least(f.severity, output_threshold)],
                    len(findings) - len(kept))
