"""`tideflow queues`: what waits on a cluster's bus, per queue and priority
(``Bus.queue_stats``), and which queues no worker serves."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from tideflow.bus.base import QueueStats, unserved
from tideflow.cli.cluster import ClusterBusOption
from tideflow.cli.common import JsonOption, err, fail_usage, run_async, table_console, write_json
from tideflow.cli.remote import ServerOption, TokenOption, check_server, http_client


def queues_cmd(
    ctx: typer.Context,
    bus: ClusterBusOption = "",
    as_json: JsonOption = False,
    server: ServerOption = None,
    token: TokenOption = None,
) -> None:
    """Show the task queues of a cluster's bus: per queue and priority, the tasks
    waiting (depth), delivered and not settled (held), the age of the oldest
    waiting one, and the workers reading the queue (consumers).

    A queue with tasks and no consumer gets a warning on stderr: its tasks stay
    queued (never lost, never failed) until a worker for it starts
    (`tideflow worker --queues NAME`). Exit 0 whatever the queues hold; 2 when the
    bus URL is wrong or the broker cannot be reached. See docs/operations.md, "Queues".

    Examples:
      tideflow queues --bus redis://mq:6379/0
      TIDEFLOW_BUS=nats://mq:4222 tideflow queues --json
      tideflow queues --server http://tideflow:8080 --token tf_...
    """
    check_server(ctx, server)
    rows = run_async(_read_remote(server, token)) if server else run_async(_read(_bus_url(bus)))
    if as_json:
        write_json({"queues": [row_json(r) for r in rows], "unserved": unserved(rows)})
    elif rows:
        table_console().print(queues_table(rows))
    else:
        table_console().print("no task queue on this bus yet", markup=False)
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


async def _read_remote(server: str, token: str | None) -> list[QueueStats]:
    async with http_client(server, token) as client:
        return await client.queues()


async def _read(url: str) -> list[QueueStats]:
    from tideflow.bus import open_bus

    bus = open_bus(url)
    await bus.open()
    try:
        return await bus.queue_stats()
    finally:
        await bus.close()


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


def warnings(rows: Sequence[QueueStats]) -> list[str]:
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


__all__ = ["age_text", "queues_cmd", "queues_table", "row_json", "unserved", "warnings"]
