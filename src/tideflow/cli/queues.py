"""`tideflow queues`: what waits on a cluster's bus, per queue and priority
(``Bus.queue_stats``), which queues no worker serves, and the workers with their last
heartbeat (``Bus.worker_beats``)."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from tideflow.cli.cluster import ClusterBusOption
from tideflow.cli.common import (
    JsonOption,
    err,
    fail_usage,
    iso,
    run_async,
    table_console,
    write_json,
)
from tideflow.cli.remote import ServerOption, TokenOption, check_server, http_client

if TYPE_CHECKING:
    from tideflow.bus.base import QueueStats, WorkerBeat


def queues_cmd(
    ctx: typer.Context,
    bus: ClusterBusOption = "",
    as_json: JsonOption = False,
    server: ServerOption = None,
    token: TokenOption = None,
    store: Annotated[
        str | None,
        typer.Option(
            "--store",
            metavar="URL",
            help="Also show the runs of the cluster's store: active (admitted, not ended: busy or parked, waiting for a signal or timer) and pending (waiting to be admitted, oldest first by priority). Each server bounds its busy runs: its metric tideflow_runs_active_bound.",
        ),
    ] = None,
) -> None:
    """Show the task queues of a cluster's bus: per queue and priority, the tasks
    waiting (depth), delivered and not settled (held), the age of the oldest
    waiting one, and the workers reading the queue (consumers); then the workers,
    each with the queues it reads and its last heartbeat (a worker whose process
    died is listed as stopped, with the time its heartbeat stopped, for a day).

    With --store, the runs too: how many are active (admitted by a server and not
    ended: busy ones, at most the sum of the servers' --max-active-runs, and parked
    ones, waiting for a signal, a timer or a child run) and how many are pending
    (stored, waiting for a server to admit them).

    A queue with tasks and no consumer gets a warning on stderr: its tasks stay
    queued (never lost, never failed) until a worker for it starts
    (`tideflow worker --queues NAME`). Exit 0 whatever the queues hold; 2 when the
    bus URL is wrong or the broker cannot be reached. See docs/operations.md, "Queues".

    Examples:
      tideflow queues --bus redis://mq:6379/0
      TIDEFLOW_BUS=nats://mq:4222 tideflow queues --json
      tideflow queues --server http://tideflow:8080 --token tf_...
    """
    from tideflow.bus.base import unserved

    check_server(ctx, server)
    read = _read_remote(server, token) if server else _read(_bus_url(bus))
    rows, beats = run_async(read)
    runs = run_async(_read_runs(store)) if store else None
    if as_json:
        found: dict[str, Any] = {
            "queues": [row_json(r) for r in rows],
            "unserved": unserved(rows),
            "workers": [beat_json(b) for b in beats],
        }
        if runs is not None:
            found["runs"] = {"active": runs[0], "pending": runs[1]}
        write_json(found)
    else:
        console = table_console()
        if rows:
            console.print(queues_table(rows))
        else:
            console.print("no task queue on this bus yet", markup=False)
        if beats:
            console.print(workers_table(beats, time.time()))
        if runs is not None:
            console.print(
                f"runs: {runs[0]:,} active (admitted, not ended), {runs[1]:,} pending "
                "(waiting to be admitted)",
                markup=False,
            )
    for line in warnings(rows):
        err.print(f"[bold yellow]warning:[/] {escape(line)}", markup=True)


def _bus_url(bus: str) -> str:
    if not bus:
        raise fail_usage(
            "give the cluster's bus: --bus redis://host:6379/0 (or TIDEFLOW_BUS), "
            "or a server: --server URL"
        )
    if bus.split("://", 1)[0].lower() in ("memory", "local"):
        raise fail_usage(
            f"--bus {bus}: the in-process bus lives inside one process; give the "
            "cluster's bus (redis://… or nats://…)"
        )
    return bus


async def _read_remote(server: str, token: str | None) -> tuple[list[QueueStats], list[WorkerBeat]]:
    async with http_client(server, token) as client:
        return await client.queues(), await client.worker_beats()


async def _read(url: str) -> tuple[list[QueueStats], list[WorkerBeat]]:
    from tideflow.bus import open_bus

    bus = open_bus(url)
    await bus.open()
    try:
        return await bus.queue_stats(), await bus.worker_beats()
    finally:
        await bus.close()


async def _read_runs(url: str) -> tuple[int, int]:
    """``(active, pending)`` runs of the store: started and not ended, and waiting to be
    admitted (runtime/admission.py)."""
    from tideflow.store import open_store
    from tideflow.store.base import RunFilter

    store = open_store(url, auto_upgrade=False)
    await store.open()
    try:
        active = 0
        for status in ("running", "compensating"):  # admitted runs, busy or parked
            cursor: str | None = None
            while True:
                page = await store.list_runs(RunFilter(status=status), limit=1000, cursor=cursor)
                active += len(page.runs)
                if page.next_cursor is None:
                    break
                cursor = page.next_cursor
        return active, await store.count_pending()
    finally:
        await store.close()


def queues_table(rows: Sequence[QueueStats]) -> Table:
    table = Table()
    for name in ("queue", "priority", "depth", "held", "oldest", "consumers"):
        table.add_column(
            name, no_wrap=True, justify="left" if name in ("queue", "priority") else "right"
        )
    for row in rows:
        table.add_row(
            escape(row.queue),
            row.priority.value,
            str(row.depth),
            str(row.held),
            age_text(row.oldest_age) if row.oldest_age is not None else "-",
            str(row.consumers),
        )
    return table


def row_json(row: QueueStats) -> dict[str, Any]:
    return {
        "queue": row.queue,
        "priority": row.priority.value,
        "depth": row.depth,
        "held": row.held,
        "oldest_age": row.oldest_age,
        "consumers": row.consumers,
    }


def workers_table(beats: Sequence[WorkerBeat], now: float) -> Table:
    table = Table()
    for name in ("worker", "queues", "state", "last heartbeat"):
        table.add_column(name, no_wrap=name != "queues")
    for beat in beats:
        queues = "all" if beat.queues is None else ", ".join(beat.queues)
        ago = age_text(max(now - beat.last_beat, 0.0))
        table.add_row(
            escape(beat.worker),
            escape(queues),
            "live" if beat.live else "[bold red]stopped[/]",
            f"{ago} ago",
        )
    return table


def beat_json(beat: WorkerBeat) -> dict[str, Any]:
    return {
        "worker": beat.worker,
        "queues": None if beat.queues is None else list(beat.queues),
        "last_beat": iso(beat.last_beat),
        "live": beat.live,
    }


def warnings(rows: Sequence[QueueStats]) -> list[str]:
    from tideflow.bus.base import unserved

    lines = []
    for queue in unserved(rows):
        mine = [r for r in rows if r.queue == queue]
        waiting = sum(r.depth for r in mine)
        ages = [r.oldest_age for r in mine if r.oldest_age is not None]
        oldest = f", oldest {age_text(max(ages))}" if ages else ""
        lines.append(f"no worker serves queue {queue}: {waiting} task(s) waiting{oldest}")
    return lines


def age_text(seconds: float) -> str:
    """``0.4s``, ``42s``, ``3m``, ``3m12s``, ``2h05m``, ``1d03h``."""
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    if seconds < 10:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    for unit, size, sub, sub_size in (
        ("d", 86400, "h", 3600),
        ("h", 3600, "m", 60),
        ("m", 60, "s", 1),
    ):
        if whole >= size:
            rest = (whole % size) // sub_size
            return f"{whole // size}{unit}{rest:02d}{sub}" if rest else f"{whole // size}{unit}"
    return f"{whole}s"


__all__ = [
    "age_text",
    "beat_json",
    "queues_cmd",
    "queues_table",
    "row_json",
    "warnings",
    "workers_table",
]
