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


#: the most issues an error lists: conflicts grow with the square of the policies (1,300
#: policies made 422,500, a 104 MB message), so the rest are counted, not listed
MAX_LISTED = 50
#: the longest line one issue takes in the message (a name or file may be long)
MAX_LINE = 1000


class PolicyError(Exception):
    """One or more problems in policy sources; the previous PolicySet stays in force. `issues`
    lists the first MAX_LISTED (warnings in their place; `problems` are the others); `more` and
    `more_warnings` count those not listed, `unlisted` problems never built included."""

    def __init__(self, issues: Sequence[PolicyIssue], unlisted: int = 0) -> None:
        self.issues: list[PolicyIssue] = list(issues[:MAX_LISTED])
        rest = issues[MAX_LISTED:]
        self.more_warnings = sum(i.warning for i in rest)
        self.more = len(rest) - self.more_warnings + unlisted
        lines = [_cut(str(i)) for i in self.issues]
        if self.more or self.more_warnings:
            lines.append(f"... and {self.more} more problems"
                         + (f" and {self.more_warnings} more warnings" if self.more_warnings
                            else "") + f" (the first {MAX_LISTED} are listed)")
        super().__init__("\n".join(lines))

    @property
    def problems(self) -> list[PolicyIssue]:
        return [i for i in self.issues if not i.warning]

    @property
    def problem_count(self) -> int:
        """Every problem, listed or not."""
        return len(self.problems) + self.more


def _cut(line: str) -> str:
    return line if len(line) <= MAX_LINE else line[:MAX_LINE - 3] + "..."
