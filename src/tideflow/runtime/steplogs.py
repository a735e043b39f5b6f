"""What each attempt of a run's steps wrote (stdout, stderr, ``logging`` records), read
from its history: the ``logs`` of the events that report an attempt's outcome
(worker/capture.py captures them). One function for every view: ``tideflow runs logs``,
``GET /runs/{id}/logs`` and the UI's step panel (which reads that route)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from tideflow.store.base import HistoryEntry

__all__ = ["AttemptLogs", "StreamText", "logs_of", "matches"]

_OUTCOMES = {"task_completed": "succeeded", "task_failed": "failed"}
STREAMS = ("stdout", "stderr", "log")


@dataclass(frozen=True, slots=True)
class StreamText:
    text: str
    truncated: int
    """Bytes written before ``text`` that were not kept (0: ``text`` is all of it)."""


@dataclass(frozen=True, slots=True)
class AttemptLogs:
    step_key: str
    round: int
    attempt: int
    compensation: bool
    outcome: str
    """``succeeded`` or ``failed``."""
    time: float
    """When the attempt ended (its outcome was recorded)."""
    streams: dict[str, StreamText] = field(default_factory=dict)
    """Each stream the attempt wrote to (``stdout``, ``stderr``, ``log``), in that order."""


def matches(step_key: str, step: str | None) -> bool:
    """Whether ``step`` names this step instance: its key (``items[2]/charge``), or its
    plan step (``charge``: every instance of it); None names every step."""
    return step is None or step == step_key or step == step_key.rsplit("/", 1)[-1]


def logs_of(history: Iterable[HistoryEntry], step: str | None = None) -> list[AttemptLogs]:
    """Every ended attempt of the steps ``step`` names (`matches`), in the order they
    ended, with what each wrote (no streams: it wrote nothing)."""
    rows = []
    for entry in history:
        outcome = _OUTCOMES.get(entry.kind)
        if outcome is None:
            continue
        event = entry.event
        key = str(event.get("step_key", ""))
        if not matches(key, step):
            continue
        rows.append(
            AttemptLogs(
                step_key=key,
                round=int(event.get("round") or 0),
                attempt=int(event.get("attempt", 0)),
                compensation=bool(event.get("compensation", False)),
                outcome=outcome,
                time=entry.time,
                streams=_streams(event.get("logs")),
            )
        )
    return rows


def _streams(logs: Any) -> dict[str, StreamText]:
    if not isinstance(logs, dict):
        return {}
    streams = {}
    for name in STREAMS:
        stream = logs.get(name)
        if isinstance(stream, dict):
            streams[name] = StreamText(
                text=str(stream.get("text", "")), truncated=int(stream.get("truncated") or 0)
            )
    return streams
