"""When a schedule's slots fall: pure maths over a ``ScheduleSpec`` (no clock, no I/O).

A *slot* is an instant (seconds since the epoch) at which the schedule starts a run. For
``every: N`` the slots are ``anchor + k*N`` (``anchor``: ``start_at``, or the epoch, so
every server computes the same slots whenever it started). For ``cron:`` they are what
croniter yields in the schedule's time zone, DST included (see docs/schedules.md: a
02:30 slot on a spring-forward night fires at 03:00 local time, the first instant after
the gap; on a fall-back night a 02:30 slot fires once, at the first 02:30). No slot lies
before ``start_at`` or after ``end_at``.

A slot *fires* at the slot plus its jitter: a fraction of ``jitter`` derived from the
workflow, the schedule id and the slot, so that every server agrees on it.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

from croniter import croniter

from tideflow.model.schedules import Catchup, ScheduleSpec

__all__ = [
    "MAX_CATCHUP",
    "ON_TIME",
    "Due",
    "due_slots",
    "fire_time",
    "iso_slot",
    "slot_after",
]

MAX_CATCHUP = 1000
"""Most missed slots one round starts with ``catchup: all`` (the most recent ones)."""
ON_TIME = 60.0
"""With ``catchup: none`` a slot still fires when the server is at most this late (or
half the time to the next slot, when that is shorter); later than that it was missed."""


def iso_slot(slot: float) -> str:
    """A slot as ISO 8601 UTC (``2027-01-04T05:00:00Z``): ``inputs.scheduled_at`` and the
    run's idempotency key."""
    moment = datetime.fromtimestamp(slot, UTC)
    text = moment.isoformat(timespec="milliseconds" if moment.microsecond else "seconds")
    return text.replace("+00:00", "Z")


def fire_time(spec: ScheduleSpec, workflow: str, slot: float) -> float:
    """When the slot fires: the slot plus its share of ``jitter`` (stable per slot)."""
    if spec.jitter <= 0:
        return slot
    digest = hashlib.sha256(f"{workflow}\0{spec.id}\0{slot!r}".encode()).digest()
    fraction = int.from_bytes(digest[:8], "big") / 2**64
    return slot + fraction * spec.jitter


def slot_after(spec: ScheduleSpec, after: float) -> float | None:
    """The first slot strictly after ``after`` (and not before ``start_at``); None past
    ``end_at``."""
    if spec.start_at is not None and after < spec.start_at:
        after = math.nextafter(spec.start_at, -math.inf)
    slot = _every_after(spec, after) if spec.every is not None else _cron_after(spec, after)
    if spec.end_at is not None and slot > spec.end_at:
        return None
    return slot


def _slots_back(spec: ScheduleSpec, until: float) -> Iterator[float]:
    """The slots at or before ``until``, latest first, down to ``start_at``."""
    if spec.end_at is not None:
        until = min(until, spec.end_at)
    if spec.every is not None:
        anchor = spec.start_at or 0.0
        k = math.floor((until - anchor) / spec.every)
        while spec.start_at is None or k >= 0:
            yield anchor + k * spec.every
            k -= 1
        return
    it = croniter(_cron(spec), datetime.fromtimestamp(math.floor(until) + 1, _zone(spec)))
    while True:
        slot = float(it.get_prev(float))
        if spec.start_at is not None and slot < spec.start_at:
            return
        yield slot


def _every_after(spec: ScheduleSpec, after: float) -> float:
    assert spec.every is not None
    anchor = spec.start_at or 0.0
    k = math.floor((after - anchor) / spec.every) + 1
    slot = anchor + k * spec.every
    return slot if slot > after else slot + spec.every


def _cron_after(spec: ScheduleSpec, after: float) -> float:
    # croniter starts from whole seconds: from floor(after), the next slot is after it
    it = croniter(_cron(spec), datetime.fromtimestamp(math.floor(after), _zone(spec)))
    return float(it.get_next(float))


def _cron(spec: ScheduleSpec) -> str:
    if spec.cron is None:
        raise ValueError(f"schedule {spec.id!r} has neither cron nor every")
    return spec.cron


def _zone(spec: ScheduleSpec) -> ZoneInfo:
    return ZoneInfo(spec.timezone)


class Due:
    """What a schedule must do at ``now``: the slots to start, and the next slot."""

    __slots__ = ("missed", "next_slot", "slots")

    def __init__(self, slots: list[float], next_slot: float | None, missed: int) -> None:
        self.slots = slots
        """The slots to start runs for, oldest first."""
        self.next_slot = next_slot
        """The first slot not yet due (None: no slot left)."""
        self.missed = missed
        """Due slots that ``catchup`` left out (counted up to ``MAX_CATCHUP + 1``)."""


def due_slots(spec: ScheduleSpec, workflow: str, next_slot: float, now: float) -> Due:
    """The slots from ``next_slot`` on that fire at or before ``now``, as ``catchup``
    keeps them (``none``: only a slot fired on time; ``latest``: the most recent one;
    ``all``: every one, at most ``MAX_CATCHUP``), and the next slot after them."""
    fired: list[float] = []
    first_pending: float | None = None
    for slot in _slots_back(spec, now):
        if slot < next_slot or len(fired) > MAX_CATCHUP:
            break
        if fire_time(spec, workflow, slot) <= now:
            fired.append(slot)
        else:
            first_pending = slot  # jitter: due later, and so is everything after it
            fired.clear()
    fired.reverse()
    upcoming = first_pending if first_pending is not None else slot_after(spec, now)
    if not fired:
        return Due([], upcoming, 0)
    kept = _kept(spec, workflow, fired, upcoming, now)
    return Due(kept, upcoming, len(fired) - len(kept))


def _kept(
    spec: ScheduleSpec, workflow: str, fired: list[float], upcoming: float | None, now: float
) -> list[float]:
    if spec.catchup is Catchup.ALL:
        return fired[-MAX_CATCHUP:]
    latest = fired[-1]
    if spec.catchup is Catchup.LATEST:
        return [latest]
    gap = (upcoming - latest) / 2 if upcoming is not None else ON_TIME
    late = now - fire_time(spec, workflow, latest)
    return [latest] if late <= min(ON_TIME, gap) else []
