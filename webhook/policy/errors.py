"""Policy errors that name the exact place: file, document, line, column and field path."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PolicyIssue:
    file: str
    #: 1-based index of the YAML document in the file (0: the file as a whole)
    document: int
    #: 1-based line and column (0: unknown)
    line: int
    column: int
    #: dotted field path in the document, e.g. "spec.gang.minAvailable" ("" for the document)
    path: str
    message: str
    #: metadata.name of the document when it has one
    policy: str = ""
    #: the set loads anyway: the document is valid but very likely not what was meant
    warning: bool = False

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}:{self.column}" if self.line else self.file
        if self.warning:
            where += ": warning"
        doc = f"document {self.document}" if self.document else ""
        if self.policy:
            doc = f"{doc}, policy {self.policy}" if doc else f"policy {self.policy}"
        head = f"{where}: {self.path}: {self.message}" if self.path else f"{where}: {self.message}"
        return f"{head} ({doc})" if doc else head


class PolicyError(Exception):
    """One or more problems in policy sources; the previous PolicySet stays in force. `issues`
    also holds the warnings, in their place (`problems` are the others)."""

    def __init__(self, issues: Sequence[PolicyIssue]) -> None:
        self.issues: list[PolicyIssue] = list(issues)
        super().__init__("\n".join(str(i) for i in self.issues))

    @property
    def problems(self) -> list[PolicyIssue]:
        return [i for i in self.issues if not i.warning]
