"""Schedules as values: what a definition's ``schedule:`` says, and a schedule's stored row.

A ``ScheduleSpec`` is one entry of ``schedule:`` in its normal form (the DSL's
``dsl/schedules.py`` checks and normalises it; ``core/schedule_slots.py`` computes its
slots). A ``ScheduleRow`` is what the store keeps per live schedule: the spec, whether it
is paused, and the next slot, which is a durable timer (``fire_at``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

__all__ = ["Catchup", "Overlap", "ScheduleOrigin", "ScheduleRow", "ScheduleSpec"]


class Overlap(StrEnum):
    """What a slot does while the schedule's previous run is unfinished."""

    SKIP = "skip"
    """Start nothing for this slot."""
    BUFFER_ONE = "buffer_one"
    """Start one run when the previous ends (one at most is kept; later slots are skipped)."""
    ALLOW = "allow"
    """Start the run anyway."""


class Catchup(StrEnum):
    """What a server does with the slots that passed while no server fired them."""

    NONE = "none"
    """Start nothing for them; carry on with the next slot."""
    LATEST = "latest"
    """Start one run, for the most recent missed slot."""
    ALL = "all"
    """Start one run per missed slot (at most ``MAX_CATCHUP``, the most recent)."""


class ScheduleOrigin(StrEnum):
    DEFINITION = "definition"
    """From the ``schedule:`` of the workflow's highest active version (follows it)."""
    CLIENT = "client"
    """Made through the client (``Client.create_schedule``); left alone by registrations."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleSpec:
    id: str
    cron: str | None = None
    """A cron expression (croniter's: 5 fields, or 6 with seconds last)."""
    every: float | None = None
    """Seconds between two slots, counted from ``start_at`` (or the epoch)."""
    timezone: str = "UTC"
    """The IANA time zone a cron expression is read in."""
    overlap: Overlap = Overlap.SKIP
    catchup: Catchup = Catchup.LATEST
    jitter: float = 0.0
    """A slot's run starts up to this many seconds after the slot (the same delay on
    every server: it is derived from the slot)."""
    start_at: float | None = None
    """No slot before this time (seconds since the epoch)."""
    end_at: float | None = None
    """No slot after this time."""
    input: Mapping[str, Any] = field(default_factory=dict)
    """The run input; ``scheduled_at`` (the slot, ISO 8601 UTC) is added to it."""

    def to_data(self) -> dict[str, Any]:
        """The normal form (JSON-compatible), as the definition's source holds it."""
        out: dict[str, Any] = {"id": self.id}
        if self.cron is not None:
            out["cron"] = self.cron
        if self.every is not None:
            out["every"] = self.every
        out |= {
            "timezone": self.timezone,
            "overlap": str(self.overlap),
            "catchup": str(self.catchup),
            "jitter": self.jitter,
        }
        for key in ("start_at", "end_at"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.input:
            out["input"] = dict(self.input)
        return out

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> ScheduleSpec:
        """From the normal form (``to_data``)."""
        every = data.get("every")
        return cls(
            id=str(data["id"]),
            cron=data.get("cron"),
            every=None if every is None else float(every),
            timezone=str(data.get("timezone", "UTC")),
            overlap=Overlap(data.get("overlap", Overlap.SKIP)),
            catchup=Catchup(data.get("catchup", Catchup.LATEST)),
            jitter=float(data.get("jitter", 0.0)),
            start_at=_float_or_none(data.get("start_at")),
            end_at=_float_or_none(data.get("end_at")),
            input=dict(data.get("input") or {}),
        )

    @property
    def every_text(self) -> str:
        """How the schedule repeats, for people: the cron expression or ``every 900s``."""
        if self.cron is not None:
            return f"cron {self.cron} ({self.timezone})"
        return f"every {self.every:g}s"


def _float_or_none(value: Any) -> float | None:
    return None if value is None else float(value)


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleRow:
    """A live schedule as stored, one per (workflow, schedule id)."""

    workflow: str
    schedule_id: str
    version: str | None
    """The definition version whose ``schedule:`` it is (None: a client-made schedule,
    which starts the workflow's highest active version)."""
    origin: ScheduleOrigin
    spec: ScheduleSpec
    paused: bool = False
    deleted: bool = False
    """Deleted through the client: kept (firing nothing) so that registering the same
    version again does not bring it back; a new version does."""
    next_slot: float | None = None
    """The next slot's time; None when the schedule has no slot left (past ``end_at``)."""
    fire_at: float | None = None
    """When the next slot fires: ``next_slot`` plus its jitter. The durable timer."""
    last_slot: float | None = None
    last_run_id: str | None = None
    """The run the schedule started last (what ``overlap`` looks at)."""
    buffered_slot: float | None = None
    """``buffer_one``: the slot whose run starts when ``last_run_id`` ends."""
    revision: int = 0
    """Bumped by every update: an update names the revision it read (optimistic
    concurrency, so two servers advancing one schedule do not both win)."""
    updated_at: float = 0.0

    @property
    def key(self) -> tuple[str, str]:
        return (self.workflow, self.schedule_id)

    @property
    def live(self) -> bool:
        """Whether it fires: neither paused nor deleted, with a slot left."""
        return not self.paused and not self.deleted and self.fire_at is not None
