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
"""

from __future__ import annotations

import math
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


def encode(value: Any, what: str, *, option: int = 0) -> bytes:
    """``value`` as JSON bytes, or ``OutputNotSerializable`` saying why it cannot be stored.

    ``what`` names the value in the message ("the output of step 'a'").
    """
    if value is None:  # the output of most engine steps and many actions
        return b"null"
    try:
        data = orjson.dumps(value, option=option)
    except TypeError as exc:
        raise OutputNotSerializable(f"{what} cannot be stored as JSON: {_reason(exc)}") from None
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


def _reason(exc: TypeError) -> str:
    text = str(exc)
    if "64-bit" in text:
        return f"{text} (integers must lie within -2**63 .. 2**64-1; pass larger ones as strings)"
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


__all__ = ["MAX_RUN_INPUT", "MAX_STEP_OUTPUT", "check", "describe_size", "encode"]
