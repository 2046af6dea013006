"""YAML documents with the line and column of every field, for errors that name the exact place.

Never raises on any input: undecodable bytes, YAML syntax errors and unsupported tags come back
as (line, column, message) problems.

Hostile input is refused before it costs anything (security review #24): aliases are refused
where they appear (a 1.7 KB document whose aliases expand to 10^7 leaves took 1.7 GiB to walk),
a file holds at most MAX_BYTES bytes, and the files read together at most MAX_NODES nodes.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path as FsPath
from typing import TYPE_CHECKING, Any

import yaml
from yaml.composer import Composer, ComposerError

try:
    from yaml import CSafeLoader as _Base
except ImportError:  # PyYAML built without libyaml
    from yaml import SafeLoader as _Base  # type: ignore[assignment]

#: libyaml's safe loader where PyYAML has it (ten times faster than the pure-Python one), else
#: that one: the guarded loader below builds on it, and trusted manifests (the emulator's seeds,
#: the tests' upstream CRDs) are read with it as it is
SafeLoader = _Base

Path = tuple[str | int, ...]

#: the largest file read (real policy files are a few KB; a ConfigMap holds at most 1 MiB)
MAX_BYTES = 256 * 1024
#: the most YAML nodes (scalars, sequences, mappings) read together (a policy has about 50;
#: each costs about 1 KB while it is checked)
MAX_NODES = 20_000


@dataclass
class NodeBudget:
    """Nodes still allowed: one budget for all the files of a load."""

    nodes: int = MAX_NODES


@dataclass
class Document:
    index: int  # 1-based
    data: Any
    #: path → (line, column) of the key (mappings) or item (sequences), 1-based
    key_pos: dict[Path, tuple[int, int]] = field(default_factory=dict)
    #: path → (line, column) of the value
    value_pos: dict[Path, tuple[int, int]] = field(default_factory=dict)
    #: problems found while reading (duplicate keys, non-string keys)
    problems: list[tuple[Path, int, int, str]] = field(default_factory=list)

    def position(self, path: Path, *, of_key: bool = False) -> tuple[int, int]:
        """Position of `path`, or of its nearest ancestor that exists (e.g. for a missing field)."""
        table = self.key_pos if of_key else self.value_pos
        for n in range(len(path), -1, -1):
            if path[:n] in table:
                return table[path[:n]]
            if path[:n] in self.value_pos:
                return self.value_pos[path[:n]]
        return (1, 1)


class YamlProblem(Exception):
    def __init__(self, line: int, column: int, message: str, document: int = 0) -> None:
        super().__init__(message)
        self.line, self.column, self.message, self.document = line, column, message, document

    def at(self, file: str) -> str:
        """`file:line:column: message`, one line (`file: message` without a position)."""
        return f"{file}:{self.line}:{self.column}: {self.message}" if self.line \
            else f"{file}: {self.message}"


def problem_of(exc: yaml.YAMLError, text: str) -> YamlProblem:
    """An error of PyYAML's own loaders on `text` (kubeconfigs, the objects `muster policy`
    reads), at its cause in the words `documents` uses, instead of PyYAML's lines and caret."""
    if isinstance(exc, yaml.MarkedYAMLError):
        return _syntax_problem(exc, text, 0)
    return YamlProblem(0, 0, f"cannot read YAML: {exc}")


def read(path: FsPath, limit: int = MAX_BYTES) -> bytes:
    """The file's bytes, no more than one past `limit` (which `decode` refuses)."""
    with path.open("rb") as f:
        return f.read(limit + 1)


def decode(raw: bytes, limit: int = MAX_BYTES) -> str:
    """The text of `raw`; more than `limit` bytes, or bytes that are not UTF-8, are a
    YamlProblem."""
    if len(raw) > limit:
        raise YamlProblem(0, 0, f"larger than {limit // 1024} KiB, the most a file may hold")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        before = raw[: exc.start]
        line = before.count(b"\n") + 1
        column = exc.start - (before.rfind(b"\n") + 1) + 1
        raise YamlProblem(line, column, f"not UTF-8 text (byte 0x{raw[exc.start]:02x})") from None


class _TooLarge(ComposerError):
    """More nodes than MAX_NODES: the rest of the file is not read."""


