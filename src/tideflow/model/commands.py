"""Commands: what the core asks the runtime to do after an event.

The runtime writes commands to the outbox in the same transaction as the new run
state, then relays them to the bus, the timer wheel or the child-run machinery.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tideflow.model.events import ErrorInfo
from tideflow.model.plan import Priority
from tideflow.model.quick import quick_init


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class Command:
    run_id: str


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class DispatchTask(Command):
    """Run one attempt of an action on a worker."""

    step_key: str
    step_id: str
    type: str
    config: Any
    input: Any
    attempt: int
    idempotency_key: str
    timeout: float | None
    queue: str = "default"
    priority: Priority = Priority.NORMAL
    compensation: bool = False
    sensitive: tuple[str, ...] = ()
    secrets: tuple[str, ...] = ()
    """Secret names the step's templates reference; the worker resolves only these markers."""
    idempotent: bool = True
    """False for ``idempotent: false`` steps: the worker records the start durably before it
    runs the attempt, so that a lost execution is never repeated blindly."""
    round: int = 0
    """The run's round: how many operator retries came before it (``RunState.retries``). A
    retry numbers attempts from 1 again, so an attempt is named by round and number: a
    cancel of round 0's attempt 1 must not stop round 1's. 0 in commands stored before
    the field existed."""


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class CancelTask(Command):
    step_key: str
    attempt: int
    round: int = 0
    """The round of the attempt to stop (``DispatchTask.round``)."""
    compensation: bool = False
    """The attempt to stop is one of the step's compensation, not of its action (their
    attempt numbers are counted apart). False in commands stored before the field
    existed."""


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class StartTimer(Command):
    timer_id: str
    fire_at: float


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class CancelTimer(Command):
    timer_id: str


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class StartChildRun(Command):
    step_key: str
    child_run_id: str
    workflow: str
    version: str | None
    input: Any
    wait: bool
    """True for `mode: sync`: the parent expects a ChildRunFinished event."""


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class CancelChildRun(Command):
    child_run_id: str


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class EmitEvent(Command):
    """Publish a CloudEvent (already complete: id, source, type, time, data)."""

    event: dict[str, Any]


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class RunFinished(Command):
    """The run reached a terminal state; notify waiters and a waiting parent."""

    status: str
    output: Any
    error: ErrorInfo | None
    parent_run_id: str | None = None
    parent_step_key: str | None = None
