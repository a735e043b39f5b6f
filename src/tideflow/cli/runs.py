"""`tideflow runs …`: the runs kept in a store.

Reading commands (list, show, history) never start workers or resume anything.
`cancel`, `signal` and `retry` deliver their event (runtime/delivery.py): to the
engine running on the store, if one is live, which applies it at once; else they
apply it to the store and return, and the work the event unlocks runs on the next
`tideflow resume` or `tideflow runs resume RUN` (both in cli/resume.py).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any, NoReturn

import typer
from rich.markup import escape

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
    opened_runtime,
    opened_store,
    parse_json_option,
    parse_since,
    resume_command,
    run_async,
    write_json,
)
from tideflow.cli.render import (
    history_json,
    print_history,
    print_run,
    run_json,
    runs_table,
    summary_json,
)
from tideflow.cli.resume import resume_run_cmd
from tideflow.cli.waits import waits_of
from tideflow.core.reopen import RETRYABLE
from tideflow.model.events import Event, RunRetried, SignalReceived
from tideflow.model.states import RunStatus
from tideflow.runtime.delivery import deliver
from tideflow.runtime.lease import describe
from tideflow.runtime.result import RunResult
from tideflow.runtime.runtime import Runtime
from tideflow.runtime.signals import refuse_undeclared_signal
from tideflow.store.base import HistoryEntry, Lease, RunFilter, RunPage, RunSummary

runs_app = typer.Typer(
    help="List, inspect, cancel, signal, retry and resume the runs kept in a store.",
    no_args_is_help=True,
)

RUN_STATUSES = [status.value for status in RunStatus]


# -- runs list ----------------------------------------------------------------------------


@runs_app.command("list")
def list_cmd(
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
    if status is not None and status not in RUN_STATUSES:
        raise fail_usage(f"--status {status!r} is not a run state: use {', '.join(RUN_STATUSES)}")
    after = parse_since(since, time.time()) if since is not None else None
    filter = RunFilter(status=status, workflow=workflow, created_after=after)
    page = run_async(_list(store, filter, limit, cursor))
    if as_json:
        write_json(
            {"runs": [summary_json(run) for run in page.runs], "next_cursor": page.next_cursor}
        )
        return
    if not page.runs:
        err.print(f"no runs in {display_url(store)} match", markup=False)
        return
    runs_table(page.runs)
    if page.next_cursor:
        err.print(f"more: --cursor {page.next_cursor}", markup=False)


async def _list(url: str, filter: RunFilter, limit: int, cursor: str | None) -> RunPage:
    async with opened_store(url) as store:
        return await store.list_runs(filter, limit=limit, cursor=cursor)


# -- runs show ----------------------------------------------------------------------------


@runs_app.command("show")
def show_cmd(
    run_id: RunArgument, as_json: JsonOption = False, store: StoreOption = DEFAULT_STORE
) -> None:
    """Show a run: its summary and every step instance (status, attempts, error).

    A waiting step shows what it waits for: a `wait` its signal name, `match` and
    when its timeout fires (and whether the step then fails or continues); a
    `sleep` until when. --json adds it to the step as "waiting_for":
    {"signal", "match"?, "timeout_at"?, "timeout_action"?} or {"sleep_until"}.

    Examples:
      tideflow runs show 3f2a9c...
      tideflow runs show 3f2a9c... --json
    """
    summary, result, waits = run_async(_show(store, run_id))
    if as_json:
        write_json(run_json(summary, result, waits))
    else:
        print_run(summary, result, waits)


async def _show(url: str, run_id: str) -> tuple[RunSummary, RunResult, dict[str, dict[str, Any]]]:
    async with opened_runtime(url, recover=False, workers=0) as rt:
        summary = await known_run(rt.store, run_id, url)
        state = await rt.state(run_id)
        waits = waits_of(state, await rt.store.get_plan(state.plan_hash))
        return summary, await rt.result(run_id), waits


# -- runs history -------------------------------------------------------------------------


@runs_app.command("history")
def history_cmd(
    run_id: RunArgument, as_json: JsonOption = False, store: StoreOption = DEFAULT_STORE
) -> None:
    """Show everything that happened to a run, event by event.

    Each event comes with the state transitions it caused; times are ISO-8601 (UTC).

    --json prints {"run_id": ..., "events": [{"seq", "time", "kind", "event",
    "transitions": [{"subject", "old", "new", "time", "cause", "attempt"}]}]}.

    Examples:
      tideflow runs history 3f2a9c...
      tideflow runs history 3f2a9c... --json | jq '.events[].kind'
    """
    entries = run_async(_history(store, run_id))
    if as_json:
        write_json(history_json(run_id, entries))
    else:
        print_history(entries)


async def _history(url: str, run_id: str) -> list[HistoryEntry]:
    async with opened_store(url) as store:
        await known_run(store, run_id, url)
        return list(await store.history(run_id))


# -- runs cancel / runs signal --------------------------------------------------------------


@runs_app.command("cancel")
def cancel_cmd(
    run_id: RunArgument,
    reason: Annotated[
        str, typer.Option("--reason", help="Recorded in the run's history.")
    ] = "cancelled with tideflow runs cancel",
    store: StoreOption = DEFAULT_STORE,
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
    applied = run_async(
        _apply(
            store,
            run_id,
            lambda rt: _cancel_event(rt, run_id, reason),
            "cancel",
            CANCELLABLE,
        )
    )
    _report_applied(store, run_id, applied)


async def _cancel_event(rt: Runtime, run_id: str, reason: str) -> Event:
    return rt.cancel_event(run_id, reason)


CANCELLABLE = frozenset({RunStatus.PENDING.value, RunStatus.RUNNING.value})


@runs_app.command("signal")
def signal_cmd(
    run_id: RunArgument,
    name: Annotated[
        str, typer.Argument(help="The signal name a `wait` step waits for.", show_default=False)
    ],
    payload: Annotated[
        str | None,
        typer.Option("--payload", "-p", help="The signal's payload: JSON text, or @file.json."),
    ] = None,
    store: StoreOption = DEFAULT_STORE,
) -> None:
    """Send a signal to a run.

    A `wait` for NAME whose `match` holds takes it (else it is kept for a later
    wait). When an engine runs on the store (`tideflow run` or `resume` in
    another shell), the signal goes to it and the steps it unlocks run at once;
    otherwise it is recorded in the store and they run on the next
    `tideflow resume` or `tideflow runs resume RUN`. Exit 1 when the run had already ended; exit 2
    when no wait step of the run's workflow waits for NAME (the error lists the
    names it does wait for).

    Examples:
      tideflow runs signal 3f2a9c... approval --payload '{"approved": true, "by": "kim"}'
      tideflow runs signal 3f2a9c... approval -p @answer.json
    """
    value = parse_json_option(payload, "--payload")
    applied = run_async(
        _apply(
            store,
            run_id,
            lambda rt: _signal_event(rt, run_id, name, value),
            "signal",
            SIGNALLABLE,
        )
    )
    _report_applied(store, run_id, applied)


SIGNALLABLE = frozenset(status.value for status in RunStatus) - TERMINAL_STATUSES


async def _signal_event(rt: Runtime, run_id: str, name: str, payload: Any) -> Event:
    state = await rt.state(run_id)
    refuse_undeclared_signal(await rt.store.get_plan(state.plan_hash), run_id, name)
    return SignalReceived(
        event_id=rt.new_event_id(), run_id=run_id, time=rt.clock.now(), name=name, payload=payload
    )


async def _apply(
    url: str,
    run_id: str,
    make: Callable[[Runtime], Awaitable[Event]],
    action: str,
    allowed: frozenset[str],
    refused: Callable[[str], str] | None = None,
) -> Applied:
    """Deliver one event to a run (to the live engine, or applied here without workers);
    what became of it. A run whose status is not ``allowed`` is left alone: exit 1, with
    ``refused(status)`` as the message when given."""
    async with opened_runtime(url, recover=False, workers=0) as rt:
        summary = await known_run(rt.store, run_id, url)
        if summary.status not in allowed:
            if refused is not None:
                err.print(refused(summary.status), markup=False)
                raise typer.Exit(EXIT_FAILED)
            _nothing_to_do(run_id, summary.status, action)
        engine = await deliver(rt, await make(rt))
        return Applied(engine=engine, status=(await rt.store.get_run(run_id)).status)


@dataclass(frozen=True, slots=True)
class Applied:
    engine: Lease | None
    """The live engine the event went to; None when it was applied by this command."""
    status: str


def _nothing_to_do(run_id: str, status: str, action: str) -> NoReturn:
    where = f"has already ended ({status})" if status in TERMINAL_STATUSES else f"is {status}"
    err.print(f"run {run_id} {where}: nothing to {action}", markup=False)
    raise typer.Exit(EXIT_FAILED)


# -- runs retry -----------------------------------------------------------------------------


@runs_app.command("retry")
def retry_cmd(
    run_id: RunArgument,
    reason: Annotated[
        str, typer.Option("--reason", help="Recorded in the run's history.")
    ] = "retried with tideflow runs retry",
    store: StoreOption = DEFAULT_STORE,
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
    applied = run_async(
        _apply(
            store,
            run_id,
            lambda rt: _retry_event(rt, run_id, reason),
            "retry",
            RETRYABLE_STATUSES,
            lambda status: (
                f"run {run_id} is {status}: only a failed or timed-out run can be retried; "
                "nothing to retry"
            ),
        )
    )
    _report_applied(store, run_id, applied)


async def _retry_event(rt: Runtime, run_id: str, reason: str) -> Event:
    return RunRetried(event_id=rt.new_event_id(), run_id=run_id, time=rt.clock.now(), reason=reason)


RETRYABLE_STATUSES = frozenset(status.value for status in RETRYABLE)


def _report_applied(url: str, run_id: str, applied: Applied) -> None:
    if applied.engine is not None:
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


__all__ = ["runs_app"]
