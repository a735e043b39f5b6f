"""What a person is shown of a run's steps and attempts: derived from the run's history
(and the same facts in its state) by the rules of this one module, which the API
(``/runs/{id}/state``, ``/steps/…``, ``/attempts``), the web UI (which reads those) and the
CLI (``tideflow runs show``) all use, so that no view shows what another does not.

- A step's **shown state** (``step_shown``) is its recorded state, except that a step that
  succeeded and whose compensation ran shows that: ``compensating`` while it runs,
  ``compensated`` once it succeeded, ``compensation_failed`` when it gave up. These are
  view states, never core states: the core's step stays ``succeeded`` (its output is
  still what later expressions saw), the compensation is a fact about it.
- An **attempt** ends with its outcome (``attempts_of``): ``succeeded``, ``failed``,
  ``cancelled``, ``lost``, ``timed_out``, or ``running`` while it runs. An attempt is ended
  by its task's outcome (``task_completed``, ``task_failed``, ``task_lost``) or, when no
  outcome ever comes, by the transition of its step (or compensation) out of ``running``:
  ``cancelled`` (cancelled step or run), ``timed_out`` (a timer ended it: its timeout, the
  step's deadline or timeout, the run's timeout) or ``failed``; an attempt still open when
  the run ended takes the run's end (``cancelled``, ``timed_out``, else ``lost``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tideflow.model.states import RUN_TERMINAL, RunStatus
from tideflow.store.base import HistoryEntry

__all__ = [
    "ATTEMPT_OUTCOMES",
    "COMPENSATION_SHOWN",
    "SHOWN_STEP_STATES",
    "Attempt",
    "attempts_of",
    "compensation_of",
    "step_shown",
]

COMPENSATION_SUFFIX = ":compensate"
"""A compensation's history subject is its step key and this (core/tasks.py)."""

COMPENSATION_SHOWN = {
    "running": "compensating",
    "retrying": "compensating",
    "succeeded": "compensated",
    "failed": "compensation_failed",
}
"""A succeeded step's shown state by the state of its compensation."""

SHOWN_STEP_STATES = ("compensating", "compensated", "compensation_failed")
"""The shown states a step has beyond the core's ``StepStatus``."""

ATTEMPT_OUTCOMES = ("running", "succeeded", "failed", "cancelled", "lost", "timed_out")

_TASK_OUTCOMES = {"task_completed": "succeeded", "task_failed": "failed", "task_lost": "lost"}
_ENDED_BY = {"cancelled": "cancelled", "succeeded": "succeeded"}
_RUN_ENDS = {RunStatus.CANCELLED.value: "cancelled", RunStatus.TIMED_OUT.value: "timed_out"}
_TERMINAL = frozenset(status.value for status in RUN_TERMINAL)


def step_shown(status: str, compensation: str | None) -> str:
    """The state a step instance is shown in: its recorded ``status``, or what became of its
    ``compensation`` (the compensation's own state, None if none ran) once it succeeded."""
    if status == "succeeded" and compensation is not None:
        return COMPENSATION_SHOWN.get(compensation, status)
    return status


def compensation_of(steps: Mapping[str, Mapping[str, Any]] | None) -> dict[str, str]:
    """Step key -> the state of its compensation, from ``{key: {status, attempts, error}}``
    (``CompensationState.results``, or a ``RunResult``'s ``compensation["steps"]``): what
    ``step_shown`` takes."""
    return {key: str(entry.get("status")) for key, entry in (steps or {}).items()}


@dataclass(slots=True, kw_only=True)
class Attempt:
    """One execution of an attempt of a step (or of its compensation)."""

    step_key: str
    round: int
    attempt: int
    compensation: bool
    started_at: float | None = None
    ended_at: float | None = None
    outcome: str = "running"
    worker: str = ""
    error: str | None = None

    def end(self, outcome: str, at: float, error: str | None = None) -> None:
        self.outcome, self.ended_at = outcome, at
        if error is not None:
            self.error = error


class _Attempts:
    """The fold of a history into attempts (``attempts_of``)."""

    def __init__(self) -> None:
        self.rows: list[Attempt] = []
        self.open: dict[tuple[str, bool], Attempt] = {}
        self.round = 0

    def entry(self, entry: HistoryEntry) -> None:
        if entry.kind == "run_retried":
            self.round += 1
        elif entry.kind == "task_started" or entry.kind in _TASK_OUTCOMES:
            self.task(entry)
        for transition in entry.transitions:
            self.transition(entry, transition)

    def task(self, entry: HistoryEntry) -> None:
        event = entry.event
        key = str(event.get("step_key", ""))
        compensation = bool(event.get("compensation", False))
        number = int(event.get("attempt", 0))
        row = self.open.get((key, compensation))
        if row is None or row.attempt != number:
            if entry.kind == "task_lost":
                return  # an attempt never started lost nothing
            row = Attempt(
                step_key=key,
                round=int(event.get("round") or self.round),
                attempt=number,
                compensation=compensation,
            )
            self.rows.append(row)
            self.open[(key, compensation)] = row
        row.worker = event.get("worker") or row.worker
        if entry.kind == "task_started":
            row.started_at = row.started_at or entry.time
            return
        row.started_at = row.started_at or event.get("started_at") or entry.time
        error = event.get("error")
        row.end(
            _TASK_OUTCOMES[entry.kind],
            entry.time,
            error.get("message") if isinstance(error, dict) else event.get("reason"),
        )
        del self.open[(key, compensation)]

    def transition(self, entry: HistoryEntry, transition: Mapping[str, Any]) -> None:
        subject = str(transition.get("subject", ""))
        new = str(transition.get("new"))
        if subject == "run":
            if new in _TERMINAL:
                for still_open in self.open.values():
                    still_open.end(_RUN_ENDS.get(new, "lost"), entry.time, transition.get("cause"))
                self.open.clear()
            return
        if transition.get("old") != "running" or new == "running":
            return
        compensation = subject.endswith(COMPENSATION_SUFFIX)
        key = subject.removesuffix(COMPENSATION_SUFFIX) if compensation else subject
        row = self.open.pop((key, compensation), None)
        if row is None:
            return
        # a timer that ends an attempt is one of its clocks: its timeout, the step's
        # deadline or timeout, the run's timeout (a retry timer fires on no running one)
        outcome = "timed_out" if entry.kind == "timer_fired" else _ENDED_BY.get(new, "failed")
        row.end(outcome, entry.time, transition.get("cause"))


def attempts_of(history: Iterable[HistoryEntry]) -> list[Attempt]:
    """Every attempt in ``history`` (a run's, in order), in the order they started, each
    with its outcome (the module's docstring says how it is decided)."""
    fold = _Attempts()
    for entry in history:
        fold.entry(entry)
    return fold.rows
