"""``schedule:`` in a definition: checked (each problem at its file:line:column) and
normalised.

::

    schedule: {cron: "0 6 * * 1-5", timezone: Europe/Paris}   # one schedule (id: default)
    schedule:                                                 # several, each with an id
      - {id: morning, cron: "0 6 * * 1-5", timezone: Europe/Paris, overlap: skip}
      - {id: sweep, every: 15m, jitter: 30s, catchup: none, input: {full: false}}

The normal form is a list of ``ScheduleSpec.to_data()`` mappings (durations and times in
seconds), which this module accepts back unchanged (a stored plan is compiled again from
its normal form).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from functools import cache
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from croniter import croniter

from tideflow.dsl.durations import DURATION_HINT, parse_duration
from tideflow.dsl.loader import DataPath, Reporter, did_you_mean
from tideflow.dsl.positions import Positions
from tideflow.dsl.schema_values import (
    Check,
    Validator,
    any_duration,
    check_keys,
    describe,
    enum,
    expect,
    mapping,
    positive_duration,
)
from tideflow.errors import DefinitionError
from tideflow.model.schedules import Catchup, Overlap, ScheduleSpec

__all__ = [
    "MAX_SCHEDULES",
    "SCHEDULE_KEYS",
    "check_schedule",
    "normal_schedules",
    "parse_schedule",
]

MAX_SCHEDULES = 20
DEFAULT_ID = "default"
SCHEDULE_ID_RE = re.compile(r"[a-z0-9][a-z0-9_.-]*")
SCHEDULE_HINT = (
    'write schedule: {cron: "0 6 * * 1-5", timezone: Europe/Paris} or schedule: {every: 15m}, '
    "or a list of them, each with an id"
)
CRON_HINT = (
    'write 5 fields, minute hour day-of-month month day-of-week, such as "0 6 * * 1-5" '
    "(6 fields: seconds last, croniter's order)"
)


def check_schedule(check: Check, value: Any, path: DataPath) -> None:
    """``schedule:``: one mapping, or a list of mappings with distinct ids."""
    if isinstance(value, dict):
        _one(check, value, path)
        return
    if not isinstance(value, list) or not value:
        message = f"expected a schedule mapping or a non-empty list of them, got {describe(value)}"
        check.error(path, message, SCHEDULE_HINT)
        return
    if len(value) > MAX_SCHEDULES:
        check.error(path, f"at most {MAX_SCHEDULES} schedules, got {len(value)}", SCHEDULE_HINT)
    seen: set[str] = set()
    for i, entry in enumerate(value):
        at = (*path, i)
        if not expect(check, entry, at, dict, "a schedule mapping {cron or every, …}"):
            continue
        _one(check, entry, at)
        sid = entry.get("id")
        if len(value) > 1 and "id" not in entry:
            check.error(
                at, "each of several schedules needs an id", "add id: <name>, e.g. id: daily"
            )
        elif isinstance(sid, str) and sid in seen:
            check.error(
                (*at, "id"), f"duplicate schedule id {sid!r}", "give each schedule its own id"
            )
        if isinstance(sid, str):
            seen.add(sid)


def _one(check: Check, value: Mapping[str, Any], path: DataPath) -> None:
    check_keys(check, value, path, SCHEDULE_KEYS, "in a schedule")
    has = [key for key in ("cron", "every") if key in value]
    if len(has) != 1:
        what = "both cron and every" if has else "neither cron nor every"
        check.error(path, f"a schedule has exactly one of cron or every, got {what}", SCHEDULE_HINT)
    for key, validate in _FIELDS.items():
        if key in value:
            validate(check, value[key], (*path, key))
    start, end = _time_or_none(value.get("start_at")), _time_or_none(value.get("end_at"))
    if start is not None and end is not None and end <= start:
        check.error((*path, "end_at"), "end_at must be after start_at", "swap them, or move end_at")


def _schedule_id(check: Check, value: Any, path: DataPath) -> None:
    if expect(check, value, path, str, "a string") and not SCHEDULE_ID_RE.fullmatch(value):
        hint = "use lower case letters, digits, '_', '.', '-', e.g. daily-report"
        check.error(path, f"invalid schedule id {value!r}: must match [a-z0-9][a-z0-9_.-]*", hint)


def _cron(check: Check, value: Any, path: DataPath) -> None:
    if not expect(check, value, path, str, "a cron expression string"):
        return
    problem = cron_problem(value)
    if problem is not None:
        check.error(path, f"invalid cron expression {value!r}: {problem}", CRON_HINT)


def cron_problem(expression: str) -> str | None:
    """Why croniter refuses ``expression`` (None: it is valid)."""
    fields = expression.split()
    if not (5 <= len(fields) <= 6 or (len(fields) == 1 and fields[0].startswith("@"))):
        return f"expected 5 or 6 fields, got {len(fields)}"
    try:
        croniter(expression)
    except (ValueError, KeyError, TypeError) as exc:  # croniter's errors are ValueErrors
        return str(exc) or type(exc).__name__
    return None


def _timezone(check: Check, value: Any, path: DataPath) -> None:
    if not expect(check, value, path, str, "an IANA time zone name"):
        return
    if zone_or_none(value) is None:
        if not _zones():  # zoneinfo finds no IANA database at all on this machine
            hint = "this machine has no IANA time zone database: install one (pip install tzdata)"
            check.error(path, f"unknown time zone {value!r}", hint)
            return
        suggestion = did_you_mean(value, _zones())
        hint = f"did you mean '{suggestion}'? " if suggestion else ""
        check.error(
            path,
            f"unknown time zone {value!r}",
            f"{hint}write an IANA time zone name such as Europe/Paris, America/New_York or UTC",
        )


def zone_or_none(name: str) -> ZoneInfo | None:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        return None


@cache
def _zones() -> frozenset[str]:
    return frozenset(available_timezones())


def _moment(check: Check, value: Any, path: DataPath) -> None:
    seconds = _time_or_none(value)
    if seconds is None or (path[-1] == "start_at" and seconds >= _LAST_START):
        check.error(
            path,
            f"{path[-1]} must be an ISO 8601 date-time or seconds since the epoch, "
            f"from the year 2 to 9000 (start_at) or 9999 (end_at), got {describe(value)}",
            'write such as "2027-01-04T06:00:00+01:00" (without an offset: UTC)',
        )


_FIRST_MOMENT = datetime(2, 1, 1, tzinfo=UTC).timestamp()
_LAST_MOMENT = datetime.max.replace(tzinfo=UTC).timestamp()
_LAST_START = datetime(9000, 1, 1, tzinfo=UTC).timestamp()
"""Slots are written as dates: they start well before the calendar ends."""
MIN_EVERY = 0.001
"""The shortest ``every`` (1ms): a shorter one has more slots than a float can count."""


def _time_or_none(value: Any) -> float | None:
    """An ISO 8601 date-time (UTC without an offset) or epoch seconds, as epoch seconds;
    None for anything else, a time outside the calendar a date can hold included."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value) if math.isfinite(value) else None
    elif isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            return None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=ZoneInfo("UTC"))
        seconds = moment.timestamp()
    else:
        return None
    if seconds is None or not _FIRST_MOMENT <= seconds <= _LAST_MOMENT:
        return None
    return seconds