class _Guard(Composer):
    """The composer, refusing aliases and counting nodes. Composing never expands an alias
    (both places share one node), but everything that walks the result does, once per path."""

    budget: NodeBudget

    if TYPE_CHECKING:  # the parser's (libyaml's or PyYAML's), after this class in the MRO
        def check_event(self, *choices: type[yaml.Event]) -> bool: ...
        def peek_event(self) -> yaml.Event: ...
        def get_event(self) -> yaml.Event: ...

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            event = self.get_event()
            assert isinstance(event, yaml.AliasEvent)
            raise ComposerError(None, None, f"alias *{event.anchor}: aliases are not accepted "
                                "(write the value out)", _at(event))
        self.budget.nodes -= 1
        if self.budget.nodes < 0:
            raise _TooLarge(None, None, f"more than {MAX_NODES} YAML nodes, the most that "
                            "are read at once", _at(self.peek_event()))
        return super().compose_node(parent, index)


def load_all(raw: bytes) -> list[Any]:
    """The data of each non-empty document of YAML that anyone may have written (the objects
    `muster policy test | explain` read), within the limits of a policy file: aliases refused,
    at most MAX_BYTES and MAX_NODES. The first problem is raised (a YamlProblem)."""
    out = []
    for doc in documents(decode(raw)):
        if isinstance(doc, YamlProblem):
            raise doc
        out.append(doc.data)
    return out


def _at(event: yaml.Event) -> yaml.Mark:
    """Where the event starts, as the Mark an error takes (libyaml's events have their own)."""
    m = event.start_mark
    return yaml.Mark("", m.index, m.line, m.column, None, 0) if m else yaml.Mark(
        "", 0, 0, 0, None, 0)


class _Loader(_Guard, _Base):
    def __init__(self, stream: str, budget: NodeBudget) -> None:
        _Base.__init__(self, stream)
        Composer.__init__(self)  # (libyaml's loader has a composer of its own, set aside here)
        self.budget = budget


def _mark(node: yaml.Node) -> tuple[int, int]:
    return node.start_mark.line + 1, node.start_mark.column + 1


def _walk(doc: Document, node: yaml.Node, path: Path, depth: int = 0) -> None:
    if depth > 64:
        return
    doc.value_pos.setdefault(path, _mark(node))
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            if not isinstance(key_node, yaml.ScalarNode):
                line, col = _mark(key_node)
                doc.problems.append((path, line, col, "mapping keys must be strings"))
                continue
            key = str(key_node.value)
            if key in seen:
                line, col = _mark(key_node)
                doc.problems.append(((*path, key), line, col, f"duplicate key {key!r}"))
            seen.add(key)
            doc.key_pos.setdefault((*path, key), _mark(key_node))
            _walk(doc, value_node, (*path, key), depth + 1)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            doc.key_pos.setdefault((*path, i), _mark(item))
            _walk(doc, item, (*path, i), depth + 1)


def documents(text: str, budget: NodeBudget | None = None) -> Iterator[Document | YamlProblem]:
    """Each non-empty YAML document with positions, and a YamlProblem for each document that
    cannot be read. After a syntax error, reading goes on at the next document marker (`---` at
    the start of a line) after the error's cause, so one pass reports every document (up to
    MAX_SYNTAX_ERRORS: each one costs a pass over the rest of the text). Reading stops where
    `budget` (of this text alone when not given) runs out."""
    yield from _not_allowed(text)
    text = _NOT_ALLOWED.sub(" ", text)
    start = start_line = index = 0  # where reading (re)starts; its line; documents read so far
    budget = budget if budget is not None else NodeBudget()
    for _ in range(MAX_SYNTAX_ERRORS):
        # the lines before `start` left empty: marks keep their lines
        padded = "\n" * start_line + text[start:]
        loader = _Loader(padded, budget)
        try:
            while loader.check_node():
                node = loader.get_node()
                index += 1
                found = _document(index, node)
                if found is not None:
                    yield found
            return
        except _TooLarge as exc:
            yield _syntax_problem(exc, padded, index + 1)
            return
        except yaml.MarkedYAMLError as exc:
            problem = _syntax_problem(exc, padded, index + 1)
        except (yaml.YAMLError, ValueError, TypeError, OverflowError, RecursionError) as exc:
            problem = YamlProblem(0, 0, f"cannot read YAML: {exc}", index + 1)
        finally:
            loader.dispose()
        yield problem
        index += 1
        resume = _next_document(text, (start, start_line), (problem.line - 1, problem.column - 1))
        if resume is None:
            return
        start, start_line = resume
    yield YamlProblem(start_line + 1, 1, f"not read on after {MAX_SYNTAX_ERRORS} syntax errors",
                      index + 1)


