"""YAML documents with the line and column of every field, for errors that name the exact place.

Never raises on any input: undecodable bytes, YAML syntax errors and unsupported tags come back
as (line, column, message) problems.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import yaml

Path = tuple[str | int, ...]
_Loader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


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


def decode(raw: bytes) -> str:
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        before = raw[: exc.start]
        line = before.count(b"\n") + 1
        column = exc.start - (before.rfind(b"\n") + 1) + 1
        raise YamlProblem(line, column, f"not UTF-8 text (byte 0x{raw[exc.start]:02x})") from None


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


def documents(text: str) -> Iterator[Document]:
    """Each non-empty YAML document with positions. Raises YamlProblem on the first bad one."""
    index = 0
    try:
        for node in yaml.compose_all(text, Loader=_Loader):
            index += 1
            if node is None:
                continue
            doc = Document(index, None)
            _walk(doc, node, ())
            constructor = yaml.constructor.SafeConstructor()
            doc.data = constructor.construct_document(node)
            yield doc
    except yaml.reader.ReaderError as exc:
        before = text[: exc.position]
        line, col = before.count("\n") + 1, exc.position - (before.rfind("\n") + 1) + 1
        code = exc.character if isinstance(exc.character, int) else ord(exc.character[:1] or " ")
        raise YamlProblem(line, col, f"character U+{code:04X} is not allowed in YAML",
                          index + 1) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (0, 0)
        message = " ".join(str(p) for p in (exc.context, exc.problem) if p) or "invalid YAML"
        raise YamlProblem(line, col, message, index + 1) from None
    except (yaml.YAMLError, ValueError, TypeError, OverflowError, RecursionError) as exc:
        # e.g. a timestamp-looking scalar with month 13, or absurdly deep nesting
        raise YamlProblem(0, 0, f"cannot read YAML: {exc}", index + 1) from None
