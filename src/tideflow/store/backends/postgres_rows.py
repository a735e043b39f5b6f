"""Row writers of the PostgreSQL store: the argument of ``tideflow_commit`` (a whole
batch in one statement), a run's timer, task and wait rows, and the runs handed to an
archive before pruning."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tideflow.store import sqlbase as sb
from tideflow.store.base import Archive, HistoryEntry
from tideflow.store.indexrows import IndexRows
from tideflow.store.sealing import Sealer
from tideflow.store.sqlfiles import queries

Q = queries("postgres")


STALE_RUN = "TF409"
"""The SQLSTATE ``tideflow_commit`` raises when a run of the batch was advanced by
another applier (migration 0004); its message names the run."""


def commit_document(rows: sb.BatchRows, index: IndexRows, relayed: Sequence[str]) -> str:
    """The JSON argument of ``tideflow_commit``: each kind of row as a list of rows, a
    kind the batch has none of left out. One text parameter costs the event loop far
    less than one array per column (the driver checks every element of an array).

    A run's row carries its snapshot, if the batch took one (migration 0013): the
    function writes both with one UPDATE, one new version of the run's row."""
    runs = sorted(rows.runs, key=lambda r: r.run_id)  # the same lock order for every applier
    snapshots = {run_id: (seq, state) for run_id, seq, state in rows.snapshots}
    timers, untimed = index.timer_rows()
    tasks, starts, done = index.task_rows()
    document: dict[str, Sequence[Any]] = {
        "runs": [_run_row(r, snapshots.get(r.run_id, _NO_SNAPSHOT)) for r in runs],
        "history": rows.history,
        "outbox": rows.outbox,
        "relayed": relayed,
        "timers": timers,
        "untimed": untimed,
        "done": done,
        "tasks": tasks,
        "starts": starts,
        "rewait": list(index.waits),
        "waits": index.wait_rows() if index.waits else (),
        "ended": index.ended,
    }
    return sb.dumps({key: value for key, value in document.items() if value})


_NO_SNAPSHOT: tuple[None, None] = (None, None)


def _run_row(r: sb.RunUpdate, snapshot: tuple[int | None, str | None]) -> tuple[Any, ...]:
    return (
        r.run_id,
        r.status,
        r.updated_at,
        r.finished_at,
        r.output,
        r.error,
        r.last_seq,
        r.expected_seq,
        *snapshot,
    )


async def write_index(conn: Any, rows: IndexRows) -> None:
    """The batch's timer, task and wait rows: one statement per kind of change."""
    timers, untimed = rows.timer_rows()
    if timers:
        await conn.execute(Q["upsert_timers"], *_columns(timers, 3))
    if untimed:
        await conn.execute(Q["delete_timers"], *_columns(untimed, 2))
    tasks, starts, done = rows.task_rows()
    if done:
        await conn.execute(Q["delete_tasks"], *_columns(done, 3))
    if tasks:
        await conn.execute(Q["upsert_tasks"], *_columns(tasks, 5))
    if starts:
        await conn.execute(Q["start_tasks"], *_columns(starts, 4))
    if rows.waits:
        await conn.execute(Q["delete_runs_waits"], list(rows.waits))
        waits = rows.wait_rows()
        if waits:
            await conn.execute(Q["insert_waits"], *_columns(waits, 2))
    if rows.ended:
        for query in ("delete_runs_timers", "delete_runs_tasks", "delete_runs_waits"):
            await conn.execute(Q[query], rows.ended)


def _columns(rows: Sequence[tuple[Any, ...]], width: int) -> list[list[Any]]:
    return [[row[i] for row in rows] for i in range(width)]


async def archive_runs(conn: Any, ids: list[str], archive: Archive, sealer: Sealer) -> None:
    rows = await conn.fetch(Q["get_runs"], ids)
    summaries = {row[0]: sb.summary_from_row(row, sealer) for row in rows}
    entries: dict[str, list[HistoryEntry]] = {run_id: [] for run_id in ids}
    for row in await conn.fetch(Q["histories"], ids):
        entries[row[0]].append(sb.history_entry(row[0], tuple(row)[1:], sealer))
    for run_id in ids:
        archive(
            {
                "run": summaries[run_id].to_dict(),
                "history": [entry.to_dict() for entry in entries[run_id]],
            }
        )
