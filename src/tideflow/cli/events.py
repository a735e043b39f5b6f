"""`tideflow events list|replay`: the event gateway's dead letter (runtime/intake.py,
docs/events.md "Unmatched events"): the events no run took and no trigger started, kept
in the store, and delivered again on request."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from tideflow.cli.cluster import BusOption, connected
from tideflow.cli.common import (
    DEFAULT_STORE,
    EXIT_FAILED,
    JsonOption,
    StoreOption,
    err,
    iso,
    opened_store,
    out,
    run_async,
    table_console,
    write_json,
)

if TYPE_CHECKING:
    from tideflow.runtime.intake import Outcome
    from tideflow.store.base import GatewayEvent

events_app = typer.Typer(
    help="The events the gateway kept as unmatched (the dead letter): list and replay them.",
    no_args_is_help=True,
)


@events_app.command("list")
def list_cmd(
    limit: Annotated[
        int, typer.Option("--limit", min=1, max=1000, help="At most this many.")
    ] = 100,
    after: Annotated[
        str | None, typer.Option("--after", help="Start after this key (paging).")
    ] = None,
    as_json: JsonOption = False,
    store: StoreOption = DEFAULT_STORE,
) -> None:
    """List the unmatched events: those no run took and no trigger started, when they
    came or before their buffer ended, by key.

    --json prints {"events": [{"key", "id", "source", "type", "run_id",
    "received_at", "buffered_until", "reason", "payload"}]}.

    Examples:
      tideflow events list
      tideflow events list --json --store postgresql://tideflow@db/tideflow
    """
    events = [_shown(event) for event in run_async(_list(store, limit, after))]
    if as_json:
        write_json({"events": events})
        return
    table = Table("key", "type", "source", "id", "received", "reason")
    for row in events:
        keys = ("key", "type", "source", "id", "received_at", "reason")
        table.add_row(*(str(row[key] or "") for key in keys))
    table_console().print(table)


async def _list(url: str, limit: int, after: str | None) -> list[GatewayEvent]:
    async with opened_store(url) as store:
        return await store.unmatched_events(time.time(), limit=limit, after=after)


def _shown(event: GatewayEvent) -> dict[str, Any]:
    from tideflow.api.unmatched import view

    shown = view(event).model_dump()
    shown["received_at"] = iso(event.received_at)
    shown["buffered_until"] = iso(event.buffer_until)
    return shown


@events_app.command("replay")
def replay_cmd(
    key: Annotated[str, typer.Argument(help="The event's key (events list).", show_default=False)],
    as_json: JsonOption = False,
    store: StoreOption = DEFAULT_STORE,
    bus: BusOption = None,
) -> None:
    """Deliver an unmatched event again, as if it arrived now: to the run it names, or
    to the runs whose wait takes it and the triggers it starts. It is not buffered again.

    Exit 0 when it was delivered (it leaves the dead letter; "buffered": the run it
    names keeps it for its wait); exit 1 when still no run takes it (it stays, with the
    reason); exit 2 for a key that is not in the dead letter. --json prints {"key", "status", "delivered_to", "started", "reason"}.

    Examples:
      tideflow events replay ce:5f1c...
      tideflow events replay ce:5f1c... --store postgresql://db/tideflow --bus redis://mq:6379/0
    """
    outcome = run_async(_replay(store, bus, key))
    shown = {"key": key, **_outcome(outcome)}
    if as_json:
        write_json(shown)
    elif outcome.status != "unmatched":  # delivered, or buffered by the run it names
        runs = ", ".join([*outcome.delivered_to, *outcome.started])
        out.print(f"replayed {key}: {outcome.status} to {runs}", markup=False)
    else:
        err.print(f"replayed {key}: still unmatched ({outcome.reason})", markup=False)
    if outcome.status == "unmatched":
        raise typer.Exit(EXIT_FAILED)


def _outcome(outcome: Outcome) -> dict[str, Any]:
    return {
        "status": outcome.status,
        "delivered_to": outcome.delivered_to,
        "started": outcome.started,
        "reason": outcome.reason,
    }


async def _replay(url: str, bus: str | None, key: str) -> Outcome:
    from tideflow.runtime.intake import Intake

    async with connected(url, bus) as client:
        return await Intake(client, now=time.time).replay(key)