def _input(check: Check, value: Any, path: DataPath) -> None:
    if not isinstance(value, dict):
        mapping(check, value, path)
        return
    if "scheduled_at" in value:
        check.error(
            (*path, "scheduled_at"),
            "scheduled_at is set by the schedule (the slot's time, ISO 8601 UTC)",
            "remove it from the schedule's input; the run reads inputs.scheduled_at",
            at_key=True,
        )


def _every(check: Check, value: Any, path: DataPath) -> None:
    positive_duration(check, value, path)
    try:
        seconds = parse_duration(value)
    except ValueError:
        return  # reported above
    if 0 < seconds < MIN_EVERY:
        check.error(path, f"every must be at least 1ms, got {value!r}", DURATION_HINT)


_FIELDS: Mapping[str, Validator] = {
    "id": _schedule_id,
    "cron": _cron,
    "every": _every,
    "timezone": _timezone,
    "overlap": enum(*(str(o) for o in Overlap)),
    "catchup": enum(*(str(c) for c in Catchup)),
    "jitter": any_duration,
    "start_at": _moment,
    "end_at": _moment,
    "input": _input,
}
SCHEDULE_KEYS = frozenset(_FIELDS)


def parse_schedule(value: Any) -> ScheduleSpec:
    """One schedule given through the client (``Client.create_schedule``): a mapping as
    ``schedule:`` takes, with an ``id``; ``DefinitionError`` lists every problem."""
    report = Reporter(positions=Positions())
    check = Check(report, {})
    if expect(check, value, ("schedule",), dict, "a schedule mapping {id, cron or every, …}"):
        check_schedule(check, value, ("schedule",))
        if "id" not in value:
            check.error(
                ("schedule",), "a schedule made through the client needs an id", "add id: <name>"
            )
    if report.has_errors:
        raise DefinitionError(report.diagnostics)
    return _normal(value)


def normal_schedules(value: Any) -> list[dict[str, Any]]:
    """The normal form of a checked ``schedule:`` (see the module)."""
    entries = [value] if isinstance(value, dict) else list(value)
    return [_normal(entry).to_data() for entry in entries]


def _normal(raw: Mapping[str, Any]) -> ScheduleSpec:
    every = raw.get("every")
    return ScheduleSpec(
        id=str(raw.get("id", DEFAULT_ID)),
        cron=" ".join(raw["cron"].split()) if "cron" in raw else None,
        every=None if every is None else parse_duration(every),
        timezone=str(raw.get("timezone", "UTC")),
        overlap=Overlap(raw.get("overlap", Overlap.SKIP)),
        catchup=Catchup(raw.get("catchup", Catchup.LATEST)),
        jitter=parse_duration(raw.get("jitter", 0)),
        start_at=_time_or_none(raw.get("start_at")),
        end_at=_time_or_none(raw.get("end_at")),
        input=dict(raw.get("input") or {}),
    )
