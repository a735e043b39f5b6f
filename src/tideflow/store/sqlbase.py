"""What the SQL stores share: turning applied events into rows and rows back into values.

The SQLite and PostgreSQL backends differ only in how they talk to their
database; the row shapes, JSON encoding, plan decoding and error wording live here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from tideflow.errors import DefinitionConflict, NotFound, TideflowError
from tideflow.model import codec
from tideflow.model.plan import Plan
from tideflow.model.run import RunState
from tideflow.store.base import AppliedEvent, HistoryEntry, OutboxItem, RunSummary

PlanCompiler = Callable[[Mapping[str, Any]], Plan]

_DUMPS_OPTIONS = orjson.OPT_NON_STR_KEYS


def dumps(value: Any) -> str:
    return orjson.dumps(value, option=_DUMPS_OPTIONS, default=str).decode()


def loads(text: str | bytes | None, what: str) -> Any:
    if text is None:
        return None
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise codec.StateFormatError(f"{what} is not valid JSON ({exc})") from None


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
class BatchRows:
    history: list[tuple[str, int, str, str, float, str, str]]
    runs: list[RunUpdate]
    snapshots: list[tuple[str, int, str]]
    """(run_id, seq, state JSON): the newest snapshot of each run in the batch."""
    outbox: list[tuple[str, str, float, str]]


def batch_rows(batch: Sequence[AppliedEvent]) -> BatchRows:
    history = []
    first_seq: dict[str, int] = {}
    last: dict[str, AppliedEvent] = {}
    snapshots: dict[str, AppliedEvent] = {}
    outbox = []
    for applied in batch:
        event = applied.event
        run_id = event.run_id
        history.append(
            (
                run_id,
                applied.seq,
                event.event_id,
                codec.event_kind(event),
                event.time,
                dumps(codec.event_to_data(event)),
                dumps([codec.transition_to_data(t) for t in applied.transitions]),
            )
        )
        first_seq.setdefault(run_id, applied.seq)
        last[run_id] = applied
        if applied.snapshot:
            snapshots[run_id] = applied
        for outbox_id, command in applied.outbox:
            outbox.append((outbox_id, run_id, event.time, dumps(codec.command_to_data(command))))
    runs = [_run_update(a, first_seq[run_id] - 1) for run_id, a in last.items()]
    snaps = [
        (run_id, a.seq, dumps(codec.state_to_data(a.state))) for run_id, a in snapshots.items()
    ]
    return BatchRows(history=history, runs=runs, snapshots=snaps, outbox=outbox)


def _run_update(applied: AppliedEvent, expected: int) -> RunUpdate:
    state = applied.state
    return RunUpdate(
        run_id=state.run_id,
        status=state.status.value,
        updated_at=applied.event.time,
        finished_at=state.finished_at,
        output=dumps(state.output) if state.output is not None else None,
        error=dumps(codec.error_to_data(state.error)) if state.error is not None else None,
        last_seq=applied.seq,
        expected_seq=expected,
    )


def new_run_row(state: RunState, idempotency_key: str | None) -> tuple[Any, ...]:
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
        dumps(codec.state_to_data(state)),
    )


def snapshot_from_row(run_id: str, text: str) -> RunState:
    data = loads(text, f"the stored state of run {run_id!r}")
    if not isinstance(data, dict):
        raise codec.StateFormatError(f"the stored state of run {run_id!r} is not a JSON object")
    return codec.state_from_data(data)


def event_from_row(run_id: str, seq: int, text: str) -> Any:
    data = loads(text, f"history row {seq} of run {run_id!r}")
    if not isinstance(data, dict):
        raise codec.StateFormatError(f"history row {seq} of run {run_id!r} is not a JSON object")
    return codec.event_from_data(data, run_id=run_id)


def history_entry(run_id: str, row: Sequence[Any]) -> HistoryEntry:
    seq, time, kind, data, transitions = row
    return HistoryEntry(
        run_id=run_id,
        seq=int(seq),
        time=float(time),
        kind=str(kind),
        event=loads(data, f"history row {seq} of run {run_id!r}"),
        transitions=loads(transitions, f"history row {seq} of run {run_id!r}") or [],
    )


def summary_from_row(row: Sequence[Any]) -> RunSummary:
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
        output=loads(output, f"the output of run {run_id!r}"),
        error=loads(error, f"the error of run {run_id!r}"),
    )


def outbox_item(row: Sequence[Any]) -> OutboxItem:
    outbox_id, run_id, command = row
    data = loads(command, f"outbox entry {outbox_id!r}")
    return OutboxItem(id=outbox_id, run_id=run_id, command=codec.command_from_data(data))


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


def no_definition(name: str, version: str | None, known: Sequence[str]) -> NotFound:
    which = f"{name!r} version {version}" if version else repr(name)
    return NotFound(f"no definition {which} (registered: {', '.join(known) or 'none'})")


def no_run(run_id: str) -> NotFound:
    return NotFound(f"no run {run_id!r}")
