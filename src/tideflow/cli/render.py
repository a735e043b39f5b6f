"""How runs, steps and histories look on the terminal and as JSON.

Text goes through rich (summaries on stderr, tables on stdout); JSON is one
object on stdout with times as ISO-8601 strings in UTC.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import orjson
from rich.markup import escape
from rich.table import Table

from tideflow.cli.common import err, iso, table_console
from tideflow.cli.waits import wait_text

if TYPE_CHECKING:
    from tideflow.runtime.result import RunResult
    from tideflow.runtime.shown import Attempt
    from tideflow.runtime.steplogs import AttemptLogs
    from tideflow.store.base import HistoryEntry, RunSummary

STATUS_STYLE = {
    "pending": "dim",
    "ready": "cyan",
    "running": "yellow",
    "retrying": "magenta",
    "waiting": "blue",
    "succeeded": "green",
    "failed": "red",
    "skipped": "dim",
    "cancelled": "red dim",
    "timed_out": "red",
    "compensating": "magenta",
    "compensated": "yellow",
    "compensation_failed": "bold red",
    "lost": "magenta",
}
EVENT_FIELDS = ("step_key", "attempt", "name", "timer_id", "child_run_id", "status", "reason")
"""Event fields worth a glance in `runs history` (the rest is in --json)."""


def styled(status: str) -> str:
    style = STATUS_STYLE.get(status)
    return f"[{style}]{escape(status)}[/]" if style else escape(status)


def error_text(error: dict[str, Any] | None) -> str:
    if not error:
        return ""
    return f"{error.get('type')}: {error.get('message')}"


# -- one run's result (run, runs resume) ------------------------------------------------


def print_result(result: RunResult) -> None:
    """Steps and status on stderr, the run's output as JSON on stdout."""
    colour = "green" if result.succeeded else "red"
    err.print(f"run {result.run_id} [bold {colour}]{escape(result.status)}[/]", markup=True)
    for key, step in result.steps.items():
        line = f"  {key:<32} {step.status:<10}"
        if step.attempts > 1:
            line += f" attempts={step.attempts}"
        if step.error:
            line += f"  {error_text(step.error)}"
        err.print(line, markup=False)
    if result.error:
        err.print(f"error: {error_text(result.error)}", markup=False)
    sys.stdout.buffer.write(
        orjson.dumps(result.output, option=orjson.OPT_INDENT_2, default=str) + b"\n"
    )
    sys.stdout.buffer.flush()


def results_table(results: Sequence[RunResult]) -> None:
    """One row per run (resume)."""
    table = Table()
    for name in ("run", "workflow", "status", "error"):
        table.add_column(name, no_wrap=name != "error")
    for result in results:
        table.add_row(
            result.run_id,
            escape(f"{result.workflow} {result.version}"),
            styled(result.status),
            escape(error_text(result.error)),
        )
    table_console().print(table)


# -- stored runs (runs list, runs show) ---------------------------------------------------


def summary_json(summary: RunSummary) -> dict[str, Any]:
    data = summary.to_dict()
    data["title"] = summary.title
    for key in ("created_at", "updated_at", "finished_at"):
        data[key] = iso(data[key])
    return data


def runs_table(runs: Sequence[RunSummary]) -> None:
    """One row per run; a "title" column when a run's definition has a ``title:``."""
    titled = any(run.title for run in runs)
    table = Table()
    for name in ("run", "workflow", *(("title",) if titled else ()), "version", "status"):
        table.add_column(name, no_wrap=True)
    table.add_column("created", no_wrap=True)
    table.add_column("finished", no_wrap=True)
    for run in runs:
        title = (escape(run.title or ""),) if titled else ()
        table.add_row(
            run.run_id,
            escape(run.workflow),
            *title,
            escape(run.version),
            styled(run.status),
            iso(run.created_at),
            iso(run.finished_at) or "",
        )
    table_console().print(table)


