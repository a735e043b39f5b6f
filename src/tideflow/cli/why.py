"""`tideflow runs why RUN_ID`: why a run is not moving (runtime/why.py), read from the
store and, with --bus, the bus's queues and workers' heartbeats; or over --server, the server's own view."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer
from rich.markup import escape

from tideflow.cli.cluster import BusOption, reached
from tideflow.cli.common import (
    DEFAULT_STORE,
    EXIT_FAILED,
    JsonOption,
    RunArgument,
    StoreOption,
    iso,
    known_run,
    out,
    run_async,
    write_json,
)
from tideflow.cli.remote import ServerOption, TokenOption, check_server

if TYPE_CHECKING:
    from tideflow.runtime.why import Diagnosis


def why_cmd(
    ctx: typer.Context,
    run_id: RunArgument,
    as_json: JsonOption = False,
    store: StoreOption = DEFAULT_STORE,
    bus: BusOption = None,
    server: ServerOption = None,
    token: TokenOption = None,
) -> None:
    """Say why a run is where it is: what each unfinished step waits for, since when.

    Waiting for signal X since T (with its match); a timer (sleep, retry backoff) due
    at T, or overdue; an attempt on queue Q that no live worker reads; an attempt on
    worker W, or on a worker whose heartbeat stopped at T; a child run; a join waiting on steps; effects
    waiting to be relayed; no live engine (or server) for the run. With --bus (or
    --server) the bus's queues and workers' heartbeats are read too. Nothing is changed.

    Exit 0; 1 when a reason needs someone to act (no engine, no worker for a queue, a
    worker gone, an overdue timer). --json prints {"run_id", "status", "checked_at",
    "reasons": [{"kind", "text", "step", "since", "at", "data"}]}.

    Examples:
      tideflow runs why 3f2a9c...
      tideflow runs why 3f2a9c... --bus redis://mq:6379/0 --json
    """
    from tideflow.runtime.why import STUCK

    check_server(ctx, server)
    diagnosis = run_async(_why(store, bus, server, token, run_id))
    if as_json:
        write_json(why_json(diagnosis))
    else:
        out.print(f"run {escape(run_id)}: {diagnosis.status}")
        for reason in diagnosis.reasons:
            out.print(f"  - {reason.text}", markup=False)
    if any(reason.kind in STUCK for reason in diagnosis.reasons):
        raise typer.Exit(EXIT_FAILED)


async def _why(
    url: str, bus: str | None, server: str | None, token: str | None, run_id: str
) -> Diagnosis:
    async with reached(url, bus, server, token) as client:
        await known_run(client, run_id, server or url)
        return await client.why(run_id)


__all__ = ["why_cmd"]


def why_json(diagnosis: Diagnosis) -> dict[str, Any]:
    """`runs why --json`: the diagnosis with its times in ISO 8601, as the API writes them
    (a reason's ``data`` keeps its facts as they are)."""
    data = diagnosis.to_dict()
    data["checked_at"] = iso(data["checked_at"])
    for reason in data["reasons"]:
        reason["since"], reason["at"] = iso(reason["since"]), iso(reason["at"])
    return data
