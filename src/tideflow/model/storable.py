"""Which values a run may hold: exactly what every store writes and reads back unchanged.

A run's values (step outputs, engine-step values, run input and output, signal
payloads) are stored as JSON. ``check`` is the one test, used by the worker for
action outputs, by the core for the values engine steps compute and by the
runtime for what comes in from outside; a value that fails it fails the step
(or is refused at the door) instead of reaching the store, where it would fail
the commit of every run that shares the batch.

Storable: ``None``, ``bool``, ``str``, integers from -2**63 to 2**64-1, finite floats, and lists and
mappings with string keys of storable values. Not storable: larger integers,
NaN and infinities (JSON has no word for them; they would silently become
``null``), other objects.

The integer range is the one rule for integers on every edge (REST bodies, the
CloudEvents gateway, definitions, CLI JSON, signals): ``integer_problem`` finds the
first integer outside it and names where it is, and ``loads`` reads JSON text with
its integers exact, so one outside the range is refused by ``check`` (or by the
definition loader) instead of turning into a float, which is what orjson makes of an
integer beyond 64 bits.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

import orjson

from tideflow.errors import OutputNotSerializable, OutputTooLarge

KIB = 1024
MIB = 1024 * KIB
MAX_STEP_OUTPUT = 1 * MIB
"""Default limit on a step's output (its JSON form, in bytes)."""
MAX_RUN_INPUT = 16 * MIB
"""Default limit on a run's input (its JSON form, in bytes)."""
INTEGER_MIN = -(2**63)
INTEGER_MAX = 2**64 - 1
"""Integers a run may hold: what orjson writes and every store reads back exactly."""
INTEGER_RULE = "integers must lie within -2**63 .. 2**64-1 (64-bit); pass larger ones as strings"
MAX_NESTING = 254
"""Arrays and objects nested deeper than this cannot be written (orjson's limit)."""

Path = tuple[str | int, ...]

# An integer of 19 digits or more may lie outside the range (2**63 has 19): only then
# is JSON text read a second time, exactly.
_LONG_DIGITS = re.compile(rb"[0-9]{19}")


def encode(value: Any, what: str, *, option: int = 0) -> bytes:
    """``value`` as JSON bytes, or ``OutputNotSerializable`` saying why it cannot be stored.

    ``what`` names the value in the message ("the output of step 'a'").
    """
    if value is None:  # the output of most engine steps and many actions
        return b"null"
    try:
        data = orjson.dumps(value, option=option)
    except TypeError as exc:
        reason = _reason(exc, value)
        raise OutputNotSerializable(f"{what} cannot be stored as JSON: {reason}") from None
    # orjson writes NaN and infinities as null: only then look closer.
    if b"null" in data and (problem := _find_problem(value)):
        raise OutputNotSerializable(f"{what} cannot be stored as JSON: {problem}")
    return data


def check(value: Any, what: str, limit: int | None = None) -> int:
    """Raise unless ``value`` is storable (and, with ``limit``, at most that many bytes
    as JSON); return its size in bytes."""
    size = len(encode(value, what))
    if limit is not None and size > limit:
        raise OutputTooLarge(
            f"{what} is {describe_size(size)} as JSON, over the limit of {describe_size(limit)}; "
            "keep large data outside the run and pass a reference to it (a file path, a URL, "
            "an id), or raise the limit (docs/operations.md, 'Limits')"
        )
    return size


def describe_size(size: int) -> str:
    if size >= MIB:
        return f"{size / MIB:.1f} MiB"
    if size >= KIB:
        return f"{size / KIB:.1f} KiB"
    return f"{size} bytes"


def integer_problem(value: Any) -> tuple[Path, str] | None:
    """The path of the first integer in ``value`` outside the range a run may hold
    (``("items", 2, "n")``; ``()`` for ``value`` itself) and what is wrong with it;
    None when every integer fits. Mapping keys are not looked at (they are strings)."""
    try:
        orjson.dumps(value)  # writes every integer in the range, refuses every other
    except TypeError:
        pass  # an integer out of range, or another reason: look (paths only now)
    else:
        return None
    stack: list[tuple[Path, Any]] = [((), value)]
    while stack:
        path, item = stack.pop()
        kind = type(item)
        if kind is int or (isinstance(item, int) and not isinstance(item, bool)):
            if not INTEGER_MIN <= item <= INTEGER_MAX:
                return path, f"the integer {_cut_digits(item)} is out of range: {INTEGER_RULE}"
        elif isinstance(item, Mapping):
            stack.extend(((*path, str(k)), v) for k, v in reversed(list(item.items())))
        elif isinstance(item, list | tuple):
            stack.extend(((*path, i), v) for i, v in reversed(list(enumerate(item))))
    return None


def format_path(path: Path, root: str = "") -> str:
    """``root.items[2].n``: a path as the API names fields."""
    text = root
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text


def loads(text: bytes | str) -> Any:
    """JSON text as data, as orjson reads it except that integers stay exact: one
    beyond 64 bits is a Python int (which ``check`` refuses), never a float.
    ``orjson.JSONDecodeError`` (a ``ValueError``) for text that is not JSON, or nested
    deeper than orjson reads (1024 levels)."""
    data = orjson.loads(text)
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    if not _LONG_DIGITS.search(raw) or not _has_inexact(data):
        return data
    try:
        return json.loads(text)
    except RecursionError:  # valid (orjson read it) but deeper than Python's parser goes
        return data


def _has_inexact(data: Any) -> bool:
    """Whether orjson may have turned an integer into a float: a float of 2**63 or more
    (every integer within the range it keeps exact)."""
    stack = [data]
    while stack:
        item = stack.pop()
        if type(item) is float and not -(2.0**63) < item < 2.0**64:
            return True
        if type(item) is dict:
            stack.extend(item.values())
        elif type(item) is list:
            stack.extend(item)
    return False


def _cut_digits(number: int) -> str:
    text = str(number)
    return text if len(text) <= 40 else f"{text[:20]}...({len(text)} digits)"


def _reason(exc: TypeError, value: Any) -> str:
    text = str(exc)
    if "64-bit" in text:
        found = integer_problem(value)
        if found is None:
            return f"{text} ({INTEGER_RULE})"
        return f"{format_path(found[0])}: {found[1]}" if found[0] else found[1]
    if "recursion limit" in text.lower():
        return (
            f"{text}: arrays and objects are nested more than {MAX_NESTING} levels deep; "
            "flatten the value"
        )
    if "keys must be str" in text.lower() or "dict key" in text.lower():
        return f"{text} (mapping keys must be strings)"
    return text


def _find_problem(value: Any) -> str | None:
    """The first NaN or infinity inside ``value``, described; None if there is none."""
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if item is None or kind is str or kind is int or kind is bool:
            continue
        if isinstance(item, float):
            if not math.isfinite(item):
                return f"{item!r} is not a number JSON can hold (use a string or null instead)"
        elif isinstance(item, dict | Mapping):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
        elif hasattr(item, "tolist"):  # numpy arrays and scalars
            stack.append(item.tolist())
    return None


__all__ = [
    "INTEGER_MAX",
    "INTEGER_MIN",
    "MAX_RUN_INPUT",
    "MAX_STEP_OUTPUT",
    "check",
    "describe_size",
    "encode",
    "format_path",
    "integer_problem",
    "loads",
]
