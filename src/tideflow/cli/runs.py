"""`tideflow runs …`: the runs kept in a store.

Every command goes through the client (tideflow/client.py). Reading commands (list,
show, history) never start workers or resume anything. `cancel`, `signal` and
`retry` record their event in the store and return: the work the event unlocks
runs on the next `tideflow resume` or `tideflow runs resume RUN` (both in
cli/resume.py). With ``--bus`` (or ``TIDEFLOW_BUS``) every command is a cluster client
instead (cli/cluster.py): events go onto the bus for the `tideflow server`, reads come
from the store; `runs start` and `runs wait` are in cli/runs_start.py.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.markup import escape

from tideflow.cli.cluster import BusOption, reached
from tideflow.cli.common import (
    DEFAULT_STORE,
    EXIT_FAILED,
    TERMINAL_STATUSES,
    JsonOption,
    RunArgument,
    StoreOption,
    display_url,
    err,
    fail_usage,
    known_run,
    opened_store,
    parse_json_option,
    parse_since,
    resume_command,
    run_async,
    write_json,
)
from tideflow.cli.remote import ServerOption, TokenOption, check_server
from tideflow.cli.render import (
    history_json,
    logs_json,
    print_history,
    print_logs,
    print_run,
    run_json,
    runs_table,
    summary_json,
)
from tideflow.cli.resume import resume_run_cmd
from tideflow.cli.runs_start import start_cmd, wait_cmd
from tideflow.cli.waits import waits_of, waits_of_reasons
from tideflow.cli.why import why_cmd
from tideflow.model.states import RUN_RETRYABLE, RunStatus

if TYPE_CHECKING:
    from tideflow.client import Client
    from tideflow.remote_http import HttpClient
    from tideflow.runtime.result import RunResult
    from tideflow.runtime.shown import Attempt
    from tideflow.store.base import HistoryEntry, Lease, RunFilter, RunPage, RunSummary

runs_app = typer.Typer(
    help="List, inspect, cancel, signal, retry and resume the runs kept in a store.",
    no_args_is_help=True,
)

RUN_STATUSES = [status.value for status in RunStatus]


# -- runs list ----------------------------------------------------------------------------


@runs_app.command("list")
def list_cmd(
    ctx: typer.Context,
    status: Annotated[
        str | None,
        typer.Option("--status", help=f"Only runs in this state: {', '.join(RUN_STATUSES)}."),
    ] = None,
    workflow: Annotated[
        str | None, typer.Option("--workflow", help="Only runs of this workflow (by name).")
    ] = None,
    since: Annotated[
        str | None,
        typer.Option(
            "--since",
            metavar="DURATION|ISO",
            help="Only runs created since: a duration back from now (30m, 2h, 7d) or an ISO-8601 time (UTC unless it says otherwise).",
        ),
    ] = None,
    limit: Annotated[
        int, typer.Option("--limit", min=1, max=1000, help="At most this many runs (one page).")
    ] = 50,
    cursor: Annotated[
        str | None,
        typer.Option("--cursor", help="The next page: the next_cursor a previous page printed."),
    ] = None,
    as_json: JsonOption = False,
    store: StoreOption = DEFAULT_STORE,
    bus: BusOption = None,
    server: ServerOption = None,
    token: TokenOption = None,
) -> None:
    """List runs, newest first, one page at a time.

    --json prints {"runs": [...], "next_cursor": ...}; next_cursor is null on the
    last page.

    Examples:
      tideflow runs list
      tideflow runs list --status failed --since 24h
      tideflow runs list --workflow order-fulfillment --limit 20 --json
      tideflow runs list --cursor MTcx... --store sqlite:///orders.db
    """
    check_server(ctx, server)
    if status is not None and status not in RUN_STATUSES:
        raise fail_usage(f"--status {status!r} is not a run state: use {', '.join(RUN_STATUSES)}")
    from tideflow.store.base import RunFilter

    after = parse_since(since, time.time()) if since is not None else None
    filter = RunFilter(status=status, workflow=workflow, created_after=after)
    if as_json or bus or server:
        page = run_async(_list(store, bus, server, token, filter, limit, cursor))
    else:
        page = run_async(_table_page(store, filter, limit, cursor))
    if as_json:
        write_json(
            {"runs": [summary_json(run) for run in page.runs], "next_cursor": page.next_cursor}
        )
        return
    if not page.runs:
        err.print(f"no runs in {display_url(server or store)} match", markup=False)
        return
    runs_table(page.runs)
    if page.next_cursor:
        err.print(f"more: --cursor {page.next_cursor}", markup=False)


async def _list(
    url: str,
    bus: str | None,
    server: str | None,
    token: str | None,
    filter: RunFilter,
    limit: int,
    cursor: str | None,
) -> RunPage:
    async with reached(url, bus, server, token) as client:
        return await client.list(filter, limit=limit, cursor=cursor)


async def _table_page(url: str, filter: RunFilter, limit: int, cursor: str | None) -> RunPage:
    """The page as the table shows it, read from the store alone: no engine is started
    and no definition compiled. The table shows each run's definition title (read from
    the stored definitions, as ``Client.list`` reads it from the plan) and no output: the
    outputs are left out, they would need their plans to be masked (``--json`` has them)."""
    from dataclasses import replace

    async with opened_store(url) as store:
        page = await store.list_runs(filter, limit=limit, cursor=cursor)
        titles = (
            {(d.name, d.version): d.title for d in await store.list_definitions()}
            if page.runs
            else {}
        )
    runs = [
        replace(run, output=None, title=titles.get((run.workflow, run.version)))
        for run in page.runs
    ]
    return replace(page, runs=runs)


# -- runs show ----------------------------------------------------------------------------


@runs_app.command("show")
def show_cmd(
    ctx: typer.Context,
    run_id: RunArgument,
    as_json: JsonOption = False,
    store: StoreOption = DEFAULT_STORE,
    bus: BusOption = None,
    server: ServerOption = None,
    token: TokenOption = None,
) -> None:
    """Show a run: its summary, every step instance (status, attempts, error) and its
    attempts, each with its outcome.

    A step whose compensation ran shows it: `compensating`, `compensated` or
    `compensation_failed`. An attempt shows `running`, or how it ended:
    succeeded, failed, cancelled, lost or timed_out. --json adds "attempts":
    [{"step_key", "round", "attempt", "compensation", "started_at", "ended_at",
    "outcome", "worker", "error"}].

    A waiting step shows what it waits for: a `wait` its signal name, `match` and
    when its timeout fires (and whether the step then fails or continues); a
    `sleep` until when. --json adds it to the step as "waiting_for":
    {"signal", "match"?, "timeout_at"?, "timeout_action"?} or {"sleep_until"}.

    Examples:
      tideflow runs show 3f2a9c...
      tideflow runs show 3f2a9c... --json
    """
    check_server(ctx, server)
    summary, result, waits, attempts = run_async(_show(store, bus, server, token, run_id))
    if as_json:
        write_json(run_json(summary, result, waits, attempts))
    else:
        print_run(summary, result, waits, attempts)


async def _show(
    url: str, bus: str | None, server: str | None, token: str | None, run_id: str
) -> tuple[RunSummary, RunResult, dict[str, dict[str, Any]], list[Attempt]]:
    from tideflow.remote_http import HttpClient
    from tideflow.runtime.shown import attempts_of

    async with reached(url, bus, server, token) as client:
        summary = await known_run(client, run_id, server or url)
        if isinstance(client, HttpClient):
            waits = waits_of_reasons(await client.why(run_id))
        else:
            waits = waits_of(await client.state(run_id), await client.plan(run_id))
        attempts = attempts_of(await client.history(run_id))
        return summary, await client.get(run_id), waits, attempts


# -- runs history -------------------------------------------------------------------------


@runs_app.command("history")
def history_cmd(
    ctx: typer.Context,
    run_id: RunArgument,
    as_json: JsonOption = False,
    store: StoreOption = DEFAULT_STORE,
    bus: BusOption = None,
    server: ServerOption = None,
    token: TokenOption = None,
) -> None:
    """Show everything that happened to a run, event by event.

    Each event comes with the state transitions it caused; times are ISO-8601 (UTC).

    --json prints {"run_id": ..., "events": [{"seq", "time", "kind", "event",
    "transitions": [{"subject", "old", "new", "time", "cause", "attempt"}]}]}.

    Examples:
      tideflow runs history 3f2a9c...
      tideflow runs history 3f2a9c... --json | jq '.events[].kind'
    """
    check_server(ctx, server)
    entries = run_async(_history(store, bus, server, token, run_id))
    if as_json:
        write_json(history_json(run_id, entries))
    else:
        print_history(entries)


async def _history(
    url: str, bus: str | None, server: str | None, token: str | None, run_id: str
) -> list[HistoryEntry]:
    async with reached(url, bus, server, token) as client:
        await known_run(client, run_id, server or url)
        return list(await client.history(run_id))


# -- runs logs ----------------------------------------------------------------------------


@runs_app.command("logs")
def logs_cmd(
    ctx: typer.Context,
    run_id: RunArgument,
    step: Annotated[
        str | None,
        typer.Argument(
            metavar="[STEP]",
            help="A step instance's key (items[2]/charge) or a plan step's id (charge: every "
            "instance); every step when left out.",
            show_default=False,
        ),
    ] = None,
    as_json: JsonOption = False,
    store: StoreOption = DEFAULT_STORE,
    bus: BusOption = None,
    server: ServerOption = None,
    token: TokenOption = None,
) -> None:
    """Show what a run's steps wrote: stdout, stderr and logging records, per attempt.

    Each ended attempt keeps the last 64 KiB of each stream ("truncated": bytes dropped
    before); secrets the attempt resolved are masked. Attempts are listed in the order
    they ended.

    --json prints {"run_id", "step", "attempts": [{"step_key", "round", "attempt",
    "compensation", "outcome", "ended_at", "streams": {"stdout"|"stderr"|"log":
    {"text", "truncated"}}}]}.

    Examples:
      tideflow runs logs 3f2a9c...
      tideflow runs logs 3f2a9c... charge --json | jq -r '.attempts[-1].streams.log.text'
    """
    from tideflow.runtime.steplogs import logs_of

    check_server(ctx, server)
    entries = run_async(_history(store, bus, server, token, run_id))
    rows = logs_of(entries, step)
    if step is not None and not rows:
        _no_step_logs(run_id, step, entries)
    if as_json:
        write_json(logs_json(run_id, step, rows))
    else:
        print_logs(rows)


def _no_step_logs(run_id: str, step: str, entries: list[HistoryEntry]) -> NoReturn:
    keys = sorted({str(e.event["step_key"]) for e in entries if "step_key" in e.event})
    known = ", ".join(keys) if keys else "none yet"
    raise fail_usage(
        f"run {run_id} has no ended attempt of step {step!r} (steps with attempts: {known})",
        type="NotFound",
        hint="name a step key or a plan step id, or leave STEP out for every step",
    )


# -- runs cancel / runs signal --------------------------------------------------------------


@runs_app.command("cancel")
def cancel_cmd(
    ctx: typer.Context,
    run_id: RunArgument,
    reason: Annotated[
        str, typer.Option("--reason", help="Recorded in the run's history.")
    ] = "cancelled with tideflow runs cancel",
    store: StoreOption = DEFAULT_STORE,
    bus: BusOption = None,
    server: ServerOption = None,
    token: TokenOption = None,
) -> None:
    """Cancel a run.

    When an engine runs on the store (`tideflow run` or `resume` in another
    shell), the cancellation goes to it and it stops the run at once. Otherwise
    it is recorded in the store: running steps are cancelled, and with
    `on_failure: compensate` the steps that completed are compensated, newest
    first, on the next `tideflow resume` or `tideflow runs resume RUN`; the run
    then ends `cancelled` (or `compensation_failed`). Exit 1, changing nothing,
    when the run had already ended or is compensating.

    Examples:
      tideflow runs cancel 3f2a9c...
      tideflow runs cancel 3f2a9c... --reason "duplicate order"
    """
    check_server(ctx, server)
    applied = run_async(
        _apply(
            Target(store, bus, server, token),
            run_id,
            lambda client: client.cancel(run_id, reason),
            "cancel",
            CANCELLABLE,
        )
    )
    _report_applied(store, run_id, applied)


CANCELLABLE = frozenset({RunStatus.PENDING.value, RunStatus.RUNNING.value})


@runs_app.command("signal")
def signal_cmd(
    ctx: typer.Context,
    run_id: RunArgument,
    name: Annotated[
        str, typer.Argument(help="The signal name a `wait` step waits for.", show_default=False)
    ],
    payload: Annotated[
        str | None,
        typer.Option("--payload", "-p", help="The signal's payload: JSON text, or @file.json."),
    ] = None,
    signal_id: Annotated[
        str | None,
        typer.Option(
            "--signal-id",
            help="An id for this signal (such as the event id of the webhook it comes "
            "from): the same id sent again is applied once. Default: a new id.",
            show_default=False,
        ),
    ] = None,
    store: StoreOption = DEFAULT_STORE,
    bus: BusOption = None,
    server: ServerOption = None,
    token: TokenOption = None,
) -> None:
    """Send a signal to a run.

    A `wait` for NAME whose `match` holds takes it (else it is kept for a later
    wait, for as long as that wait's `buffer` says). With --signal-id, a second
    send of the same id (a retried delivery) changes nothing. When an engine runs on the store (`tideflow run` or `resume` in
    another shell), the signal goes to it and the steps it unlocks run at once;
    otherwise it is recorded in the store and they run on the next
    `tideflow resume` or `tideflow runs resume RUN`. Exit 1 when the run had already ended; exit 2
    when no wait step of the run's workflow waits for NAME (the error lists the
    names it does wait for).

    Examples:
      tideflow runs signal 3f2a9c... approval --payload '{"approved": true, "by": "kim"}'
      tideflow runs signal 3f2a9c... approval -p @answer.json
      tideflow runs signal 3f2a9c... paid -p @event.json --signal-id evt_1Nx2
    """
    value = parse_json_option(payload, "--payload")
    if signal_id is not None and not signal_id.strip():
        raise fail_usage("--signal-id cannot be empty: leave it out for a new id")
    check_server(ctx, server)
    applied = run_async(
        _apply(
            Target(store, bus, server, token),
            run_id,
            lambda client: client.signal(run_id, name, value, signal_id=signal_id),
            "signal",
            SIGNALLABLE,
        )
    )
    _report_applied(store, run_id, applied)


SIGNALLABLE = frozenset(status.value for status in RunStatus) - TERMINAL_STATUSES


@dataclass(frozen=True, slots=True)
class Target:
    """Where a command goes: the store (and the cluster's bus), or a server's HTTP API."""

    store: str
    bus: str | None
    server: str | None
    token: str | None


async def _apply(
    target: Target,
    run_id: str,
    act: Callable[[Client | HttpClient], Awaitable[object]],
    action: str,
    allowed: frozenset[str],
    refused: Callable[[str], str] | None = None,
) -> Applied:
    """Deliver one action on a run: to the engine live on the store, or recorded for the
    next one (runtime/delivery.py); what became of it. A run whose status is not
    ``allowed`` is left alone: exit 1, with ``refused(status)`` as the message if given."""
    url = target.server or target.store
    async with reached(target.store, target.bus, target.server, target.token) as client:
        summary = await known_run(client, run_id, url)
        if summary.status not in allowed:
            if refused is not None:
                err.print(refused(summary.status), markup=False)
                raise typer.Exit(EXIT_FAILED)
            _nothing_to_do(run_id, summary.status, action)
        await act(client)
        status = (await client.summary(run_id)).status
        return Applied(
            engine=client.delivered_to, status=status, bus=target.bus, server=target.server
        )


@dataclass(frozen=True, slots=True)
class Applied:
    engine: Lease | None
    """The live engine the event went to; None when it was recorded by this command."""
    status: str
    bus: str | None = None
    """The cluster's bus it was published on (the server applies it)."""
    server: str | None = None
    """The server's HTTP API it was sent to (the server applies it)."""


def _nothing_to_do(run_id: str, status: str, action: str) -> NoReturn:
    where = f"has already ended ({status})" if status in TERMINAL_STATUSES else f"is {status}"
    err.print(f"run {run_id} {where}: nothing to {action}", markup=False)
    raise typer.Exit(EXIT_FAILED)


# -- runs retry -----------------------------------------------------------------------------


@runs_app.command("retry")
def retry_cmd(
    ctx: typer.Context,
    run_id: RunArgument,
    reason: Annotated[
        str, typer.Option("--reason", help="Recorded in the run's history.")
    ] = "retried with tideflow runs retry",
    store: StoreOption = DEFAULT_STORE,
    bus: BusOption = None,
    server: ServerOption = None,
    token: TokenOption = None,
) -> None:
    """Retry a failed or timed-out run from the steps that did not succeed.

    Steps that succeeded keep their outputs and do not run again; failed,
    cancelled and skipped steps are decided again, each with a fresh attempt
    count. An engine running on the store runs them at once; otherwise the retry
    is recorded and they run on the next `tideflow resume` or
    `tideflow runs resume RUN`.
    Exit 1, changing nothing, when the run is not failed or timed out.

    Examples:
      tideflow runs retry 3f2a9c...
      tideflow runs retry 3f2a9c... --reason "payment service is back"
      tideflow runs resume 3f2a9c...
    """
    check_server(ctx, server)
    applied = run_async(
        _apply(
            Target(store, bus, server, token),
            run_id,
            lambda client: client.retry(run_id, reason),
            "retry",
            RETRYABLE_STATUSES,
            lambda status: (
                f"run {run_id} is {status}: only a failed or timed-out run can be retried; "
                "nothing to retry"
            ),
        )
    )
    _report_applied(store, run_id, applied)


RETRYABLE_STATUSES = frozenset(status.value for status in RUN_RETRYABLE)


def _report_applied(url: str, run_id: str, applied: Applied) -> None:
    if applied.server:
        err.print(
            f"sent to run {run_id} through {display_url(applied.server)} (now {applied.status})",
            markup=False,
        )
        return
    if applied.bus:
        err.print(
            f"published for run {run_id} on {display_url(applied.bus)}: the cluster's server "
            f"applies it (now {applied.status})",
            markup=False,
        )
        return
    if applied.engine is not None:
        from tideflow.runtime.lease import describe

        err.print(
            f"delivered to run {run_id}: {describe(applied.engine, time.time())} applies it now",
            markup=False,
        )
        return
    status = applied.status
    if status in TERMINAL_STATUSES:
        err.print(f"run {run_id} is now {escape(status)}", markup=True)
        return
    err.print(
        f"recorded for run {run_id} (now {status}). What it unlocks runs on the next "
        f"{resume_command(url)} or {resume_command(url, run_id)}.",
        markup=False,
    )


runs_app.command("resume")(resume_run_cmd)
runs_app.command("start")(start_cmd)
runs_app.command("wait")(wait_cmd)
runs_app.command("why")(why_cmd)


__all__ = ["runs_app"]
