"""What the SQL stores share: turning applied events into rows and rows back into values.

The SQLite and PostgreSQL backends differ only in how they talk to their
database; the row shapes, JSON encoding, plan decoding and error wording live here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

import orjson

from tideflow.errors import DefinitionConflict, DefinitionInactive, NotFound, TideflowError
from tideflow.model import codec
from tideflow.model.events import Event
from tideflow.model.plan import Plan
from tideflow.model.quick import quick_init
from tideflow.model.run import RunState
from tideflow.model.schedules import ScheduleOrigin, ScheduleRow, ScheduleSpec
from tideflow.model.tokens import ApiToken, stored_role
from tideflow.model.versions import latest, version_key
from tideflow.store.base import (
    PRIORITY_RANK,
    AppliedEvent,
    DefinitionSummary,
    GatewayEvent,
    HistoryEntry,
    Lease,
    OutboxItem,
    PendingRun,
    RunFilter,
    RunPage,
    RunSummary,
    StoreError,
    TaskLease,
    UnstorableData,
)
from tideflow.store.paging import decode_cursor, encode_cursor
from tideflow.store.sealing import Sealer, SensitiveNames

PlanCompiler = Callable[[Mapping[str, Any]], Plan]

_DUMPS_OPTIONS = orjson.OPT_NON_STR_KEYS
_SUBJECT = itemgetter(0)
"""A transition's subject (``Transition.subject``, by position)."""


def dumps(value: Any) -> str:
    # Without OPT_NON_STR_KEYS first: it makes every dict slower (a run's snapshot took
    # 6.2 us instead of 3.8), and where the plain call succeeds its output is the same.
    # Only a value with a key that is not a str takes the second call.
    try:
        return orjson.dumps(value, default=str).decode()
    except TypeError:
        pass
    try:
        return orjson.dumps(value, option=_DUMPS_OPTIONS, default=str).decode()
    except TypeError as exc:  # an integer beyond 64 bits, a string that is not UTF-8, ...
        raise UnstorableData(f"a value cannot be stored as JSON: {exc}") from None


def loads(text: str | bytes | None, what: str, sealer: Sealer | None = None) -> Any:
    """Parse a stored JSON text; with the store's ``sealer``, sensitive values come back
    opened (see ``tideflow.store.sealing``)."""
    if sealer is not None:
        return sealer.loads(text, what)
    if text is None:
        return None
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise codec.StateFormatError(f"{what} is not valid JSON ({exc})") from None


@quick_init  # one per run of every commit
@dataclass(frozen=True, slots=True, kw_only=True)
class RunUpdate:
    """The summary columns of one run after a batch, with the sequence it expects."""

    run_id: str
    status: str
    updated_at: float
    finished_at: float | None
    output: str | None
    error: str | None
    last_seq: int
    expected_seq: int
    status_changed: bool = True
    """False when no event of the batch moved the run (every run status change is a
    ``run`` transition): its status and ``finished_at`` are as stored, and a SQL store
    can leave them out of the update instead of rewriting the index entries on them."""


@quick_init  # one per commit
@dataclass(frozen=True, slots=True, kw_only=True)
class BatchRows:
    history: list[tuple[str, int, str, str, float, str, str]]
    runs: list[RunUpdate]
    snapshots: list[tuple[str, int, str]]
    """(run_id, seq, state JSON): each run snapshotted in the batch, as of its last event."""
    outbox: list[tuple[str, str, float, str]]


