"""The in-memory store: the embedded default when no durable store is asked for, and the
reference backend of the contract tests. Nothing survives the process.

Like the SQL stores it keeps each run's latest snapshot as JSON (written when
the runtime asks for one, always when the run ends) and the events after it, so
a run reloaded after a failed commit is exactly what was committed, never the
runtime's half-applied live state; and a value the SQL stores cannot hold fails
here too. History rows stay objects until they are read, their transitions as tuples.

What it keeps of a run that ended is mostly strings and tuples of plain values, which
the garbage collector does not track: a store holding thousands of runs does not make
every full collection walk their states and transitions (kept as objects, an ended
10-step run's state and its 42 transitions were about 80 of the 105 tracked objects it
left behind).
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

from tideflow.errors import DefinitionConflict, NotFound, RunExists
from tideflow.model import codec
from tideflow.model.events import ErrorInfo, Event, Transition
from tideflow.model.plan import Plan
from tideflow.model.run import RunState
from tideflow.model.schedules import ScheduleRow
from tideflow.model.states import RUN_TERMINAL
from tideflow.model.tokens import ApiToken
from tideflow.store import sqlbase as sb
from tideflow.store.backends.memory_gateway import GatewayRecords
from tideflow.store.base import (
    ENGINE_LEASE,
    PRIORITY_RANK,
    AppliedEvent,
    Archive,
    ConcurrencyConflict,
    Created,
    DefinitionSummary,
    DueTimer,
    HistoryEntry,
    InboxListener,
    Lease,
    NewRun,
    OutboxItem,
    PendingRun,
    RunFilter,
    RunPage,
    RunSummary,
    Store,
    StoredRun,
    TaskLease,
    UnstorableData,
)
from tideflow.store.indexrows import IndexRows, index_rows, state_rows
from tideflow.store.paging import decode_cursor, encode_cursor

TransitionRow = tuple[str, str | None, str, float, str, int | None]
"""A `Transition`'s fields, in their order (a tuple of plain values is not tracked by
the garbage collector)."""


@dataclass(slots=True)
class _Run:
    run_id: str
    workflow: str
    version: str
    parent_run_id: str | None
    """As created (as in the SQL stores' run rows)."""
    snapshot: str
    """The state as JSON, as of history entry ``snapshot_at`` (exclusive)."""
    created_at: float
    updated_at: float
    status: str
    finished_at: float | None = None
    output: Any = None
    error: ErrorInfo | None = None
    snapshot_at: int = 0
    last_seq: int = 0
    log: list[tuple[int, Event, tuple[TransitionRow, ...]]] = field(default_factory=list)
    """Kept as objects and tuples; turned into HistoryEntry rows only when read."""

    def advance(self, state: RunState, time: float) -> None:
        self.status = state.status._value_  # not the enum property: once per event
        self.updated_at = time
        self.finished_at = state.finished_at
        self.output = state.output
        self.error = state.error

    @property
    def summary(self) -> RunSummary:
        return RunSummary(
            run_id=self.run_id,
            workflow=self.workflow,
            version=self.version,
            status=self.status,
            created_at=self.created_at,
            updated_at=self.updated_at,
            finished_at=self.finished_at,
            parent_run_id=self.parent_run_id,
            output=self.output,
            error=codec.error_to_data(self.error),
        )


class MemoryStore(GatewayRecords, Store):
    url = "memory://"

    def __init__(self) -> None:
        self._definitions: dict[tuple[str, str], tuple[Plan, float]] = {}
        self._plans: dict[str, Plan] = {}
        self._runs: dict[str, _Run] = {}
        self._idempotency: dict[str, str] = {}
        self._outbox: dict[str, OutboxItem] = {}
        self._timers: dict[str, dict[str, float]] = {}
        """Run id -> timer id -> when it fires (by run, so that an ended run's rows go at
        the cost of that run, not of every row)."""
        self._tasks: dict[str, dict[str, TaskLease]] = {}
        """Run id -> step key -> the attempt in flight."""
        self._waits: dict[str, set[str]] = {}
        """signal -> run ids; ``_waits_of`` is the same by run."""
        self._waits_of: dict[str, frozenset[str]] = {}
        self._leases: dict[str, Lease] = {}
        self._inbox: dict[str, Event] = {}
        self._inbox_listeners: list[InboxListener] = []
        self._tokens: dict[str, ApiToken] = {}
        self._gateway = {}
        self._gateway_rows = {}
        self._schedules: dict[tuple[str, str], ScheduleRow] = {}
        self._inactive: set[tuple[str, str]] = set()
        """(name, version) of the deactivated definition versions."""
        self._queue: list[PendingRun] = []
        """The pending runs in admission order (``pending_runs``): the SQL stores' index
        ``runs_pending``. Runs are mostly created in order, so an insert appends."""
        self._queued: dict[str, PendingRun] = {}

    async def save_definition(self, plan: Plan) -> bool:
        key = (plan.name, plan.version)
        existing = self._definitions.get(key)
        if existing is not None:
            if existing[0].hash != plan.hash:
                raise DefinitionConflict(
                    f"{plan.name} {plan.version} is already registered with different content; "
                    "give the changed definition a new version"
                )
            return False
        self._definitions[key] = (plan, time.time())
        self._plans[plan.hash] = plan
        return True

    async def get_definition(self, name: str, version: str | None = None) -> Plan:
        rows = [
            (v, plan.hash, (n, v) not in self._inactive)
            for (n, v), (plan, _) in self._definitions.items()
            if n == name
        ]
        plan_hash = sb.chosen_definition(name, version, rows)
        if plan_hash is None:
            raise sb.no_definition(name, version, sorted({n for n, _ in self._definitions}))
        return self._plans[plan_hash]

    async def set_definition_active(self, name: str, version: str, active: bool) -> bool:
        key = (name, version)
        if key not in self._definitions:
            raise sb.no_definition(name, version, sorted({n for n, _ in self._definitions}))
        if active == (key not in self._inactive):
            return False
        if active:
            self._inactive.discard(key)
        else:
            self._inactive.add(key)
        return True

    async def triggered_by(self, event: str) -> list[DefinitionSummary]:
        return [
            summary
            for summary in await self.list_definitions()
            if summary.active
            and any(
                t.event == event
                for t in self._definitions[summary.name, summary.version][0].triggers
            )
        ]

    async def get_plan(self, plan_hash: str) -> Plan:
        try:
            return self._plans[plan_hash]
        except KeyError:
            raise NotFound(f"no plan with hash {plan_hash}") from None

    async def list_definitions(self, name: str | None = None) -> list[DefinitionSummary]:
        return [
            DefinitionSummary(
                name=n,
                version=v,
                hash=plan.hash,
                created_at=at,
                active=(n, v) not in self._inactive,
                title=plan.title,
            )
            for (n, v), (plan, at) in sorted(self._definitions.items())
            if name is None or n == name
        ]

    async def create_runs(self, runs: Sequence[NewRun]) -> list[Created | Exception]:
        results: list[Created | Exception] = []
        for state, idempotency_key in runs:
            try:
                results.append(self._create_run(state, idempotency_key))
            except Exception as exc:  # that run's alone: nothing of it was written
                results.append(exc)
        return results

    def _create_run(self, state: RunState, idempotency_key: str | None) -> Created:
        if idempotency_key is not None:
            existing = self._idempotency.get(idempotency_key)
            if existing is not None:
                return existing, False
        if state.run_id in self._runs:
            raise RunExists(f"run {state.run_id} exists already")
        snapshot = _snapshot(state)
        if idempotency_key is not None:
            self._idempotency[idempotency_key] = state.run_id
        at = state.created_at
        self._runs[state.run_id] = _Run(
            state.run_id,
            state.workflow,
            state.version,
            state.parent_run_id,
            snapshot,
            at,
            at,
            state.status.value,
        )
        if state.status._value_ == "pending":
            entry = PendingRun(
                rank=PRIORITY_RANK[state.priority], created_at=at, run_id=state.run_id
            )
            self._queued[state.run_id] = entry
            bisect.insort(self._queue, entry)
        return state.run_id, True

    def _dequeue(self, run_id: str) -> None:
        entry = self._queued.pop(run_id, None)
        if entry is not None:
            queue = self._queue
            del queue[bisect.bisect_left(queue, entry)]

    def _run(self, run_id: str) -> _Run:
        try:
            return self._runs[run_id]
        except KeyError:
            raise NotFound(f"no run {run_id!r}") from None

    async def load_run(self, run_id: str) -> StoredRun:
        run = self._run(run_id)
        state = sb.snapshot_from_row(run_id, run.snapshot)
        tail = [event for _, event, _ in run.log[run.snapshot_at :]]
        return StoredRun(snapshot=state, tail=tail, last_seq=run.last_seq)

    async def commit(self, batch: Sequence[AppliedEvent], relayed: Sequence[str] = ()) -> None:
        # Written as few loops with no call per event: every step of every run passes here.
        runs = self._runs
        last: dict[str, AppliedEvent] = {}
        wanted: set[str] = set()
        for applied in batch:
            run_id = applied.event.run_id
            if run_id not in last and self._run(run_id).last_seq != applied.seq - 1:
                raise ConcurrencyConflict(f"run {run_id} was advanced by another applier")
            last[run_id] = applied
            if applied.snapshot:
                wanted.add(run_id)
        # As in the SQL stores, a snapshot asked for mid-batch is stored as of the run's
        # last event of the batch; serialised before anything changes (it may fail).
        snapshots = {run_id: _snapshot(last[run_id].state) for run_id in wanted}
        index = index_rows(batch)
        outbox = self._outbox
        for applied in batch:
            event = applied.event
            run = runs[event.run_id]
            run.last_seq = applied.seq
            # A Transition is a named tuple: copied as a plain tuple (untracked by the
            # garbage collector once it holds only plain values).
            run.log.append((applied.seq, event, tuple(map(_plain, applied.transitions))))
            if applied.commands:
                for outbox_id, command in applied.outbox:
                    outbox[outbox_id] = OutboxItem(id=outbox_id, run_id=run.run_id, command=command)
        for run_id, applied in last.items():
            run = runs[run_id]
            if run.status == "pending" and applied.state.status._value_ != "pending":
                self._dequeue(run_id)
            run.advance(applied.state, applied.event.time)
            if run_id in snapshots:
                run.snapshot, run.snapshot_at = snapshots[run_id], len(run.log)
        for outbox_id in relayed:
            outbox.pop(outbox_id, None)
        self._write_index(index)

    def _write_index(self, rows: IndexRows) -> None:
        timers, tasks = self._timers, self._tasks
        for (run_id, timer_id), fire_at in rows.timers.items():
            if fire_at is not None:
                timers.setdefault(run_id, {})[timer_id] = fire_at
            elif (of_run := timers.get(run_id)) is not None:
                of_run.pop(timer_id, None)
                if not of_run:
                    del timers[run_id]
        # Each key has one net change (IndexRows.task_rows), so they are written in one
        # pass: no two of them touch the same row.
        for (run_id, key), row in rows.tasks.items():
            held = tasks.get(run_id)
            old = held.get(key) if held is not None else None
            if row.gone:
                if old is not None and old.attempt == row.attempt:
                    del held[key]  # type: ignore[union-attr]
                    if not held:
                        del tasks[run_id]
            elif row.dispatched_at is not None:
                lease = TaskLease(
                    run_id=run_id,
                    step_key=key,
                    attempt=row.attempt,
                    dispatched_at=row.dispatched_at,
                    started_at=row.started_at,
                )
                if held is None:
                    tasks[run_id] = {key: lease}
                else:
                    held[key] = lease
            elif row.started_at is not None and old is not None and old.attempt == row.attempt:
                # Built whole, not ``dataclasses.replace``: every started attempt passes
                # here, and replace walks the fields in Python (4% of a W1 step).
                held[key] = TaskLease(  # type: ignore[index]
                    run_id=run_id,
                    step_key=key,
                    attempt=old.attempt,
                    dispatched_at=old.dispatched_at,
                    started_at=row.started_at,
                    owner=old.owner,
                    lease_until=old.lease_until,
                )
        for run_id, names in rows.waits.items():
            self._set_waits(run_id, names)
        if rows.ended:
            self._forget_index(set(rows.ended))

    def _set_waits(self, run_id: str, names: frozenset[str]) -> None:
        for name in self._waits_of.pop(run_id, frozenset()):
            runs = self._waits[name]
            runs.discard(run_id)
            if not runs:
                del self._waits[name]
        if names:
            self._waits_of[run_id] = names
            for name in names:
                self._waits.setdefault(name, set()).add(run_id)

    def _forget_index(self, runs: set[str]) -> None:
        for run_id in runs:
            self._timers.pop(run_id, None)
            self._tasks.pop(run_id, None)
            self._set_waits(run_id, frozenset())

    async def history(self, run_id: str) -> list[HistoryEntry]:
        return [_entry(run_id, *row) for row in self._run(run_id).log]

    async def get_run(self, run_id: str) -> RunSummary:
        return self._run(run_id).summary

    async def list_runs(
        self, filter: RunFilter | None = None, *, limit: int = 100, cursor: str | None = None
    ) -> RunPage:
        f = filter or RunFilter()
        after = decode_cursor(cursor) if cursor else None
        rows = sorted(self._runs.values(), key=lambda r: (r.created_at, r.run_id), reverse=True)
        out: list[RunSummary] = []
        for r in rows:
            if after is not None and (r.created_at, r.run_id) >= after:
                continue
            if f.status is not None and r.status != f.status:
                continue
            if f.workflow is not None and r.workflow != f.workflow:
                continue
            if f.created_after is not None and r.created_at < f.created_after:
                continue
            if f.created_before is not None and r.created_at >= f.created_before:
                continue
            out.append(r.summary)
            if len(out) > limit:
                break
        page, more = out[:limit], len(out) > limit
        next_cursor = encode_cursor(page[-1].created_at, page[-1].run_id) if more else None
        return RunPage(runs=page, next_cursor=next_cursor)

    async def unfinished_runs(self) -> list[str]:
        return [run_id for run_id, r in self._runs.items() if r.status not in _TERMINAL]

    async def pending_runs(self, limit: int, after: PendingRun | None = None) -> list[PendingRun]:
        queue = self._queue
        start = 0 if after is None else bisect.bisect_right(queue, after)
        return queue[start : start + limit]

    async def count_pending(self, ahead_of: str | None = None) -> int:
        if ahead_of is None:
            return len(self._queue)
        entry = self._queued.get(ahead_of)
        if entry is None:
            run = self._runs.get(ahead_of)
            if run is None:
                return 0  # as the SQL stores: a run not stored has nobody ahead
            # not pending: the runs that would come before it, were it queued
            rank = PRIORITY_RANK[sb.snapshot_from_row(ahead_of, run.snapshot).priority]
            entry = PendingRun(rank=rank, created_at=run.created_at, run_id=ahead_of)
        return bisect.bisect_left(self._queue, entry)

    async def pending_outbox(self, limit: int = 1000) -> list[OutboxItem]:
        return list(self._outbox.values())[:limit]

    async def unindexed_runs(self, limit: int = 1000) -> list[str]:
        return []  # nothing outlives the process: every run was committed with its rows

    async def index_run(self, state: RunState, in_flight: Sequence[TaskLease]) -> None:
        self._forget_index({state.run_id})
        self._write_index(state_rows(state, in_flight))

    async def due_timers(
        self, before: float, limit: int = 1000, *, after: float | None = None
    ) -> list[DueTimer]:
        low = -math.inf if after is None else after
        due = sorted(
            (fire_at, run_id, timer_id)
            for run_id, of_run in self._timers.items()
            for timer_id, fire_at in of_run.items()
            if low < fire_at <= before
        )
        return [DueTimer(run_id=r, timer_id=t, fire_at=f) for f, r, t in due[:limit]]

    # -- schedules ---------------------------------------------------------------

    async def list_schedules(self, workflow: str | None = None) -> list[ScheduleRow]:
        return [
            row
            for key, row in sorted(self._schedules.items())
            if workflow is None or key[0] == workflow
        ]

    async def insert_schedule(self, row: ScheduleRow) -> bool:
        if row.key in self._schedules:
            return False
        sb.schedule_values(row)  # refuse what a SQL store could not store either
        self._schedules[row.key] = replace(row, revision=0, updated_at=time.time())
        return True

    async def update_schedule(self, row: ScheduleRow) -> bool:
        stored = self._schedules.get(row.key)
        if stored is None or stored.revision != row.revision:
            return False
        sb.schedule_values(row)
        self._schedules[row.key] = replace(row, revision=row.revision + 1, updated_at=time.time())
        return True

    async def remove_schedule(self, workflow: str, schedule_id: str) -> bool:
        return self._schedules.pop((workflow, schedule_id), None) is not None

    async def due_schedules(
        self, before: float, limit: int = 1000, *, after: float | None = None
    ) -> list[ScheduleRow]:
        low = -math.inf if after is None else after
        due = [
            row
            for row in self._schedules.values()
            if row.live and row.fire_at is not None and low < row.fire_at <= before
        ]
        due.sort(key=lambda r: (r.fire_at or 0.0, r.workflow, r.schedule_id))
        return due[:limit]

    async def runs_waiting_for(self, signal: str) -> list[str]:
        return sorted(self._waits.get(signal, ()))

    async def claim_task(
        self, run_id: str, step_key: str, attempt: int, *, owner: str, now: float, until: float
    ) -> bool:
        lease = self._tasks.get(run_id, {}).get(step_key)
        if lease is None or lease.attempt != attempt:
            return False
        if lease.owner not in (None, owner) and lease.lease_until > now:
            return False
        self._tasks[run_id][step_key] = replace(lease, owner=owner, lease_until=until)
        return True

    async def extend_task(
        self, run_id: str, step_key: str, attempt: int, *, owner: str, until: float
    ) -> bool:
        lease = self._tasks.get(run_id, {}).get(step_key)
        if lease is None or lease.attempt != attempt or lease.owner != owner:
            return False
        self._tasks[run_id][step_key] = replace(lease, lease_until=until)
        return True

    async def expired_tasks(self, before: float, limit: int = 10_000) -> list[TaskLease]:
        expired = [
            lease
            for held in self._tasks.values()
            for lease in held.values()
            if lease.lease_until < before
        ]
        expired.sort(key=lambda t: (t.lease_until, t.run_id, t.step_key))
        return expired[:limit]

    async def tasks_in_flight(
        self, after: tuple[str, str] | None = None, limit: int = 10_000
    ) -> list[TaskLease]:
        found = sorted(
            (lease for held in self._tasks.values() for lease in held.values() if lease.attempt),
            key=lambda t: (t.run_id, t.step_key),
        )
        if after is not None:
            found = [t for t in found if (t.run_id, t.step_key) > after]
        return found[:limit]

    async def acquire_lease(
        self, lease: Lease, *, now: float, take_from: str | None = None
    ) -> Lease:
        held = self._leases.get(lease.name)
        if held is None or held.expires_at <= now or held.owner in (lease.owner, take_from):
            held = self._leases[lease.name] = lease
        return held

    async def renew_leases(self, names: Collection[str], owner: str, expires_at: float) -> set[str]:
        renewed: set[str] = set()
        for name in names:
            held = self._leases.get(name)
            if held is not None and held.owner == owner:
                self._leases[name] = replace(held, expires_at=expires_at)
                renewed.add(name)
        return renewed

    async def release_lease(self, name: str, owner: str) -> None:
        held = self._leases.get(name)
        if held is not None and held.owner == owner:
            del self._leases[name]

    async def lease_holder(self, name: str) -> Lease | None:
        return self._leases.get(name)

    async def list_leases(self, prefix: str) -> list[Lease]:
        return [self._leases[name] for name in sorted(self._leases) if name.startswith(prefix)]

    async def add_to_inbox(self, events: Sequence[Event]) -> Lease | None:
        for event in events:  # what the SQL stores cannot hold fails here too, adding nothing
            sb.dumps(codec.event_to_data(event))
        for event in events:
            self._inbox.setdefault(event.event_id, event)
        for listener in list(self._inbox_listeners):
            listener()
        return self._leases.get(ENGINE_LEASE)

    async def inbox(self, limit: int = 1000) -> list[Event]:
        return list(self._inbox.values())[:limit]

    async def remove_from_inbox(self, event_ids: Sequence[str]) -> None:
        for event_id in event_ids:
            self._inbox.pop(event_id, None)

    async def listen_inbox(self, listener: InboxListener) -> str | None:
        self._inbox_listeners.append(listener)
        return "memory:"

    async def create_token(self, token: ApiToken) -> None:
        if token.token_id in self._tokens:
            raise sb.token_taken(token.token_id)
        self._tokens[token.token_id] = token

    async def get_token(self, token_id: str) -> ApiToken | None:
        return self._tokens.get(token_id)

    async def list_tokens(self) -> list[ApiToken]:
        return sorted(self._tokens.values(), key=lambda t: (t.created_at, t.token_id))

    async def record_token_use(self, token_id: str, at: float) -> None:
        token = self._tokens.get(token_id)
        if token is not None and (token.last_used_at is None or token.last_used_at < at):
            self._tokens[token_id] = replace(token, last_used_at=at)

    async def revoke_token(self, token_id: str, at: float) -> bool:
        token = self._tokens.get(token_id)
        if token is None or token.revoked:
            return False
        self._tokens[token_id] = replace(token, revoked_at=at)
        return True

    async def prune(
        self, older_than: float, *, batch_size: int = 500, archive: Archive | None = None
    ) -> int:
        doomed = [
            run_id
            for run_id, r in self._runs.items()
            if r.status in _TERMINAL and r.finished_at is not None and r.finished_at < older_than
        ]
        for run_id in doomed:
            run = self._runs.pop(run_id)
            if archive is not None:
                archive(
                    {
                        "run": run.summary.to_dict(),
                        "history": [_entry(run_id, *row).to_dict() for row in run.log],
                    }
                )
        gone = set(doomed)  # as in the SQL stores: the run's outbox rows and key go with it
        self._outbox = {k: item for k, item in self._outbox.items() if item.run_id not in gone}
        self._idempotency = {k: r for k, r in self._idempotency.items() if r not in gone}
        self._forget_index(gone)
        return len(doomed)


def _snapshot(state: RunState) -> str:
    """What a SQL store would write."""
    try:
        return sb.dumps(codec.state_to_data(state))
    except UnstorableData as exc:
        raise UnstorableData(f"the state of run {state.run_id}: {exc.message}") from None


_plain = cast("Callable[[Transition], TransitionRow]", tuple)
"""A transition as a plain tuple (``tuple`` of a named tuple: a copy, built in C)."""


def _transition(row: TransitionRow) -> Transition:
    subject, old, new, time, cause, attempt = row
    return Transition(subject=subject, old=old, new=new, time=time, cause=cause, attempt=attempt)


_TERMINAL = frozenset(status.value for status in RUN_TERMINAL)


def _entry(
    run_id: str, seq: int, event: Event, transitions: tuple[TransitionRow, ...]
) -> HistoryEntry:
    return HistoryEntry(
        run_id=run_id,
        seq=seq,
        time=event.time,
        kind=codec.event_kind(event),
        event=codec.event_to_data(event),
        transitions=[codec.transition_to_data(_transition(row)) for row in transitions],
    )


__all__ = ["MemoryStore"]
