"""JSON definitions: parsed by orjson, positions computed only when a diagnostic needs one.

Parsing a 100,000-step definition takes orjson a fraction of a second; recording the
line and column of every value on the way (what the YAML loader does) would cost
many times that, for positions that are only read when something is wrong. So the
data comes from orjson and `scan_positions` walks the text once, on the first
lookup (`Positions.deferred`).

orjson keeps the last of two equal keys in an object silently; the YAML loader
reports them. Keys written are counted with one regular expression and compared
with the keys parsed: only when they differ is the text scanned to say where.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterator
from typing import Any

import orjson

from tideflow.dsl.positions import DataPath, Positions, format_path
from tideflow.errors import DefinitionError, Diagnostic
from tideflow.model import storable

__all__ = ["load_json"]

_KEY = re.compile(r'"(?:[^"\\]|\\.)*"\s*:')
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[{}\[\]:,]|[^\s{}\[\]:,"]+')


def load_json(text: str, file: str | None) -> tuple[Any, Positions, list[Diagnostic]]:
    """The data of a JSON definition, its (deferred) positions, and its duplicate keys."""
    try:
        data = storable.loads(text)  # integers exact: the loader refuses one out of range
    except orjson.JSONDecodeError as exc:
        raise DefinitionError([_syntax_error(exc, text, file)]) from None
    positions = Positions.deferred(lambda target: scan_positions(text, target))
    if len(_KEY.findall(text)) != _parsed_keys(data):
        return data, positions, _duplicates(text, file)
    return data, positions, []


def _syntax_error(exc: orjson.JSONDecodeError, text: str, file: str | None) -> Diagnostic:
    line, column = line_column(text, exc.pos)
    return Diagnostic(
        message=f"JSON syntax error: {exc.msg}",
        file=file,
        line=line,
        column=column,
        hint="fix the JSON at this position (JSON allows no trailing commas, comments or "
        "single quotes)",
    )


def line_column(text: str, offset: int) -> tuple[int, int]:
    """1-based line and column of the character at ``offset``."""
    offset = max(0, min(offset, len(text)))
    start = text.rfind("\n", 0, offset) + 1
    return text.count("\n", 0, offset) + 1, offset - start + 1


def _parsed_keys(data: Any) -> int:
    count, stack = 0, [data]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            count += len(value)
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return count


def _duplicates(text: str, file: str | None) -> list[Diagnostic]:
    found: list[Diagnostic] = []
    for path, key, first, again in _scan(text, Positions()):
        found.append(
            Diagnostic(
                message=f"duplicate key '{key}' (first defined on line {first[0]})",
                file=file,
                line=again[0],
                column=again[1],
                path=format_path((*path, key)) or None,
                hint="remove one of the two entries",
            )
        )
    return found


def scan_positions(text: str, target: Positions) -> None:
    """Record where every value and key of the (valid) JSON ``text`` starts."""
    for _ in _scan(text, target):
        pass


class _Frame:
    __slots__ = ("index", "key", "keys", "path")

    def __init__(self, path: DataPath, mapping: bool) -> None:
        self.path = path
        self.index = 0
        self.key: str | None = None
        self.keys: dict[str, tuple[int, int]] | None = {} if mapping else None


def _scan(text: str, target: Positions) -> Iterator[tuple[DataPath, str, Any, Any]]:
    """Walk the tokens, recording positions; yield each duplicate key found."""
    lines = [m.end() for m in re.finditer("\n", text)]

    def where(offset: int) -> tuple[int, int]:
        line = bisect.bisect_right(lines, offset)
        return line + 1, offset - (lines[line - 1] if line else 0) + 1

    stack: list[_Frame] = []
    expect_key = False
    key_at: tuple[int, int] | None = None
    for match in _TOKEN.finditer(text):
        token, offset = match.group(), match.start()
        if token in ",:":
            continue
        if token in "]}":
            stack.pop()
            expect_key = bool(stack) and stack[-1].keys is not None
            continue
        frame = stack[-1] if stack else None
        if frame is not None and frame.keys is not None and expect_key:
            key = orjson.loads(token)
            first = frame.keys.get(key)
            key_at = where(offset)
            if first is not None:
                yield frame.path, key, first, key_at
            frame.keys[key] = key_at
            frame.key, expect_key = key, False
            continue
        path = _value_path(frame)
        target.set_position(path, where(offset), key_at, quoted=token[0] == '"')
        key_at = None
        if token in "{[":
            stack.append(_Frame(path, token == "{"))
            expect_key = token == "{"
        elif frame is not None and frame.keys is not None:
            expect_key = True


def _value_path(frame: _Frame | None) -> DataPath:
    if frame is None:
        return ()
    if frame.keys is not None:
        return (*frame.path, frame.key or "")
    frame.index += 1
    return (*frame.path, frame.index - 1)
