"""The indexed rows a commit keeps current: armed timers, attempts in flight, waits.

They are derived from the batch itself, never from a scan of a run: a timer row
follows the ``StartTimer`` / ``CancelTimer`` commands and the ``TimerFired`` events
that consumed it; a task row follows ``DispatchTask`` / ``CancelTask`` and the
``TaskStarted`` / ``TaskCompleted`` / ``TaskFailed`` / ``TaskLost`` events of its
attempt (a sync child run in flight is a task row too, attempt 0, from its
``StartChildRun`` to its ``ChildRunFinished``, so that recovery finds a parent whose
child's notice was lost); a run's waits are rewritten from ``RunState.waiting`` only when one of its
steps entered or left ``waiting`` in the batch. A run that ended loses all its rows.
Each key's net change over the batch is kept, so the order of the statements that
write them does not matter.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from tideflow.model.commands import (
    CancelTask,
    CancelTimer,
    Command,
    DispatchTask,
    StartChildRun,
    StartTimer,
)
from tideflow.model.events import (
    ChildRunFinished,
    TaskCompleted,
    TaskFailed,
    TaskLost,
    TaskStarted,
    TimerFired,
)
from tideflow.model.run import RunState
from tideflow.store.base import AppliedEvent, TaskLease

_WAITING = "waiting"
_OUTCOMES = (TaskCompleted, TaskFailed, TaskLost)
_CHILD = 0
"""The attempt number of a sync child run's task row."""


@dataclass(slots=True)
class TaskRow:
    attempt: int
    dispatched_at: float | None
    """Set when the batch dispatched the attempt (the row is written whole)."""
    started_at: float | None = None
    gone: bool = False
    """The attempt is no longer in flight: delete its row."""


@dataclass(slots=True)
class IndexRows:
    timers: dict[tuple[str, str], float | None] = field(default_factory=dict)
    """(run_id, timer_id) -> fire_at, or None to delete."""
    tasks: dict[tuple[str, str], TaskRow] = field(default_factory=dict)
    """(run_id, step_key) -> what happens to the attempt's row."""
    waits: dict[str, frozenset[str]] = field(default_factory=dict)
    """run_id -> the signal names it waits for now (its rows are replaced)."""
    ended: list[str] = field(default_factory=list)
    """Runs that ended: every row of theirs goes."""

    def timer_rows(self) -> tuple[list[tuple[str, str, float]], list[tuple[str, str]]]:
        """(upserts, deletes) of timer rows."""
        upserts, deletes = [], []
        for (run_id, timer_id), fire_at in self.timers.items():
            if fire_at is None:
                deletes.append((run_id, timer_id))
            else:
                upserts.append((run_id, timer_id, fire_at))
        return upserts, deletes

    def task_rows(
        self,
    ) -> tuple[
        list[tuple[str, str, int, float, float | None]],
        list[tuple[float, str, str, int]],
        list[tuple[str, str, int]],
    ]:
        """(upserts, starts, deletes) of task rows."""
        upserts, starts, deletes = [], [], []
        for (run_id, key), row in self.tasks.items():
            if row.gone:
                deletes.append((run_id, key, row.attempt))
            elif row.dispatched_at is not None:
                upserts.append((run_id, key, row.attempt, row.dispatched_at, row.started_at))
            elif row.started_at is not None:
                starts.append((row.started_at, run_id, key, row.attempt))
        return upserts, starts, deletes

    def wait_rows(self) -> list[tuple[str, str]]:
        """(signal, run_id) rows of the runs in ``waits`` (their old rows are deleted first)."""
        return [(name, run_id) for run_id, names in self.waits.items() for name in sorted(names)]


def wait_names(state: RunState) -> frozenset[str]:
    """The names a run's wait rows are under: a correlated wait's row
    (``RunState.correlated``), and the signal name for the others."""
    correlated = state.correlated
    if not correlated:
        return frozenset(state.waiting)
    names = {
        name for name, keys in state.waiting.items() if any(key not in correlated for key in keys)
    }
    names.update(correlated.values())
    return frozenset(names)


def state_rows(state: RunState, in_flight: Sequence[TaskLease]) -> IndexRows:
    """Every row of one run, from its state (its old rows are deleted first)."""
    rows = IndexRows()
    run_id = state.run_id
    if state.is_terminal:
        return rows
    rows.timers = {(run_id, tid): ref.fire_at for tid, ref in state.timers.items()}
    rows.tasks = {
        (run_id, t.step_key): TaskRow(t.attempt, t.dispatched_at, t.started_at) for t in in_flight
    }
    rows.waits[run_id] = wait_names(state)
    return rows


def index_rows(batch: Sequence[AppliedEvent]) -> IndexRows:
    # One loop with the event and command cases written in it (no call per event or per
    # command, no generator per event): every commit of every store runs it.
    rows = IndexRows()
    timers, tasks = rows.timers, rows.tasks
    last: dict[str, RunState] = {}
    waits_changed: set[str] = set()
    for applied in batch:
        event = applied.event
        run_id = event.run_id
        last[run_id] = applied.state
        if isinstance(event, _OUTCOMES):
            tasks[(run_id, event.step_key)] = TaskRow(event.attempt, None, gone=True)
        elif isinstance(event, TaskStarted):
            key = (run_id, event.step_key)
            row = tasks.get(key)
            if row is not None and row.attempt == event.attempt and not row.gone:
                row.started_at = event.time
            else:
                tasks[key] = TaskRow(event.attempt, None, event.time)
        elif isinstance(event, TimerFired):
            timers[(run_id, event.timer_id)] = None
        elif isinstance(event, ChildRunFinished):
            tasks[(run_id, event.step_key)] = TaskRow(_CHILD, None, gone=True)
        if applied.commands:
            _commands(rows, applied.commands, event.time)
        if run_id not in waits_changed:
            for t in applied.transitions:
                if t.old == _WAITING or t.new == _WAITING:
                    waits_changed.add(run_id)
                    break
    for run_id, state in last.items():
        if state.is_terminal:
            rows.ended.append(run_id)
            rows.waits.pop(run_id, None)
        elif run_id in waits_changed:
            rows.waits[run_id] = wait_names(state)
    if rows.ended:
        ended = set(rows.ended)
        rows.timers = {k: v for k, v in rows.timers.items() if k[0] not in ended}
        rows.tasks = {k: v for k, v in rows.tasks.items() if k[0] not in ended}
    return rows


def _commands(rows: IndexRows, commands: Sequence[Command], time: float) -> None:
    for command in commands:
        if isinstance(command, DispatchTask):
            rows.tasks[(command.run_id, command.step_key)] = TaskRow(command.attempt, time)
        elif isinstance(command, StartTimer):
            rows.timers[(command.run_id, command.timer_id)] = command.fire_at
        elif isinstance(command, CancelTimer):
            rows.timers[(command.run_id, command.timer_id)] = None
        elif isinstance(command, StartChildRun) and command.wait:
            rows.tasks[(command.run_id, command.step_key)] = TaskRow(_CHILD, time)
        elif isinstance(command, CancelTask):
            key = (command.run_id, command.step_key)
            row = rows.tasks.get(key)
            if row is None or row.attempt == command.attempt:
                rows.tasks[key] = TaskRow(command.attempt, None, gone=True)
