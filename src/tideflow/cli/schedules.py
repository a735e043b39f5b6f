"""`tideflow schedules list|pause|resume|trigger|delete`: the schedules of the store's
workflows (docs/schedules.md). A schedule is made by registering a definition with
``schedule:``; these commands read and steer it by workflow name and schedule id."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from tideflow.cli.cluster import BusOption, reached
from tideflow.cli.common import (
    DEFAULT_STORE,
    JsonOption,
    StoreOption,
    out,
    parse_json_option,
    run_async,
    table_console,
    write_json,
)
from tideflow.cli.remote import ServerOption, TokenOption, check_server

schedules_app = typer.Typer(
    help="List, create, pause, resume, trigger and delete the schedules of workflows.",
    no_args_is_help=True,
)

WorkflowArgument = Annotated[str, typer.Argument(help="The workflow name.", show_default=False)]
IdArgument = Annotated[
    str,
    typer.Argument(
        metavar="ID", help="The schedule id (`default` for a lone schedule).", show_default=False
    ),
]
Target = tuple[str, str | None, str | None, str | None]
"""(store, bus, server, token): where the command acts."""


@schedules_app.command("list")
def list_cmd(
    ctx: typer.Context,
    workflow: Annotated[
        str | None, typer.Option("--workflow", help="Only this workflow's schedules.")
    ] = None,
    as_json: JsonOption = False,
    store: StoreOption = DEFAULT_STORE,
    bus: BusOption = None,
    server: ServerOption = None,
    token: TokenOption = None,
) -> None:
    """List the schedules with their next fire times (UTC), by workflow then id.

    Examples:
      tideflow schedules list
      tideflow schedules list --workflow daily-report --json
    """
    check_server(ctx, server)
    rows = run_async(_call((store, bus, server, token), "list"))
    if as_json:
        write_json({"schedules": rows})
        return
    table = Table("workflow", "id", "when", "overlap", "catchup", "state", "next fire", "last run")
    for row in rows:
        spec = row["spec"]
        when = (
            f"cron {spec['cron']} ({spec['timezone']})"
            if "cron" in spec
            else f"every {spec['every']:g}s"
        )
        state = "paused" if row["paused"] else "active"
        next_fire = row["next_fire_at"] or ("-" if row["paused"] else "ended")
        table.add_row(
            row["workflow"],
            row["id"],
            when,
            spec["overlap"],
            spec["catchup"],
            state,
            next_fire,
            row["last_run_id"] or "-",
        )
    table_console().print(table)


@schedules_app.command("create")
def create_cmd(
    ctx: typer.Context,
    workflow: WorkflowArgument,
    schedule: Annotated[
        str,
        typer.Argument(
            metavar="SCHEDULE",
            help="One schedule as `schedule:` takes it, with an id: JSON text, or @file.json.",
            show_default=False,
        ),
    ],
    store: StoreOption = DEFAULT_STORE,
    bus: BusOption = None,
    server: ServerOption = None,
    token: TokenOption = None,
) -> None:
    """Add a schedule to a registered workflow, besides its definition's: it starts the
    workflow's highest active version, and registering versions leaves it alone.

    Examples:
      tideflow schedules create daily-report '{"id": "eod", "cron": "0 18 * * 1-5"}'
    """
    check_server(ctx, server)
    spec = parse_json_option(schedule, "SCHEDULE")
    row = run_async(_call((store, bus, server, token), "create", workflow, spec))
    out.print(f"{workflow} {row['id']}: created, next fire {row['next_fire_at']}", markup=False)


@schedules_app.command("pause")
def pause_cmd(
    ctx: typer.Context,
    workflow: WorkflowArgument,
    schedule_id: IdArgument,
    store: StoreOption = DEFAULT_STORE,
    bus: BusOption = None,
    server: ServerOption = None,
    token: TokenOption = None,
) -> None:
    """Pause a schedule: it starts no run until resumed.

    Examples:
      tideflow schedules pause daily-report default
    """
    check_server(ctx, server)
    changed = run_async(_call((store, bus, server, token), "pause", workflow, schedule_id))
    _report(workflow, schedule_id, "paused", changed)


@schedules_app.command("resume")
def resume_cmd(
    ctx: typer.Context,
    workflow: WorkflowArgument,
    schedule_id: IdArgument,
    store: StoreOption = DEFAULT_STORE,
    bus: BusOption = None,
    server: ServerOption = None,
    token: TokenOption = None,
) -> None:
    """Resume a paused schedule from its next slot (the slots that passed while it was
    paused start nothing).

    Examples:
      tideflow schedules resume daily-report default
    """
    check_server(ctx, server)
    changed = run_async(_call((store, bus, server, token), "resume", workflow, schedule_id))
    _report(workflow, schedule_id, "resumed", changed)


@schedules_app.command("trigger")
def trigger_cmd(
    ctx: typer.Context,
    workflow: WorkflowArgument,
    schedule_id: IdArgument,
    store: StoreOption = DEFAULT_STORE,
    bus: BusOption = None,
    server: ServerOption = None,
    token: TokenOption = None,
) -> None:
    """Start the schedule's run now (inputs.scheduled_at: now), whatever its overlap and
    even when paused; print the run id. Its next slot is unchanged.

    Examples:
      tideflow schedules trigger daily-report default
    """
    check_server(ctx, server)
    out.print(
        run_async(_call((store, bus, server, token), "trigger", workflow, schedule_id)),
        markup=False,
    )


@schedules_app.command("delete")
def delete_cmd(
    ctx: typer.Context,
    workflow: WorkflowArgument,
    schedule_id: IdArgument,
    store: StoreOption = DEFAULT_STORE,
    bus: BusOption = None,
    server: ServerOption = None,
    token: TokenOption = None,
) -> None:
    """Delete a schedule: it starts no run any more. Registering the same definition
    version again does not bring it back; a new version with the schedule does.

    Examples:
      tideflow schedules delete daily-report default
    """
    check_server(ctx, server)
    run_async(_call((store, bus, server, token), "delete", workflow, schedule_id))
    out.print(f"{workflow} {schedule_id}: deleted", markup=False)


def _report(workflow: str, schedule_id: str, what: str, changed: bool) -> None:
    tail = "" if changed else " (it was already)"
    out.print(f"{workflow} {schedule_id}: {what}{tail}", markup=False)


async def _call(target: Target, action: str, *args: Any) -> Any:
    """Do ``action`` through the client the target reaches (the store's, the cluster's,
    or the server's HTTP API)."""
    from tideflow.client import Client
    from tideflow.runtime.schedules import schedule_data

    store, bus, server, token = target
    async with reached(store, bus, server, token) as client:
        if not isinstance(client, Client):
            return await _remote(client, action, *args)
        if action == "list":
            return [schedule_data(row) for row in await client.schedules()]
        if action == "create":
            return schedule_data(await client.create_schedule(*args))
        if action == "pause":
            return await client.pause_schedule(*args)
        if action == "resume":
            return await client.resume_schedule(*args)
        if action == "trigger":
            return await client.trigger_schedule(*args)
        return await client.delete_schedule(*args)


async def _remote(client: Any, action: str, *args: Any) -> Any:
    """The same over HTTP (remote_http.HttpClient's schedule methods)."""
    method = {
        "list": "schedules",
        "create": "create_schedule",
        "pause": "pause_schedule",
        "resume": "resume_schedule",
        "trigger": "trigger_schedule",
        "delete": "delete_schedule",
    }[action]
    return await getattr(client, method)(*args)


__all__ = ["schedules_app"]