def _document(index: int, node: yaml.Node | None) -> Document | YamlProblem | None:
    """The document, its problem, or None when it holds nothing (e.g. after a trailing ---)."""
    if node is None:
        return None
    doc = Document(index, None)
    _walk(doc, node, ())
    try:
        doc.data = yaml.constructor.SafeConstructor().construct_document(node)
    except yaml.MarkedYAMLError as exc:  # e.g. an unknown tag; the next documents are fine
        return _syntax_problem(exc, "", index)  # (no construct that must be closed)
    except (yaml.YAMLError, ValueError, TypeError, OverflowError, RecursionError) as exc:
        # e.g. a timestamp-looking scalar with month 13, or absurdly deep nesting
        line, col = _mark(node)
        return YamlProblem(line, col, f"cannot read YAML: {exc}", index)
    return None if doc.data is None else doc


#: syntax errors read past (and lines with characters not allowed reported) in one file
MAX_SYNTAX_ERRORS = 100
#: line breaks as YAML counts them
_BREAKS = re.compile("\r\n|[\r\n\x85\u2028\u2029]")
#: a stream whose first document starts with a marker (only blank lines, comments and
#: directives before it)
_MARKER_FIRST = re.compile(
    r"(?:[ \t]*(?:#.*)?(?:\r\n|[\r\n])|%.*(?:\r\n|[\r\n]))*---(?=[ \t\r\n]|\Z)")
#: characters a YAML stream may not hold (PyYAML's and libyaml's readers refuse them)
_NOT_ALLOWED = re.compile(
    "[^\t\n\r\x20-\x7e\x85\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_DOCUMENT_START = re.compile(r"^---(?=[ \t\r\n]|\Z)", re.MULTILINE)
#: constructs that a character of their own closes. One never closed is noticed only where
#: something else comes, often lines later: the cause is where it opened (the error's context)
_OPENED = ("while parsing a flow sequence", "while parsing a flow mapping",
           "while scanning a quoted scalar", "while scanning a simple key")


def _syntax_problem(exc: yaml.MarkedYAMLError, text: str, document: int) -> YamlProblem:
    """The problem at its cause, naming both of the parser's places, the cause first."""
    context, problem = exc.context or "", exc.problem or "invalid YAML"
    ctx, at = exc.context_mark, exc.problem_mark
    if ctx is not None and (at is None or context in _OPENED):
        opened = _char_at(text, ctx) if context != "while scanning a simple key" else ""
        what = f"{opened!r} opened here is not closed" if opened in ("[", "{", "'", '"') \
            else context
        where = f" at line {at.line + 1}, column {at.column + 1}" if at is not None else ""
        return YamlProblem(ctx.line + 1, ctx.column + 1, f"{what}: {problem}{where}", document)
    if at is None:
        return YamlProblem(0, 0, " ".join(filter(None, (context, problem))), document)
    message = problem
    if ctx is not None and (ctx.line, ctx.column) != (at.line, at.column):
        place = f"line {ctx.line + 1}, column {ctx.column + 1}"
        if context.startswith("while parsing a block"):
            message += (f": this line does not fit the {context.removeprefix('while parsing a ')}"
                        f" that starts at {place} (check its indentation)")
        else:
            message += f" ({context} at {place})"
    return YamlProblem(at.line + 1, at.column + 1, message, document)


def _not_allowed(text: str) -> Iterator[YamlProblem]:
    """One problem per line holding characters YAML does not allow, for the first
    MAX_SYNTAX_ERRORS such lines (they are then read as spaces, so that the rest of the file is
    still checked)."""
    document = 0 if _MARKER_FIRST.match(text) else 1
    found = 0
    for number, line in enumerate(_BREAKS.split(text), 1):
        document += bool(_DOCUMENT_START.match(line))
        bad = _NOT_ALLOWED.search(line)
        if bad is None:
            continue
        found += 1
        if found <= MAX_SYNTAX_ERRORS:
            yield YamlProblem(number, bad.start() + 1,
                              f"character U+{ord(bad.group()):04X} is not allowed in YAML",
                              document)
    if found > MAX_SYNTAX_ERRORS:
        yield YamlProblem(0, 0, f"{found - MAX_SYNTAX_ERRORS} more lines hold characters YAML "
                          "does not allow (is this a text file in UTF-8?)")


def _char_at(text: str, mark: yaml.Mark) -> str:
    return text[mark.index] if 0 <= mark.index < len(text) else ""


def _next_document(text: str, since: tuple[int, int],
                   cause: tuple[int, int]) -> tuple[int, int] | None:
    """Where (offset, line) the document after the one holding `cause` (0-based line and
    column) begins: the first marker below it, or at it when the parser stopped right on the
    marker of the next document. `since` is the offset and line of the text read last."""
    (start, line), counted = since, since[0]
    for m in _DOCUMENT_START.finditer(text, start + 1):
        line += len(_BREAKS.findall(text, counted, m.start()))
        counted = m.start()
        if line > cause[0] or (line, 0) == cause:
            return m.start(), line
    return None
