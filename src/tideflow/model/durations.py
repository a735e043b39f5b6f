"""Durations as workflows write them, parsed to float seconds.

The one parser: the DSL normalises durations with it at compile time and the
executors parse rendered (templated) config values with it at run time.

Accepted forms:

- a bare number (int or float, or a string holding one): seconds;
- a number with a unit, ``500ms``, ``30s``, ``5m``, ``2h``, ``3d``, ``1w``; units may be
  chained from the largest down, ``1h30m``;
- ISO-8601 durations without years or months (their length varies): ``PT5M``,
  ``P1DT2H``, ``PT0.5S``, ``P2W``.

Whether zero or a negative number makes sense is the caller's decision; a duration
longer than ``MAX_DURATION`` (100 years) is refused: added to a time it would leave the
calendar a date can hold (2**70 seconds is a 500 from every ``datetime`` it reaches).
"""

from __future__ import annotations

import math
import re
from datetime import timedelta

__all__ = ["DURATION_HINT", "MAX_DURATION", "DurationTooLong", "parse_duration"]

MAX_DURATION = 100 * 365.25 * 86400.0
"""The longest duration, either way (100 years, 3,155,760,000 seconds)."""

DURATION_HINT = (
    "write a duration such as 500ms, 30s, 5m, 2h, 3d, 1h30m, a number of seconds, "
    "or ISO-8601 such as PT5M"
)

_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_NUMBER = r"\d+(?:\.\d+)?|\.\d+"
_UNIT_PART = re.compile(rf"({_NUMBER})\s*(ms|s|m|h|d|w)")
_UNITS_RE = re.compile(rf"(?:(?:{_NUMBER})\s*(?:ms|s|m|h|d|w)\s*)+")
_ISO_RE = re.compile(
    rf"P(?:(?P<w>{_NUMBER})W)?(?:(?P<d>{_NUMBER})D)?"
    rf"(?:T(?:(?P<h>{_NUMBER})H)?(?:(?P<m>{_NUMBER})M)?(?:(?P<s>{_NUMBER})S)?)?",
    re.IGNORECASE,
)
_ISO_SECONDS = {"w": 604800.0, "d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}


def parse_duration(value: object) -> float:
    """Return ``value`` as seconds; raise ValueError saying what is accepted."""
    if isinstance(value, bool):
        raise ValueError(f"invalid duration {value!r}: {DURATION_HINT}")
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, int | float):
        return _finite(float(value), value)
    if not isinstance(value, str):
        raise ValueError(f"invalid duration {value!r}: {DURATION_HINT}")
    text = value.strip()
    seconds = _parse_number(text)
    if seconds is None:
        seconds = _parse_units(text.lower())
    if seconds is None:
        seconds = _parse_iso(text)
    if seconds is None:
        raise ValueError(f"invalid duration {value!r}: {DURATION_HINT}")
    return _finite(seconds, value)


class DurationTooLong(ValueError):
    """A duration longer than ``MAX_DURATION``."""


def _finite(seconds: float, original: object) -> float:
    if not math.isfinite(seconds):
        raise ValueError(f"invalid duration {original!r} (not finite): {DURATION_HINT}")
    if abs(seconds) > MAX_DURATION:
        raise DurationTooLong(
            f"invalid duration {_cut(original)}: longer than 100 years "
            f"({MAX_DURATION:.0f} seconds), the longest a workflow may wait"
        )
    return seconds


def _cut(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _parse_number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _parse_units(text: str) -> float | None:
    if not text or not _UNITS_RE.fullmatch(text):
        return None
    parts = _UNIT_PART.findall(text)
    units = [unit for _, unit in parts]
    order = [_UNIT_SECONDS[unit] for unit in units]
    if len(set(units)) != len(units) or order != sorted(order, reverse=True):
        return None
    return sum(float(number) * _UNIT_SECONDS[unit] for number, unit in parts)


def _parse_iso(text: str) -> float | None:
    match = _ISO_RE.fullmatch(text)
    if match is None or text.upper() in ("P", "PT") or text.upper().endswith("T"):
        return None
    groups = match.groupdict()
    if all(number is None for number in groups.values()):
        return None
    return sum(float(number) * _ISO_SECONDS[key] for key, number in groups.items() if number)