def batch_rows(batch: Sequence[AppliedEvent], sealer: Sealer | None = None) -> BatchRows:
    """The rows of a batch; with a ``sealer``, the values of the fields a run's plan
    declares sensitive are sealed in every one of them (a run without: one lookup). A
    store passes none when no run of the batch has such fields (``Sealer.for_plans``)."""
    history = []
    first_seq: dict[str, int] = {}
    last: dict[str, AppliedEvent] = {}
    moved: set[str] = set()
    snapshots: set[str] = set()
    outbox = []
    for applied in batch:
        event = applied.event
        run_id = event.run_id
        sealing = None if sealer is None else _sealing(sealer, applied)  # no call: per event
        history.append(_history_row(applied, sealing))
        first_seq.setdefault(run_id, applied.seq)
        last[run_id] = applied
        if "run" in map(_SUBJECT, applied.transitions):  # no generator per event
            moved.add(run_id)
        if applied.snapshot:
            snapshots.add(run_id)
        for outbox_id, command in applied.outbox:
            data = codec.command_to_data(command)
            if sealing is not None:
                data = sealing.seal(data)
            outbox.append((outbox_id, run_id, event.time, dumps(data)))
    runs = [
        _run_update(a, first_seq[run_id] - 1, run_id in moved, _sealing(sealer, a))
        for run_id, a in last.items()
    ]
    # The runtime hands every event of a run the same live state object, so a snapshot
    # asked for mid-batch already holds the later events: store it under the run's last
    # seq of the batch, or a reload would replay those events a second time.
    snaps = [
        (run_id, last[run_id].seq, _state_text(last[run_id].state, _sealing(sealer, last[run_id])))
        for run_id in snapshots
    ]
    return BatchRows(history=history, runs=runs, snapshots=snaps, outbox=outbox)


@dataclass(frozen=True, slots=True)
class Sealing:
    """How one run's sensitive values are sealed (only runs whose plan declares some)."""

    sealer: Sealer
    names: SensitiveNames
    run_id: str

    def seal(self, data: Any, *, eager: bool = False) -> Any:
        return self.sealer.seal(data, self.names, f"run {self.run_id}", eager=eager)


def _sealing(sealer: Sealer | None, applied: AppliedEvent) -> Sealing | None:
    if sealer is None:
        return None
    names = sealer.names(applied.state.plan_hash)
    return None if names is None else Sealing(sealer, names, applied.state.run_id)


def _state_text(state: RunState, sealing: Sealing | None, *, eager: bool = False) -> str:
    data = codec.state_to_data(state)
    return dumps(data if sealing is None else sealing.seal(data, eager=eager))


def _history_row(
    applied: AppliedEvent, sealing: Sealing | None = None
) -> tuple[str, int, str, str, float, str, str]:
    event = applied.event
    kind = codec.event_kind(event)
    try:
        fields = codec.event_to_data(event)
        data = dumps(fields if sealing is None else sealing.seal(fields))
        transitions = dumps([codec.transition_to_data(t) for t in applied.transitions])
    except UnstorableData as exc:
        raise UnstorableData(f"event {kind} of run {event.run_id}: {exc.message}") from None
    return (event.run_id, applied.seq, event.event_id, kind, event.time, data, transitions)


def _run_update(
    applied: AppliedEvent, expected: int, status_changed: bool, sealing: Sealing | None
) -> RunUpdate:
    state = applied.state
    output = state.output
    if output is not None and sealing is not None:
        output = sealing.seal(output)
    return RunUpdate(
        run_id=state.run_id,
        status=state.status._value_,  # not the enum property: once per run and commit
        updated_at=applied.event.time,
        finished_at=state.finished_at,
        output=dumps(output) if output is not None else None,
        error=dumps(codec.error_to_data(state.error)) if state.error is not None else None,
        last_seq=applied.seq,
        expected_seq=expected,
        status_changed=status_changed,
    )


def new_run_row(
    state: RunState, idempotency_key: str | None, sealer: Sealer | None = None
) -> tuple[Any, ...]:
    names = None if sealer is None else sealer.names(state.plan_hash)
    sealing = None if sealer is None or names is None else Sealing(sealer, names, state.run_id)
    return (
        state.run_id,
        state.workflow,
        state.version,
        state.plan_hash,
        state.status.value,
        state.created_at,
        state.created_at,
        state.parent_run_id,
        idempotency_key,
        _state_text(state, sealing, eager=True),  # refused before it is written
        PRIORITY_RANK[state.priority],
    )


def new_run_rows(
    runs: Sequence[tuple[RunState, str | None]], sealer: Sealer
) -> list[tuple[Any, ...] | Exception]:
    """``new_run_row`` of each run, or the error that refuses that run alone."""
    rows: list[tuple[Any, ...] | Exception] = []
    for state, idempotency_key in runs:
        try:
            rows.append(new_run_row(state, idempotency_key, sealer))
        except Exception as exc:  # a state that cannot be stored: its caller hears why
            rows.append(exc)
    return rows


