"""Drive the pure core by hand: no runtime, no workers, time that moves when told.

``CoreHarness`` applies events through ``decide`` and keeps track of the tasks,
timers and child runs the core asked for, so a test (or a property test) can
complete, fail, time out and signal steps in any order it likes::

    h = CoreHarness(plan)
    h.start({"order_id": "A1"})
    h.complete("reserve", {"ok": True})
    h.advance(5)                     # fires due timers
    assert h.state.status == "succeeded"

By default a worker starts every task (compensations too) the moment it is dispatched
(``TaskStarted`` is applied right after the decision that dispatched it), so an
attempt's ``timeout`` counts from its dispatch. ``CoreHarness(plan, auto_start=False)`` leaves tasks queued
until the test calls ``h.started(key)``: that is how a test sees ``schedule_to_start``
or a timeout that waits for the start.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tideflow.core.decide import Decision, decide
from tideflow.model.commands import (
    CancelChildRun,
    CancelTask,
    CancelTimer,
    Command,
    DispatchTask,
    EmitEvent,
    RunFinished,
    StartChildRun,
    StartTimer,
)
from tideflow.model.events import (
    CancelRequested,
    ChildRunFinished,
    ErrorInfo,
    Event,
    RunRetried,
    RunStarted,
    SignalReceived,
    TaskCompleted,
    TaskFailed,
    TaskLost,
    TaskStarted,
    TimerFired,
    Transition,
)
from tideflow.model.plan import Plan
from tideflow.model.run import RunState, new_run_state


@dataclass
class CoreHarness:
    plan: Plan
    run_id: str = "run-1"
    now: float = 1_767_225_600.0  # 2026-01-01T00:00:00Z
    state: RunState = field(init=False)
    tasks: dict[str, DispatchTask] = field(default_factory=dict)
    """Outstanding tasks by step key (compensations under ``<key>:compensate``)."""
    dispatched: list[DispatchTask] = field(default_factory=list)
    timers: dict[str, float] = field(default_factory=dict)
    children: dict[str, StartChildRun] = field(default_factory=dict)
    emitted: list[dict[str, Any]] = field(default_factory=list)
    cancelled_tasks: list[tuple[str, int]] = field(default_factory=list)
    cancelled_children: list[str] = field(default_factory=list)
    finished: list[RunFinished] = field(default_factory=list)
    transitions: list[Transition] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    on_decision: Callable[[Event, Decision], None] | None = None
    auto_start: bool = True
    """Apply a ``TaskStarted`` for every task as soon as it is dispatched."""
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def __post_init__(self) -> None:
        self.state = new_run_state(
            run_id=self.run_id,
            workflow=self.plan.name,
            version=self.plan.version,
            plan_hash=self.plan.hash,
            created_at=self.now,
        )

    # -- sending events ---------------------------------------------------------

    def apply(self, event: Event) -> Decision:
        self.events.append(event)
        decision = decide(self.plan, self.state, event)
        self.transitions.extend(decision.transitions)
        for command in decision.commands:
            self._track(command)
        if self.on_decision is not None:
            self.on_decision(event, decision)
        if self.auto_start:
            for command in decision.commands:
                if isinstance(command, DispatchTask):
                    self.started(command.step_key, compensation=command.compensation)
        return decision

    def _common(self) -> dict[str, Any]:
        return {"event_id": f"e{next(self._ids)}", "run_id": self.run_id, "time": self.now}

    def start(self, input: Any = None) -> Decision:
        return self.apply(RunStarted(**self._common(), input=input))

    def started(
        self, key: str, worker: str = "test-worker", *, compensation: bool = False
    ) -> Decision:
        """A worker starts the outstanding task of step instance ``key`` (or of its
        compensation)."""
        task = self._task(key, compensation)
        return self.apply(
            TaskStarted(
                **self._common(),
                step_key=key,
                attempt=task.attempt,
                worker=worker,
                compensation=compensation,
                round=task.round,
            )
        )

    def lost(self, key: str, *, compensation: bool = False) -> Decision:
        """The execution of ``key``'s outstanding task is lost (its process stopped)."""
        task = self._task(key, compensation)
        return self.apply(
            TaskLost(
                **self._common(),
                step_key=key,
                attempt=task.attempt,
                compensation=compensation,
                round=task.round,
            )
        )

    def complete(self, key: str, output: Any = None, *, compensation: bool = False) -> Decision:
        task = self._task(key, compensation)
        return self.apply(
            TaskCompleted(
                **self._common(),
                step_key=task.step_key,
                attempt=task.attempt,
                output=output,
                compensation=compensation,
                round=task.round,
            )
        )

    def fail(
        self,
        key: str,
        error_type: str = "RuntimeError",
        message: str = "boom",
        *,
        retryable: bool = True,
        compensation: bool = False,
        seed: int = 7,
    ) -> Decision:
        task = self._task(key, compensation)
        error = ErrorInfo(type=error_type, message=message, retryable=retryable)
        return self.apply(
            TaskFailed(
                **self._common(),
                step_key=task.step_key,
                attempt=task.attempt,
                error=error,
                seed=seed,
                compensation=compensation,
                round=task.round,
            )
        )

    def signal(self, name: str, payload: Any = None, event_id: str | None = None) -> Decision:
        common = self._common()
        if event_id is not None:
            common["event_id"] = event_id
        return self.apply(SignalReceived(**common, name=name, payload=payload))

    def cancel(self) -> Decision:
        return self.apply(CancelRequested(**self._common()))

    def retry(self, reason: str = "retried on request") -> Decision:
        """An operator retry of a failed or timed-out run."""
        return self.apply(RunRetried(**self._common(), reason=reason))

    def child_finished(
        self,
        key: str,
        status: str = "succeeded",
        output: Any = None,
        error: ErrorInfo | None = None,
    ) -> Decision:
        child = self.children[key]
        return self.apply(
            ChildRunFinished(
                **self._common(),
                step_key=key,
                child_run_id=child.child_run_id,
                status=status,
                output=output,
                error=error,
            )
        )

    def fire(self, timer_id: str) -> Decision:
        self.timers.pop(timer_id, None)
        return self.apply(TimerFired(**self._common(), timer_id=timer_id))

    def advance(self, seconds: float) -> None:
        """Move time forward, firing every timer that falls due, in order."""
        target = self.now + seconds
        while True:
            due = sorted((at, tid) for tid, at in self.timers.items() if at <= target)
            if not due:
                break
            at, timer_id = due[0]
            self.now = max(self.now, at)
            self.fire(timer_id)
        self.now = target

    # -- what the core asked for ------------------------------------------------

    def _task(self, key: str, compensation: bool) -> DispatchTask:
        lookup = f"{key}:compensate" if compensation else key
        try:
            return self.tasks[lookup]
        except KeyError:
            raise AssertionError(
                f"no outstanding task {lookup!r}; outstanding: {sorted(self.tasks)}"
            ) from None

    def _track(self, command: Command) -> None:
        if isinstance(command, DispatchTask):
            key = f"{command.step_key}:compensate" if command.compensation else command.step_key
            self.tasks[key] = command
            self.dispatched.append(command)
        elif isinstance(command, StartTimer):
            self.timers[command.timer_id] = command.fire_at
        elif isinstance(command, CancelTimer):
            self.timers.pop(command.timer_id, None)
        elif isinstance(command, CancelTask):
            self.cancelled_tasks.append((command.step_key, command.attempt))
        elif isinstance(command, StartChildRun):
            self.children[command.step_key] = command
        elif isinstance(command, CancelChildRun):
            self.cancelled_children.append(command.child_run_id)
        elif isinstance(command, EmitEvent):
            self.emitted.append(command.event)
        elif isinstance(command, RunFinished):
            self.finished.append(command)

    def step_status(self, key: str) -> str:
        return self.state.steps[key].status.value

    @property
    def status(self) -> str:
        return self.state.status.value

    def outstanding(self) -> list[str]:
        """Keys of tasks whose step is still running (attempt matches)."""
        out = []
        for key, task in self.tasks.items():
            if task.compensation:
                comp = self.state.compensation
                if (
                    comp is not None
                    and comp.current == task.step_key
                    and comp.attempt == task.attempt
                ):
                    entry = comp.results.get(task.step_key, {})
                    if entry.get("status") == "running":
                        out.append(key)
                continue
            st = self.state.steps.get(task.step_key)
            if st is not None and st.status.value == "running" and st.attempts == task.attempt:
                out.append(key)
        return out
