"""Load a definition into plain data while remembering where every value came from.

YAML is composed into a node tree with PyYAML's SafeLoader and walked by hand, so
each mapping key and value keeps its line and column (JSON is YAML, so JSON files
take the same path). A dict passed in directly has no positions; diagnostics about
it simply carry none.

`Positions` maps JSON-path-like tuples (``("steps", 3, "retry", "backoff")``) to
1-based ``(line, column)``. `Reporter` turns a path and a message into a
`Diagnostic` with the position filled in; every later phase reports through it.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from tideflow.errors import DefinitionError, Diagnostic

__all__ = [
    "DataPath",
    "Loaded",
    "Positions",
    "Reporter",
    "did_you_mean",
    "format_path",
    "load",
]

DataPath = tuple[str | int, ...]
Position = tuple[int, int]

MAX_NODES = 200_000
"""Alias expansion beyond this many values is refused (a "billion laughs" guard)."""

_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"
_FILE_SUFFIXES = (".yaml", ".yml", ".json")


class Positions:
    """Where each value (and each mapping key) of a loaded definition starts.

    Lookups fall back to the nearest enclosing value, so a path that does not exist
    in the source (a default filled in later) still points somewhere useful. A
    derived view (`relinked`) maps paths of a rewritten tree back to the source.
    """

    def __init__(self) -> None:
        self._values: dict[DataPath, Position] = {}
        self._keys: dict[DataPath, Position] = {}
        self._quoted: set[DataPath] = set()
        self._blocks: set[DataPath] = set()
        self._links: dict[DataPath, DataPath] = {}

    def __getitem__(self, path: DataPath) -> Position:
        return self._values[self._resolve(path)]

    def __contains__(self, path: object) -> bool:
        return isinstance(path, tuple) and self._resolve(path) in self._values

    def __len__(self) -> int:
        return len(self._values)

    def get(self, path: DataPath) -> Position | None:
        """The exact position of the value at ``path``, or None."""
        return self._values.get(self._resolve(path))

    def find(self, path: DataPath) -> Position | None:
        """The position of ``path`` or of its nearest ancestor that has one."""
        for size in range(len(path), -1, -1):
            found = self._values.get(self._resolve(path[:size]))
            if found is not None:
                return found
        return None

    def key(self, path: DataPath) -> Position | None:
        """Where the mapping key that ends ``path`` is written (else `find`)."""
        return self._keys.get(self._resolve(path)) or self.find(path)

    def content_offset(self, path: DataPath) -> int | None:
        """Columns between the value's start and its text; None for a block scalar."""
        source = self._resolve(path)
        if source in self._blocks:
            return None
        return 1 if source in self._quoted else 0

    def source_path(self, path: DataPath) -> DataPath:
        """Where the value at ``path`` (of a rewritten tree) was written."""
        return self._resolve(path)

    def record(self, path: DataPath, node: Node, *, key: Node | None = None) -> None:
        self._values[path] = (node.start_mark.line + 1, node.start_mark.column + 1)
        if key is not None:
            self._keys[path] = (key.start_mark.line + 1, key.start_mark.column + 1)
        if isinstance(node, ScalarNode) and node.style in ('"', "'"):
            self._quoted.add(path)
        elif isinstance(node, ScalarNode) and node.style in ("|", ">"):
            self._blocks.add(path)

    def relinked(self, links: Mapping[DataPath, DataPath]) -> Positions:
        """A view in which a path under a key of ``links`` reads the linked source path."""
        view = Positions()
        view._values, view._keys = self._values, self._keys
        view._quoted, view._blocks = self._quoted, self._blocks
        view._links = {**self._links, **links}
        return view

    def _resolve(self, path: DataPath) -> DataPath:
        if not self._links:
            return path
        for size in range(len(path), 0, -1):
            target = self._links.get(path[:size])
            if target is not None:
                return target + path[size:]
        return path


@dataclass(frozen=True, slots=True)
class Loaded:
    data: Any
    positions: Positions
    file: str | None