async def learn_plans(
    read_plan: Callable[[str], Awaitable[Plan]], sealer: Sealer, plan_hashes: Iterable[str]
) -> None:
    """Make ``sealer`` know the sensitive names of these plans before their runs' rows are
    written (a plan this process never read yet: another engine started the run). A
    plan that cannot be read seals nothing: its run cannot be loaded either."""
    for plan_hash in sealer.unknown(plan_hashes):
        try:
            sealer.learn(await read_plan(plan_hash))
        except TideflowError:
            sealer.seal_nothing_for(plan_hash)


def snapshot_from_row(run_id: str, text: str, sealer: Sealer | None = None) -> RunState:
    data = loads(text, f"the stored state of run {run_id!r}", sealer)
    if not isinstance(data, dict):
        raise codec.StateFormatError(f"the stored state of run {run_id!r} is not a JSON object")
    return codec.state_from_data(data)


def event_from_row(run_id: str, seq: int, text: str, sealer: Sealer | None = None) -> Any:
    data = loads(text, f"history row {seq} of run {run_id!r}", sealer)
    if not isinstance(data, dict):
        raise codec.StateFormatError(f"history row {seq} of run {run_id!r} is not a JSON object")
    return codec.event_from_data(data, run_id=run_id)


def history_entry(run_id: str, row: Sequence[Any], sealer: Sealer | None = None) -> HistoryEntry:
    seq, time, kind, data, transitions = row
    return HistoryEntry(
        run_id=run_id,
        seq=int(seq),
        time=float(time),
        kind=str(kind),
        event=loads(data, f"history row {seq} of run {run_id!r}", sealer),
        transitions=loads(transitions, f"history row {seq} of run {run_id!r}") or [],
    )


def summary_from_row(row: Sequence[Any], sealer: Sealer | None = None) -> RunSummary:
    run_id, workflow, version, status, created, updated, finished, parent, output, error = row
    return RunSummary(
        run_id=run_id,
        workflow=workflow,
        version=version,
        status=status,
        created_at=float(created),
        updated_at=float(updated),
        finished_at=None if finished is None else float(finished),
        parent_run_id=parent,
        output=loads(output, f"the output of run {run_id!r}", sealer),
        error=loads(error, f"the error of run {run_id!r}"),
    )


def run_page(rows: Sequence[Sequence[Any]], limit: int, sealer: Sealer | None = None) -> RunPage:
    """A page of a listing queried with ``limit + 1`` rows (the extra row says there is more)."""
    runs = [summary_from_row(row, sealer) for row in rows[:limit]]
    more = len(rows) > limit
    next_cursor = encode_cursor(runs[-1].created_at, runs[-1].run_id) if more else None
    return RunPage(runs=runs, next_cursor=next_cursor)


def outbox_item(row: Sequence[Any], sealer: Sealer | None = None) -> OutboxItem:
    outbox_id, run_id, command = row
    data = loads(command, f"outbox entry {outbox_id!r}", sealer)
    return OutboxItem(id=outbox_id, run_id=run_id, command=codec.command_from_data(data))


def task_lease(row: Sequence[Any]) -> TaskLease:
    run_id, step_key, attempt, dispatched_at, started_at, owner, lease_until = row
    return TaskLease(
        run_id=run_id,
        step_key=step_key,
        attempt=int(attempt),
        dispatched_at=float(dispatched_at),
        started_at=None if started_at is None else float(started_at),
        owner=owner,
        lease_until=float(lease_until),
    )


def lease_row(lease: Lease) -> tuple[Any, ...]:
    return (
        lease.name,
        lease.owner,
        lease.kind,
        lease.host,
        lease.pid,
        lease.address,
        lease.acquired_at,
        lease.expires_at,
    )


def lease_from_row(row: Sequence[Any] | None) -> Lease | None:
    if row is None:
        return None
    name, owner, kind, host, pid, address, acquired_at, expires_at = row
    return Lease(
        name=str(name),
        owner=str(owner),
        kind=str(kind),
        host=str(host),
        pid=int(pid),
        address=None if address is None else str(address),
        acquired_at=float(acquired_at),
        expires_at=float(expires_at),
    )