def run_json(
    summary: RunSummary,
    result: RunResult,
    waits: dict[str, dict[str, Any]],
    attempts: Sequence[Attempt] = (),
) -> dict[str, Any]:
    """`runs show --json`: the stored summary plus every step instance in its shown state
    (runtime/shown.py); a waiting step has ``waiting_for`` (cli/waits.py); ``attempts``
    with their outcomes."""
    data = {**summary_json(summary), **result.to_dict(), "status": summary.status}
    for key, state in _shown_steps(result).items():
        data["steps"][key]["status"] = state
    for key, wait in waits.items():
        if key in data["steps"]:
            data["steps"][key]["waiting_for"] = wait
    data["attempts"] = [attempt_json(attempt) for attempt in attempts]
    return data


def attempt_json(attempt: Attempt) -> dict[str, Any]:
    return {
        "step_key": attempt.step_key,
        "round": attempt.round,
        "attempt": attempt.attempt,
        "compensation": attempt.compensation,
        "started_at": iso(attempt.started_at),
        "ended_at": iso(attempt.ended_at),
        "outcome": attempt.outcome,
        "worker": attempt.worker,
        "error": attempt.error,
    }


def _shown_steps(result: RunResult) -> dict[str, str]:
    """Step key -> its shown state (a compensated step shows ``compensated``)."""
    from tideflow.runtime.shown import compensation_of, step_shown

    compensations = compensation_of((result.compensation or {}).get("steps"))
    return {
        key: step_shown(step.status, compensations.get(key)) for key, step in result.steps.items()
    }


def print_run(
    summary: RunSummary,
    result: RunResult,
    waits: dict[str, dict[str, Any]],
    attempts: Sequence[Attempt] = (),
) -> None:
    console = table_console()
    console.print(f"run      {summary.run_id}", markup=False)
    console.print(f"workflow {summary.workflow} {summary.version}", markup=False)
    if summary.title:
        console.print(f"title    {summary.title}", markup=False)
    console.print(f"status   {styled(summary.status)}", markup=True)
    console.print(f"created  {iso(summary.created_at)}", markup=False)
    console.print(f"updated  {iso(summary.updated_at)}", markup=False)
    if summary.finished_at is not None:
        console.print(f"finished {iso(summary.finished_at)}", markup=False)
    if summary.parent_run_id:
        console.print(f"parent   {summary.parent_run_id}", markup=False)
    if summary.error:
        console.print(f"error    {error_text(summary.error)}", markup=False)
    if summary.output is not None:
        output = orjson.dumps(summary.output, default=str).decode()
        console.print(f"output   {output}", markup=False)
    console.print(_steps_table(result, waits))
    if attempts:
        console.print(_attempts_table(attempts))


def _steps_table(result: RunResult, waits: dict[str, dict[str, Any]]) -> Table:
    """One row per step instance; the last column is its error, or what it waits for."""
    table = Table(title="steps", title_justify="left")
    last = "error / waiting for" if waits else "error"
    for name in ("step", "status", "attempts", last):
        table.add_column(
            name, no_wrap=name != last, justify="right" if name == "attempts" else "left"
        )
    states = _shown_steps(result)
    for key, step in result.steps.items():
        detail = wait_text(waits[key]) if key in waits else error_text(step.error)
        table.add_row(escape(key), styled(states[key]), str(step.attempts), escape(detail))
    return table


ATTEMPTS_SHOWN = 50
"""`runs show` lists the last so many attempts (--json: all of them)."""


def _attempts_table(attempts: Sequence[Attempt]) -> Table:
    """The last ``ATTEMPTS_SHOWN`` attempts, each with its outcome."""
    skipped = max(len(attempts) - ATTEMPTS_SHOWN, 0)
    title = "attempts" + (f" (the last {ATTEMPTS_SHOWN} of {len(attempts)})" if skipped else "")
    table = Table(title=title, title_justify="left")
    for name in ("step", "attempt", "outcome", "started", "ended", "error"):
        table.add_column(name, no_wrap=name != "error")
    for attempt in attempts[skipped:]:
        step = attempt.step_key + (" (compensation)" if attempt.compensation else "")
        table.add_row(
            escape(step),
            str(attempt.attempt),
            styled(attempt.outcome),
            iso(attempt.started_at) or "",
            iso(attempt.ended_at) or "",
            escape(attempt.error or ""),
        )
    return table


