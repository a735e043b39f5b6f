"""Events: everything that can happen to a run, as the core receives it.

Time and ids come in with the event (the core has no clock and no randomness).
``time`` is seconds since the epoch (UTC). Every event carries an ``event_id``
that the store records to make redelivery a no-op; the core is in addition
idempotent by construction (a completion for an attempt that is no longer
running, a timer that is no longer armed, a signal already consumed — all
change nothing).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple

from tideflow.model.quick import quick_init


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorInfo:
    """A step or run error as recorded in history: ``{type, message}``."""

    type: str
    message: str
    retryable: bool = True
    classes: tuple[str, ...] = ()
    """Further type names the error is an instance of (e.g. Python base classes)."""
    details: str | None = None
    """Extra diagnostic text, such as a trimmed traceback."""
    retry_after: float | None = None
    """A lower bound for the next retry's delay that the failure asked for (HTTP 429)."""
    causes: tuple[dict[str, Any], ...] = ()
    """The errors this one aggregates (``JoinFailed``: one ``{step, type, message}`` per
    failed dependency)."""
    only_if_named: bool = False
    """Retried only by a policy whose ``retry_on`` names it (``StepOutcomeUnknown``): a
    retry that could repeat a side effect must be asked for, never a default."""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type, "message": self.message}
        if self.details:
            out["details"] = self.details
        if self.causes:
            out["causes"] = [dict(cause) for cause in self.causes]
        return out

    def matches(self, names: tuple[str, ...]) -> bool:
        return self.type in names or any(c in names for c in self.classes)


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    event_id: str
    run_id: str
    time: float


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class RunStarted(Event):
    input: Any = None
    parent_run_id: str | None = None
    parent_step_key: str | None = None


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptEvent(Event):
    """What a worker (or recovery) reports about one attempt: its start or its outcome.

    An attempt is named by step instance, ``round`` and number, and by whether it is one
    of the step's compensation: an operator retry numbers attempts from 1 again in the
    next round, so a late report of an earlier round's attempt (a worker that still ran
    it when the run was retried) is stale, never taken for the retried attempt."""

    step_key: str
    attempt: int
    compensation: bool = False
    """The attempt is one of the step's compensation (``step_key`` names the step undone)."""
    round: int | None = 0
    """The round of the attempt (``DispatchTask.round``: the run's operator retries before
    it). None for an event stored or sent by a version before rounds (decoded without the
    field): it is taken for the run's current round, as that version did, so that a
    history it wrote replays as it was applied."""


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class TaskStarted(AttemptEvent):
    """A worker began executing an attempt (``time`` is when): its ``timeout`` counts from
    here. A duplicate, or one for an attempt that is no longer current, changes nothing."""

    worker: str = ""
    """Which worker took it (``host/pid``), for the history."""
    delivery: int = 1
    """How many times the bus has delivered this attempt's task: more than 1 when the
    worker that held it before stopped renewing its lease (``lease_expired``: it died) or
    handed it back (it was stopped). Such a start of an attempt already started is not a
    duplicate to drop but a fact for the history: the attempt runs again, elsewhere."""


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class TaskLost(AttemptEvent):
    """The execution of an attempt is gone without an outcome (the process that ran it
    stopped). An attempt that never started, or of an idempotent step, is dispatched
    again; a started attempt of an ``idempotent: false`` step fails with
    ``StepOutcomeUnknown``."""

    reason: str = "its worker stopped"
    started_at: float | None = None
    """When the lost execution started (recovery knows it; None: not said). A loss of an
    earlier start of the attempt, delivered again once the attempt was dispatched and
    started anew, changes nothing."""


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class TaskCompleted(AttemptEvent):
    output: Any = None
    started_at: float | None = None
    """Set when the attempt ended before its ``TaskStarted`` was sent: its start, recorded
    with the outcome (one event instead of two)."""
    worker: str = ""
    logs: dict[str, Any] | None = None
    """What the attempt wrote (worker/capture.py): ``{stream: {"text", "truncated"}}``
    for each of ``stdout``, ``stderr``, ``log`` it wrote to; None (not stored) when
    nothing."""


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class TaskFailed(AttemptEvent):
    error: ErrorInfo
    seed: int = 0
    """Random seed for retry jitter, chosen by the runtime so that decide stays pure."""
    started_at: float | None = None
    """As on `TaskCompleted`: the start, when it was not reported on its own."""
    worker: str = ""
    logs: dict[str, Any] | None = None
    """As on `TaskCompleted`: what the attempt wrote."""


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class TimerFired(Event):
    timer_id: str


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class SignalReceived(Event):
    name: str
    payload: Any = None
    buffer: bool = True
    """Keep the signal for a later wait when no current wait takes it. Events fanned
    out from `emit` to other runs are not buffered: they are only for current waiters."""


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class ChildRunFinished(Event):
    step_key: str
    child_run_id: str
    status: str
    output: Any = None
    error: ErrorInfo | None = None


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class CancelRequested(Event):
    reason: str = "cancelled on request"


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class RunRetried(Event):
    """An operator re-opens a failed or timed-out run from its steps that did not succeed."""

    reason: str = "retried on request"


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class EngineFailed(Event):
    """The engine could not apply or store one of this run's events: the run fails with
    ``error`` (type ``EngineError``) so that it cannot hold up other runs."""

    error: ErrorInfo


EVENT_KINDS: dict[type[Event], str] = {
    RunStarted: "run_started",
    TaskStarted: "task_started",
    TaskLost: "task_lost",
    TaskCompleted: "task_completed",
    TaskFailed: "task_failed",
    TimerFired: "timer_fired",
    SignalReceived: "signal_received",
    ChildRunFinished: "child_run_finished",
    CancelRequested: "cancel_requested",
    RunRetried: "run_retried",
    EngineFailed: "engine_failed",
}
EVENT_TYPES: dict[str, type[Event]] = {v: k for k, v in EVENT_KINDS.items()}


class Transition(NamedTuple):
    """One recorded state change, for the run's history.

    A named tuple, not a frozen dataclass like the other values: every step records
    about four, and a tuple is built in a third of the time (0.26 µs, positionally; the
    core builds them with ``tuple.__new__``, 0.12 µs)."""

    subject: str
    """``run`` or a step key."""
    old: str | None
    new: str
    time: float
    cause: str
    attempt: int | None = None


transition_of = partial(tuple.__new__, Transition)
"""``Transition(...)`` from a tuple of all its fields, without the named tuple's own
``__new__`` (a Python function): every step records about four, and this takes a third
of the time. The core records its transitions with it."""