def leases_from_rows(rows: Sequence[Sequence[Any]]) -> list[Lease]:
    return [lease for lease in map(lease_from_row, rows) if lease is not None]


def inbox_rows(
    events: Sequence[Event], sealer: Sealer | None = None, plans: Mapping[str, str] | None = None
) -> list[tuple[str, str, float, str]]:
    """Inbox rows; ``plans`` (run id -> plan hash) says which runs' sensitive values
    ``sealer`` seals (a start from another process carries the run's input)."""
    rows = []
    for e in events:
        data = codec.event_to_data(e)
        plan_hash = None if plans is None else plans.get(e.run_id)
        names = None if sealer is None or plan_hash is None else sealer.names(plan_hash)
        if sealer is not None and names is not None:
            data = sealer.seal(data, names, f"run {e.run_id}")
        rows.append((e.event_id, e.run_id, time.time(), dumps(data)))
    return rows


def inbox_event(row: Sequence[Any], sealer: Sealer | None = None) -> Event:
    event_id, run_id, text = row
    data = loads(text, f"inbox event {event_id!r}", sealer)
    if not isinstance(data, dict):
        raise codec.StateFormatError(f"inbox event {event_id!r} is not a JSON object")
    return codec.event_from_data(data, run_id=run_id)


def token_row(token: ApiToken) -> tuple[Any, ...]:
    return (
        token.token_id,
        token.name,
        token.role.value,
        token.secret_hash,
        token.created_at,
        token.revoked_at,
        token.last_used_at,
    )


def token_from_row(row: Sequence[Any] | None) -> ApiToken | None:
    if row is None:
        return None
    token_id, name, role, secret_hash, created_at, revoked_at, last_used_at = row
    return ApiToken(
        token_id=str(token_id),
        name=str(name),
        role=stored_role(str(token_id), str(role)),
        secret_hash=str(secret_hash),
        created_at=float(created_at),
        revoked_at=None if revoked_at is None else float(revoked_at),
        last_used_at=None if last_used_at is None else float(last_used_at),
    )


def tokens_from_rows(rows: Sequence[Sequence[Any]]) -> list[ApiToken]:
    return [token for token in map(token_from_row, rows) if token is not None]


def gateway_event_row(event: GatewayEvent) -> tuple[Any, ...]:
    return (
        event.key,
        event.source,
        event.id,
        event.type,
        event.run_id,
        dumps(event.payload),
        event.status,
        event.received_at,
        event.buffer_until,
        dumps(list(event.delivered_to)),
        dumps(list(event.started)),
        event.reason,
    )


def settle_params(event: GatewayEvent, was: str) -> tuple[Any, ...]:
    """The parameters of ``settle_gateway_event``."""
    delivered, started = dumps(list(event.delivered_to)), dumps(list(event.started))
    return (event.status, delivered, started, event.reason, event.key, was)


def gateway_event_from_row(row: Sequence[Any] | None) -> GatewayEvent | None:
    if row is None:
        return None
    key, source, event_id, type, run_id, payload, status, received, until, to, started, why = row
    what = f"gateway event {key!r}"
    return GatewayEvent(
        key=str(key),
        source=str(source),
        id=str(event_id),
        type=str(type),
        run_id=None if run_id is None else str(run_id),
        payload=loads(payload, what),
        status=str(status),
        received_at=float(received),
        buffer_until=float(until),
        delivered_to=tuple(loads(to, what)),
        started=tuple(loads(started, what)),
        reason=None if why is None else str(why),
    )


def buffered_for_waits(
    rows: Sequence[Sequence[Any]],
) -> list[tuple[str, str, GatewayEvent]]:
    """(run id, wait row, event) from ``buffered_for_waits`` rows."""
    found = []
    for row in rows:
        event = gateway_event_from_row(tuple(row[2:]))
        assert event is not None
        found.append((str(row[0]), str(row[1]), event))
    return found


def gateway_events_from_rows(rows: Sequence[Sequence[Any]]) -> list[GatewayEvent]:
    return [e for e in map(gateway_event_from_row, rows) if e is not None]