# -- history (runs history) ---------------------------------------------------------------


def history_json(run_id: str, entries: Sequence[HistoryEntry]) -> dict[str, Any]:
    return {"run_id": run_id, "events": [_entry_json(entry) for entry in entries]}


def _entry_json(entry: HistoryEntry) -> dict[str, Any]:
    event = dict(entry.event)
    for name in ("time", "started_at"):  # as the API writes them (api/models.py)
        if isinstance(event.get(name), int | float):
            event[name] = iso(event[name])
    return {
        "seq": entry.seq,
        "time": iso(entry.time),
        "kind": entry.kind,
        "event": event,
        "transitions": [{**t, "time": iso(t.get("time"))} for t in entry.transitions],
    }


def print_history(entries: Sequence[HistoryEntry]) -> None:
    console = table_console()
    for entry in entries:
        detail = _event_detail(entry.event)
        console.print(
            f"{entry.seq:>4}  {iso(entry.time)}  [bold]{entry.kind}[/]{escape(detail)}", markup=True
        )
        for tr in entry.transitions:
            console.print(escape(_transition_text(tr)), markup=True)


def _event_detail(event: dict[str, Any]) -> str:
    parts = [f"{key}={event[key]}" for key in EVENT_FIELDS if event.get(key) is not None]
    if event.get("error"):
        parts.append(f"error={error_text(event['error'])}")
    return ("  " + " ".join(parts)) if parts else ""


def _transition_text(tr: dict[str, Any]) -> str:
    text = f"        {tr.get('subject')}: {tr.get('old') or '-'} -> {tr.get('new')}"
    if tr.get("attempt"):
        text += f" (attempt {tr['attempt']})"
    if tr.get("cause"):
        text += f"  [{tr['cause']}]"
    return text


__all__ = [
    "history_json",
    "print_history",
    "print_result",
    "print_run",
    "results_table",
    "run_json",
    "runs_table",
    "summary_json",
]


def logs_json(run_id: str, step: str | None, rows: Sequence[AttemptLogs]) -> dict[str, Any]:
    """`runs logs --json`: the shape of ``GET /runs/{run_id}/logs``."""
    return {
        "run_id": run_id,
        "step": step,
        "attempts": [
            {
                "step_key": row.step_key,
                "round": row.round,
                "attempt": row.attempt,
                "compensation": row.compensation,
                "outcome": row.outcome,
                "ended_at": iso(row.time),
                "streams": {
                    name: {"text": stream.text, "truncated": stream.truncated}
                    for name, stream in row.streams.items()
                },
            }
            for row in rows
        ],
    }


def print_logs(rows: Sequence[AttemptLogs]) -> None:
    """Each attempt's header, then each stream it wrote, as it was written (plain text on
    stdout: no markup is read in it)."""
    out = sys.stdout
    if not rows:
        err.print("no attempt has ended yet", markup=False)
        return
    for row in rows:
        what = " (compensation)" if row.compensation else ""
        out.write(
            f"== {row.step_key}{what} attempt {row.attempt}"
            f"{f' round {row.round}' if row.round else ''}: {row.outcome} at {iso(row.time)}\n"
        )
        if not row.streams:
            out.write("   (wrote nothing)\n")
        for name, stream in row.streams.items():
            mark = f" (truncated: {stream.truncated} bytes before)" if stream.truncated else ""
            out.write(f"-- {name}{mark}\n")
            out.write(stream.text if stream.text.endswith("\n") else stream.text + "\n")
    out.flush()
