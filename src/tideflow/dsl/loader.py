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
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from tideflow.dsl.json_source import line_column, load_json
from tideflow.dsl.positions import DataPath, Positions, format_path
from tideflow.errors import DefinitionError, DefinitionUnreadable, Diagnostic
from tideflow.model import storable

__all__ = [
    "MAX_DEFINITION_BYTES",
    "DataPath",
    "Loaded",
    "Positions",
    "Reporter",
    "did_you_mean",
    "format_path",
    "load",
]

MAX_NODES = 200_000
"""Alias expansion beyond this many values (or one per two bytes of a larger file) is
refused: a "billion laughs" guard."""

MAX_DEPTH = 64
"""Lists and mappings nested deeper than this are refused: every later phase walks the
definition recursively, and no workflow needs more (steps nested in loops and branches
take two levels each)."""

MAX_DEFINITION_BYTES = 32 * 1024 * 1024
"""The largest definition loaded (32 MiB; ``TIDEFLOW_MAX_DEFINITION_BYTES`` overrides).
A 100,000-step JSON definition is about 12 MB."""
MAX_BYTES_VARIABLE = "TIDEFLOW_MAX_DEFINITION_BYTES"

_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"
_FILE_SUFFIXES = (".yaml", ".yml", ".json")
_SafeLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass(frozen=True, slots=True)
class Loaded:
    data: Any
    positions: Positions
    file: str | None
    problems: tuple[Diagnostic, ...] = ()
    """Errors in otherwise usable data (duplicate keys: the last one counts), when loaded
    with ``keep_going``."""


def did_you_mean(word: str, candidates: Iterable[str]) -> str | None:
    matches = difflib.get_close_matches(word, sorted(set(candidates)), n=1, cutoff=0.6)
    return matches[0] if matches else None


@dataclass
class Reporter:
    """Collects diagnostics, filling in file, position and path."""

    positions: Positions
    file: str | None = None
    diagnostics: list[Diagnostic] = field(default_factory=list)
    error_paths: list[DataPath] = field(default_factory=list)
    """Where each error was reported (source paths until the positions are relinked)."""

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
        if severity == "error":
            self.error_paths.append(path)
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


def load(
    source: str | Path | Mapping[str, Any], *, file: str | None = None, keep_going: bool = False
) -> Loaded:
    """Load YAML/JSON text, a file, or a mapping into plain data plus positions.

    A ``str`` is definition text, except a single line ending in ``.yaml``,
    ``.yml`` or ``.json`` that names an existing file, which is read. A file (or
    ``file`` name) ending in ``.json`` is parsed as JSON, anything else as YAML.
    Problems that leave the data usable (duplicate keys, a key or value YAML allows
    but JSON does not) raise DefinitionError, or with ``keep_going`` are returned in
    `Loaded.problems`; syntax errors always raise.
    """
    if isinstance(source, Mapping):
        return _checked(Loaded(_plain(source, (), file), Positions(), file))
    if isinstance(source, str) and _names_file(source):
        source = Path(source)
    if isinstance(source, Path):
        file = file or str(source)
        text = read_definition(source, file)
    else:
        _check_size(len(source), file)
        text = source
    loaded = _checked(_load_text(text, file))
    if loaded.problems and not keep_going:
        raise DefinitionError(list(loaded.problems))
    return loaded


def _checked(loaded: Loaded) -> Loaded:
    """``loaded``, unless it is nested too deeply or holds an integer out of the range a
    run may hold (model/storable.py: the one rule of every edge)."""
    deep = _too_deep(loaded.data)
    if deep is not None:
        raise DefinitionError([_too_deep_diagnostic(deep, loaded.positions, loaded.file)])
    found = storable.integer_problem(loaded.data)
    if found is not None:
        path, message = found
        line, column = loaded.positions.find(path) or (None, None)
        diagnostic = Diagnostic(
            message=message,
            file=loaded.file,
            line=line,
            column=column,
            path=format_path(path) or None,
            hint='write it as a string ("12345678901234567890123")',
        )
        raise DefinitionError([diagnostic])
    return loaded