def token_taken(token_id: str) -> StoreError:
    return StoreError(f"token id {token_id!r} is taken")


def plan_label(plan_hash: str, name: str | None, version: str | None) -> str:
    """How messages name a stored plan: by its definition when one is registered."""
    if name is None:
        return f"plan {plan_hash[:12]}"
    return f"definition {name} {version}"


SUMMARY_COLUMNS = (
    "run_id, workflow, version, status, created_at, updated_at, finished_at, "
    "parent_run_id, output, error"
)


def list_runs_query(
    f: RunFilter, limit: int, cursor: str | None, param: Callable[[int], str]
) -> tuple[str, list[Any]]:
    """The run listing: newest first, keyset-paginated, every filter an index prefix.
    ``param(n)`` spells the n-th (1-based) placeholder of the dialect."""
    conditions: list[tuple[str, tuple[Any, ...]]] = []
    if f.status is not None:
        conditions.append(("status = {}", (f.status,)))
    if f.workflow is not None:
        conditions.append(("workflow = {}", (f.workflow,)))
    if f.created_after is not None:
        conditions.append(("created_at >= {}", (f.created_after,)))
    if f.created_before is not None:
        conditions.append(("created_at < {}", (f.created_before,)))
    if cursor:
        conditions.append(("(created_at, run_id) < ({}, {})", decode_cursor(cursor)))
    where: list[str] = []
    params: list[Any] = []
    for template, values in conditions:
        where.append(template.format(*(param(len(params) + i) for i in range(1, len(values) + 1))))
        params.extend(values)
    sql = f"SELECT {SUMMARY_COLUMNS} FROM runs"
    if where:
        sql += " WHERE " + " AND ".join(where)
    params.append(limit + 1)
    return f"{sql} ORDER BY created_at DESC, run_id DESC LIMIT {param(len(params))}", params


def plan_from_source(
    compile_plan: PlanCompiler | None, source_text: str, what: str, plan_hash: str
) -> Plan:
    """Rebuild a stored plan; a row that no longer compiles is named, not a traceback."""
    if compile_plan is None:
        raise TideflowError(f"{what}: this store was opened without a plan compiler")
    source = loads(source_text, what)
    if not isinstance(source, dict):
        raise codec.StateFormatError(f"{what}: stored source is not a JSON object")
    try:
        return compile_plan(source)
    except TideflowError as exc:
        raise codec.StateFormatError(
            f"{what} (plan {plan_hash[:12]}) stored in this database no longer compiles: "
            f"{exc.message.splitlines()[0]}"
        ) from None


def definition_conflict(name: str, version: str) -> DefinitionConflict:
    return DefinitionConflict(
        f"{name} {version} is already registered with different content; "
        "give the changed definition a new version"
    )


def chosen_definition(
    name: str, version: str | None, rows: Iterable[tuple[str, str, Any]]
) -> str | None:
    """The hash of ``name`` at ``version``, or at its highest active version when
    ``version`` is None, from (version, hash, active) rows; None when there is no such
    version; ``DefinitionInactive`` when every version of ``name`` is deactivated."""
    by_version = {str(v): (str(h), bool(a)) for v, h, a in rows}
    if version is not None:
        found = by_version.get(version)
        return None if found is None else found[0]
    chosen = latest(v for v, (_, active) in by_version.items() if active)
    if chosen is None:
        if by_version:
            raise every_version_inactive(name, by_version)
        return None
    return by_version[chosen][0]


def definition_summary(row: Sequence[Any]) -> DefinitionSummary:
    """A ``DefinitionSummary`` of a (name, version, hash, created_at, active, title) row
    (the title read from the plan's stored source: no column, no migration)."""
    name, version, plan_hash, created_at, active, title = row
    return DefinitionSummary(
        name=name,
        version=version,
        hash=plan_hash,
        created_at=float(created_at),
        active=bool(active),
        title=title if isinstance(title, str) else None,
    )


def trigger_rows(plan: Plan) -> list[tuple[str, str, str]]:
    """(event, name, version) rows of the plan's triggers, one per event type."""
    return [(event, plan.name, plan.version) for event in sorted({t.event for t in plan.triggers})]