def format_path(path: Iterable[str | int]) -> str:
    """``("steps", 3, "retry")`` -> ``steps[3].retry``."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text


def did_you_mean(word: str, candidates: Iterable[str]) -> str | None:
    matches = difflib.get_close_matches(word, sorted(set(candidates)), n=1, cutoff=0.6)
    return matches[0] if matches else None


@dataclass
class Reporter:
    """Collects diagnostics, filling in file, position and path."""

    positions: Positions
    file: str | None = None
    diagnostics: list[Diagnostic] = field(default_factory=list)

    @property
    def has_errors(self) -> bool:
        return any(d.severity == "error" for d in self.diagnostics)

    def error(
        self,
        path: DataPath,
        message: str,
        *,
        hint: str | None = None,
        step_id: str | None = None,
        at_key: bool = False,
        column_offset: int | None = None,
    ) -> None:
        self._add(path, message, hint, step_id, at_key, column_offset, "error")

    def warning(
        self, path: DataPath, message: str, *, hint: str | None = None, step_id: str | None = None
    ) -> None:
        self._add(path, message, hint, step_id, False, None, "warning")

    def _add(
        self,
        path: DataPath,
        message: str,
        hint: str | None,
        step_id: str | None,
        at_key: bool,
        column_offset: int | None,
        severity: str,
    ) -> None:
        line, column = self._where(path, at_key, column_offset)
        self.diagnostics.append(
            Diagnostic(
                message=message,
                file=self.file,
                line=line,
                column=column,
                step_id=step_id,
                path=format_path(path) or None,
                hint=hint,
                severity=severity,
            )
        )

    def _where(
        self, path: DataPath, at_key: bool, column_offset: int | None
    ) -> tuple[int | None, int | None]:
        found = self.positions.key(path) if at_key else self.positions.find(path)
        if found is None:
            return None, None
        line, column = found
        shift = self.positions.content_offset(path)
        if column_offset is not None and shift is not None and self.positions.get(path):
            column += shift + column_offset
        return line, column


def load(source: str | Path | Mapping[str, Any], *, file: str | None = None) -> Loaded:
    """Load YAML/JSON text, a file, or a mapping into plain data plus positions.

    A ``str`` is definition text, except a single line ending in ``.yaml``,
    ``.yml`` or ``.json`` that names an existing file, which is read.
    """
    if isinstance(source, Mapping):
        return Loaded(_plain(source, (), file), Positions(), file)
    if isinstance(source, str) and _names_file(source):
        source = Path(source)
    if isinstance(source, Path):
        file = file or str(source)
        try:
            text = source.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            diagnostic = Diagnostic(message=f"cannot read {source}: {exc}", file=file)
            raise DefinitionError([diagnostic]) from None
        return _load_text(text, file)
    return _load_text(source, file)


def _names_file(text: str) -> bool:
    candidate = text.strip()
    return (
        "\n" not in candidate
        and candidate.lower().endswith(_FILE_SUFFIXES)
        and Path(candidate).is_file()
    )


def _load_text(text: str, file: str | None) -> Loaded:
    loader = yaml.SafeLoader(text)
    walker = _Walker(loader, file)
    try:
        node = loader.get_single_node()
        data = walker.walk(node, ()) if node is not None else None
    except yaml.YAMLError as exc:
        raise DefinitionError([_syntax_diagnostic(exc, file)]) from None
    finally:
        loader.dispose()
    if walker.errors:
        raise DefinitionError(walker.errors)
    return Loaded(data, walker.positions, file)


def _syntax_diagnostic(exc: yaml.YAMLError, file: str | None) -> Diagnostic:
    line = column = None
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        if mark is not None:
            line, column = mark.line + 1, mark.column + 1
        problem = exc.problem or exc.context or "invalid YAML"
        if exc.context and exc.problem:
            problem = f"{exc.problem} ({exc.context})"
    else:
        problem = " ".join(str(exc).split())
    return Diagnostic(
        message=f"YAML syntax error: {' '.join(problem.split())}",
        file=file,
        line=line,
        column=column,
        hint="fix the YAML syntax at this position (check indentation, quotes and colons)",
    )


class _Walker:
    """Turns a composed node tree into plain data, recording positions."""

    def __init__(self, loader: yaml.SafeLoader, file: str | None) -> None:
        self.loader = loader
        self.positions = Positions()
        self.errors: list[Diagnostic] = []
        self.file = file
        self.count = 0
        self.active: set[int] = set()

    def walk(self, node: Node, path: DataPath, key: Node | None = None) -> Any:
        self.positions.record(path, node, key=key)
        self.count += 1
        if self.count > MAX_NODES:
            raise yaml.YAMLError(f"definition too large (more than {MAX_NODES} values)")
        if isinstance(node, ScalarNode):
            return self._scalar(node, path)
        if id(node) in self.active:
            self._error(node, path, "recursive YAML alias", "remove the self-referencing alias")
            return None
        self.active.add(id(node))
        try:
            if isinstance(node, MappingNode):
                return self._mapping(node, path)
            assert isinstance(node, SequenceNode)
            return [self.walk(item, (*path, i)) for i, item in enumerate(node.value)]
        finally:
            self.active.discard(id(node))

    def _mapping(self, node: MappingNode, path: DataPath) -> dict[str, Any]:
        self._check_duplicates(node, path)
        self.loader.flatten_mapping(node)
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, ScalarNode):
                self._error(
                    key_node, path, "mapping keys must be plain strings", "use a string key"
                )
                continue
            key = str(key_node.value)
            out[key] = self.walk(value_node, (*path, key), key=key_node)
        return out

    def _check_duplicates(self, node: MappingNode, path: DataPath) -> None:
        seen: dict[str, Node] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = str(key_node.value)
            if key in seen:
                first = seen[key].start_mark.line + 1
                self._error(
                    key_node,
                    (*path, key),
                    f"duplicate key '{key}' (first defined on line {first})",
                    "remove one of the two entries",
                )
            seen[key] = key_node

    def _scalar(self, node: ScalarNode, path: DataPath) -> Any:
        if node.tag == _TIMESTAMP_TAG:
            return str(node.value)
        value = self.loader.construct_object(node, deep=True)
        if value is None or isinstance(value, str | int | float | bool):
            return value
        self._error(
            node,
            path,
            f"unsupported YAML value of type {type(value).__name__}",
            "use a string, number, boolean, null, list or mapping",
        )
        return None

    def _error(self, node: Node, path: DataPath, message: str, hint: str) -> None:
        self.errors.append(
            Diagnostic(
                message=message,
                file=self.file,
                line=node.start_mark.line + 1,
                column=node.start_mark.column + 1,
                path=format_path(path) or None,
                hint=hint,
            )
        )


def _plain(value: Any, path: DataPath, file: str | None) -> Any:
    """A JSON-compatible deep copy of a mapping given from code."""
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise _code_error(path, f"mapping key {key!r} is not a string", file)
            out[key] = _plain(item, (*path, key), file)
        return out
    if isinstance(value, list | tuple):
        return [_plain(item, (*path, i), file) for i, item in enumerate(value)]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    raise _code_error(path, f"value of type {type(value).__name__} is not JSON-compatible", file)


def _code_error(path: DataPath, message: str, file: str | None) -> DefinitionError:
    hint = "use strings, numbers, booleans, None, lists and dicts with string keys"
    diagnostic = Diagnostic(message=message, file=file, path=format_path(path) or None, hint=hint)
    return DefinitionError([diagnostic])