def _too_deep(data: Any) -> DataPath | None:
    """The path of a value nested deeper than ``MAX_DEPTH``, if there is one. Walked level
    by level over the containers only (a 100,000-step definition costs milliseconds);
    the path is looked for only when there is one."""
    level = [data] if isinstance(data, dict | list) else []
    for _ in range(MAX_DEPTH):
        below: list[Any] = []
        for value in level:
            items = value.values() if isinstance(value, dict) else value
            below.extend([item for item in items if isinstance(item, dict | list)])
        level = below
    if not any(level):  # no container MAX_DEPTH down holds anything
        return None
    stack: list[tuple[DataPath, Any]] = [((), data)]
    while stack:
        path, value = stack.pop()
        if len(path) > MAX_DEPTH:
            return path
        if isinstance(value, dict):
            stack.extend(((*path, k), v) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend(((*path, i), v) for i, v in enumerate(value))
    return None  # pragma: no cover -- the first walk found one


def _too_deep_diagnostic(path: DataPath, positions: Positions, file: str | None) -> Diagnostic:
    line, column = positions.find(path) or (None, None)
    return Diagnostic(
        message=f"nested too deeply: more than {MAX_DEPTH} levels of lists and mappings",
        file=file,
        line=line,
        column=column,
        path=format_path(path[: MAX_DEPTH + 1]) or None,
        hint="flatten the data, or keep large nested data outside the definition",
    )


def max_definition_bytes() -> int:
    raw = os.environ.get(MAX_BYTES_VARIABLE, "")
    return int(raw) if raw.strip().isdigit() else MAX_DEFINITION_BYTES


def read_definition(path: Path, file: str | None = None) -> str:
    """The text of a definition file; DefinitionUnreadable when it is not one."""
    file = file or str(path)
    limit = max_definition_bytes()
    try:
        with path.open("rb") as stream:
            data = stream.read(limit + 1)
    except OSError as exc:
        raise _unreadable(f"cannot read {path}: {exc.strerror or exc}", file) from None
    _check_size(len(data), file)
    nul = data.find(b"\0")
    if nul >= 0:
        line, column = _byte_position(data, nul)
        raise _unreadable(
            f"{path} is not a text file: a NUL byte at line {line}, column {column}", file
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line, column = _byte_position(data, exc.start)
        raise _unreadable(
            f"{path} is not UTF-8 text: byte 0x{data[exc.start]:02x} at line {line}, "
            f"column {column}",
            file,
        ) from None
    return text.removeprefix("\ufeff")


def _byte_position(data: bytes, offset: int) -> tuple[int, int]:
    start = data.rfind(b"\n", 0, offset) + 1
    column = len(data[start:offset].decode("utf-8", errors="replace")) + 1
    return data.count(b"\n", 0, offset) + 1, column


def _check_size(size: int, file: str | None) -> None:
    limit = max_definition_bytes()
    if size > limit:
        raise _unreadable(
            f"definition too large: more than {limit} bytes (the limit is "
            f"{MAX_BYTES_VARIABLE}, default {MAX_DEFINITION_BYTES})",
            file,
        )


def _unreadable(message: str, file: str | None) -> DefinitionUnreadable:
    hint = "give a YAML or JSON definition saved as UTF-8 text"
    return DefinitionUnreadable([Diagnostic(message=message, file=file, hint=hint)])


def _names_file(text: str) -> bool:
    candidate = text.strip()
    return (
        "\n" not in candidate
        and candidate.lower().endswith(_FILE_SUFFIXES)
        and Path(candidate).is_file()
    )


def _load_text(text: str, file: str | None) -> Loaded:
    if file is not None and file.lower().endswith(".json"):
        data, positions, problems = load_json(text, file)
        return Loaded(data, positions, file, tuple(problems))
    walker: _Walker | None = None
    try:
        loader = _SafeLoader(text)
        walker = _Walker(loader, file, max(MAX_NODES, len(text) // 2))
        try:
            node = loader.get_single_node()
            data = walker.walk(node, ()) if node is not None else None
        finally:
            loader.dispose()
    except yaml.reader.ReaderError as exc:
        raise DefinitionError([_reader_diagnostic(exc, text, file)]) from None
    except RecursionError:  # PyYAML's own composer, where libyaml is not installed
        raise DefinitionError([_too_deep_diagnostic((), Positions(), file)]) from None
    except yaml.YAMLError as exc:
        raise DefinitionError([_syntax_diagnostic(exc, file)]) from None
    return Loaded(data, walker.positions, file, tuple(walker.errors))


def _reader_diagnostic(exc: yaml.reader.ReaderError, text: str, file: str | None) -> Diagnostic:
    line, column = line_column(text, exc.position)
    char = exc.character if isinstance(exc.character, int) else ord(str(exc.character)[:1] or "?")
    return Diagnostic(
        message=f"character U+{char:04X} is not allowed in a YAML definition",
        file=file,
        line=line,
        column=column,
        hint="remove the control character (a definition is plain UTF-8 text)",
    )


class _TooLarge(yaml.YAMLError):
    pass


def _syntax_diagnostic(exc: yaml.YAMLError, file: str | None) -> Diagnostic:
    if isinstance(exc, _TooLarge):
        hint = "expand fewer aliases, or split the workflow into subflows"
        return Diagnostic(message=str(exc), file=file, hint=hint)
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

    def __init__(self, loader: yaml.SafeLoader, file: str | None, max_nodes: int) -> None:
        self.loader = loader
        self.max_nodes = max_nodes
        self.positions = Positions()
        self.errors: list[Diagnostic] = []
        self.file = file
        self.count = 0
        self.active: set[int] = set()

    def walk(self, node: Node, path: DataPath, key: Node | None = None) -> Any:
        self._record(path, node, key)
        if len(path) > MAX_DEPTH:  # refused before the recursion goes deeper
            raise DefinitionError([_too_deep_diagnostic(path, self.positions, self.file)])
        self.count += 1
        if self.count > self.max_nodes:
            raise _TooLarge(
                f"definition too large: more than {self.max_nodes} values once YAML aliases "
                "are expanded"
            )
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

    def _record(self, path: DataPath, node: Node, key: Node | None) -> None:
        style = node.style if isinstance(node, ScalarNode) else None
        self.positions.set_position(
            path,
            (node.start_mark.line + 1, node.start_mark.column + 1),
            (key.start_mark.line + 1, key.start_mark.column + 1) if key is not None else None,
            quoted=style in ('"', "'"),
            block=style in ("|", ">"),
        )

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
    if len(path) > MAX_DEPTH:
        raise DefinitionError([_too_deep_diagnostic(path, Positions(), file)])
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