def every_version_inactive(name: str, versions: Iterable[str]) -> DefinitionInactive:
    listed = ", ".join(sorted(versions, key=version_key))
    return DefinitionInactive(
        f"every version of {name!r} is deactivated ({listed}): activate one with "
        f"`tideflow definitions activate {name} VERSION`"
    )


def inactive_version(name: str, version: str) -> DefinitionInactive:
    return DefinitionInactive(
        f"{name} {version} is deactivated and starts no new run: activate it with "
        f"`tideflow definitions activate {name} {version}`, or start another version"
    )


def no_definition(name: str, version: str | None, known: Sequence[str]) -> NotFound:
    which = f"{name!r} version {version}" if version else repr(name)
    return NotFound(f"no definition {which} (registered: {', '.join(known) or 'none'})")


def no_run(run_id: str) -> NotFound:
    return NotFound(f"no run {run_id!r}")


# -- schedules ---------------------------------------------------------------------


def schedule_values(row: ScheduleRow) -> tuple[Any, ...]:
    """(version, origin, spec, paused, deleted, next_slot, fire_at, last_slot,
    last_run_id, buffered_slot): what an insert and an update write alike."""
    return (
        row.version,
        str(row.origin),
        dumps(row.spec.to_data()),
        row.paused,
        row.deleted,
        row.next_slot,
        row.fire_at,
        row.last_slot,
        row.last_run_id,
        row.buffered_slot,
    )


def schedule_insert_params(row: ScheduleRow, now: float) -> tuple[Any, ...]:
    return (row.workflow, row.schedule_id, *schedule_values(row), now)


def schedule_update_params(row: ScheduleRow, now: float) -> tuple[Any, ...]:
    return (*schedule_values(row), now, row.workflow, row.schedule_id, row.revision)


def schedule_from_row(row: Sequence[Any]) -> ScheduleRow:
    """A ``ScheduleRow`` of a ``list_schedules`` / ``due_schedules`` row."""
    (workflow, schedule_id, version, origin, spec, paused, deleted) = row[:7]
    next_slot, fire_at, last_slot, last_run_id, buffered_slot, revision, updated_at = row[7:]
    return ScheduleRow(
        workflow=workflow,
        schedule_id=schedule_id,
        version=version,
        origin=ScheduleOrigin(origin),
        spec=_spec(workflow, schedule_id, spec),
        paused=bool(paused),
        deleted=bool(deleted),
        next_slot=_float(next_slot),
        fire_at=_float(fire_at),
        last_slot=_float(last_slot),
        last_run_id=last_run_id,
        buffered_slot=_float(buffered_slot),
        revision=int(revision),
        updated_at=float(updated_at),
    )


def due_schedule_rows(rows: Iterable[Sequence[Any]]) -> list[ScheduleRow]:
    """``schedule_from_row`` of each row; a row that cannot be read is left out and
    logged (it would otherwise hold up every other schedule's slots)."""
    decoded = []
    for row in rows:
        try:
            decoded.append(schedule_from_row(row))
        except codec.StateFormatError as exc:
            logging.getLogger("tideflow.schedules").error("%s: it does not fire", exc)
    return decoded


def _spec(workflow: str, schedule_id: str, text: str) -> ScheduleSpec:
    what = f"the spec of schedule {workflow}/{schedule_id}"
    data = loads(text, what)
    try:
        return ScheduleSpec.of(data)
    except (KeyError, ValueError, TypeError) as exc:
        raise codec.StateFormatError(
            f"{what} cannot be read ({type(exc).__name__}: {exc}): register the workflow's "
            f"definition again, or delete the schedule"
        ) from None


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


QUEUE_HEAD = (-1, 0.0, "")
"""``pending_runs`` parameters that come before every run of the queue."""


def queue_after(after: PendingRun | None) -> tuple[int, float, str]:
    """The ``(priority, created_at, run_id)`` that ``pending_runs`` reads after."""
    return QUEUE_HEAD if after is None else (after.rank, after.created_at, after.run_id)


def pending_run(row: Sequence[Any]) -> PendingRun:
    return PendingRun(rank=int(row[1]), created_at=float(row[2]), run_id=str(row[0]))
