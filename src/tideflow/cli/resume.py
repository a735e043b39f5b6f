"""`tideflow resume` and `tideflow runs resume RUN`: drive a store's unfinished runs.

Both start a runtime with recovery, which resumes every unfinished run of the
store (outbox relayed, timers re-armed, tasks whose result was never recorded
re-dispatched with the same idempotency key), then wait: for all of those runs,
or for one. A run reported as ended has had its end committed to the store.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from tideflow.cli.common import (
    DEFAULT_STORE,
    EXIT_FAILED,
    JsonOption,
    RunArgument,
    StoreOption,
    WaitForEngineOption,
    display_url,
    err,
    interrupted_message,
    known_run,
    one_line,
    opened_runtime,
    run_async,
    store_exists,
    use_working_directory_modules,
    write_json,
)
from tideflow.cli.render import print_result, results_table
from tideflow.errors import NotFound, TideflowError

if TYPE_CHECKING:
    from tideflow.client import Client
    from tideflow.model.events import Transition
    from tideflow.model.run import RunState
    from tideflow.runtime.result import RunResult
    from tideflow.store.base import RunSummary

WorkersOption = Annotated[int, typer.Option("--workers", min=1, help="Concurrent step executions.")]
DefinitionsOption = Annotated[
    Path | None,
    typer.Option(
        "--definitions", help="Where `subflow` finds definitions (default: the current directory)."
    ),
]


def resume_run_cmd(
    run_id: RunArgument,
    as_json: JsonOption = False,
    timeout: Annotated[
        float | None,
        typer.Option(
            "--timeout",
            help="Stop waiting after this many seconds (the run is not cancelled: it goes on at the next resume).",
        ),
    ] = None,
    workers: WorkersOption = 32,
    definitions: DefinitionsOption = None,
    store: StoreOption = DEFAULT_STORE,
    wait_for_engine: WaitForEngineOption = 0.0,
) -> None:
    """Resume the store's unfinished runs, wait for RUN to end and print it like `run`.

    Exit 0 when RUN succeeded, 1 when it ended otherwise or is still going when
    --timeout passes.

    Examples:
      tideflow runs resume 3f2a9c...
      tideflow runs resume 3f2a9c... --json --timeout 60
    """
    use_working_directory_modules()
    result = run_async(
        _resume_one(store, run_id, timeout, workers, definitions, wait_for_engine),
        interrupted=interrupted_message(store, run_id),
    )
    if as_json:
        write_json(result.to_dict())
    else:
        print_result(result)
    raise typer.Exit(0 if result.succeeded else EXIT_FAILED)


async def _resume_one(
    url: str,
    run_id: str,
    timeout: float | None,
    workers: int,
    definitions: Path | None,
    wait_for_engine: float = 0.0,
) -> RunResult:
    async with opened_runtime(
        url,
        recover=True,
        workers=workers,
        upgrade=True,
        definitions_dir=definitions or Path.cwd(),
        wait_for_engine=wait_for_engine,
    ) as rt:
        client = rt.client
        await known_run(client, run_id, url)
        # A run that cannot be loaded (or whose plan cannot) is an error, not a wait.
        await client.plan(run_id)
        try:
            return await client.wait(run_id, timeout)
        except TimeoutError:
            result = await client.get(run_id)
            err.print(
                f"run {run_id} is still {result.status} after {timeout}s; "
                "it goes on at the next resume",
                markup=False,
            )
            return result


def resume_cmd(
    as_json: JsonOption = False,
    timeout: Annotated[
        float | None,
        typer.Option(
            "--timeout",
            help="Stop waiting after this many seconds (unfinished runs are not cancelled: they go on at the next resume).",
        ),
    ] = None,
    workers: WorkersOption = 32,
    definitions: DefinitionsOption = None,
    store: StoreOption = DEFAULT_STORE,
    wait_for_engine: WaitForEngineOption = 0.0,
) -> None:
    """Resume every unfinished run in the store and wait until they all end.

    Recovery relays outbox entries not yet relayed, re-arms timers and
    re-dispatches tasks whose result was never recorded (same idempotency key);
    a started attempt of an `idempotent: false` step fails with
    StepOutcomeUnknown instead of running again.
    --json prints {"runs": [...]}, each element shaped like `run --json`.

    A run that cannot be loaded (a damaged history row, a definition that no
    longer parses) is reported on one line and skipped; the others go on.
    Exit 0 when every resumed run succeeded (or there was nothing to resume),
    1 otherwise (also when --timeout passes first).

    Examples:
      tideflow resume
      tideflow resume --store sqlite:///orders.db --json
      TIDEFLOW_STORE=postgresql://db/tideflow tideflow resume --timeout 600
    """
    use_working_directory_modules()
    outcome = run_async(
        _resume_all(store, timeout, workers, definitions, wait_for_engine),
        interrupted=interrupted_message(store),
    )
    if as_json:
        write_json({"runs": [result.to_dict() for result in outcome.results]})
    elif outcome.results:
        results_table(outcome.results)
    succeeded = all(result.succeeded for result in outcome.results)
    raise typer.Exit(0 if succeeded and not outcome.broken else EXIT_FAILED)


async def _resume_all(
    url: str,
    timeout: float | None,
    workers: int,
    definitions: Path | None,
    wait_for_engine: float = 0.0,
) -> Resumed:
    if not store_exists(url):
        err.print(f"nothing to resume: no store at {display_url(url)} yet", markup=False)
        return Resumed()
    began = time.time()
    touched: set[str] = set()

    def seen(state: RunState, transitions: Sequence[Transition]) -> None:
        touched.add(state.run_id)

    async with opened_runtime(
        url,
        recover=True,
        workers=workers,
        upgrade=True,
        definitions_dir=definitions or Path.cwd(),
        listeners=[seen],
        wait_for_engine=wait_for_engine,
    ) as rt:
        outcome = Resumed()
        # A run resumed on start may already have ended: the listener saw it.
        client = rt.client
        run_ids = await _resumed(client, set(await client.unfinished()) | touched, began, outcome)
        if not run_ids and not outcome.broken:
            err.print(f"nothing to resume in {display_url(url)}", markup=False)
        if run_ids:
            err.print(f"resuming {len(run_ids)} run(s) from {display_url(url)}", markup=False)
            await _wait_all(client, run_ids, timeout, outcome)
        return outcome


@dataclass(slots=True)
class Resumed:
    """What `resume` found: the results of the runs it waited for, and the runs it could
    not load (reported one line each, skipped so that the others go on)."""

    results: list[RunResult] = field(default_factory=list)
    broken: list[str] = field(default_factory=list)

    def report(self, run_id: str, exc: TideflowError) -> None:
        self.broken.append(run_id)
        err.print(f"skipped run {run_id}: {one_line(exc.message)}", markup=False)


async def _resumed(
    client: Client, candidates: set[str], began: float, outcome: Resumed
) -> list[str]:
    """The runs that were unfinished when resume began, oldest first (runs created since,
    such as child runs started by resumed parents, are waited for by their parents)."""
    found: list[RunSummary] = []
    for run_id in candidates:
        try:
            summary = await client.summary(run_id)
            if summary.created_at >= began:
                continue
            # Load it and its plan: a run that cannot be driven is reported, not waited for.
            await client.plan(run_id)
        except NotFound:
            continue
        except TideflowError as exc:
            outcome.report(run_id, exc)
            continue
        found.append(summary)
    return [s.run_id for s in sorted(found, key=lambda s: (s.created_at, s.run_id))]


async def _wait_all(
    client: Client, run_ids: list[str], timeout: float | None, outcome: Resumed
) -> None:
    import asyncio

    waits = [asyncio.ensure_future(client.wait(run_id)) for run_id in run_ids]
    _, pending = await asyncio.wait(waits, timeout=timeout)
    for fut in pending:
        fut.cancel()
    if pending:
        err.print(
            f"{len(pending)} run(s) still unfinished after {timeout}s; they go on at the next resume",
            markup=False,
        )
    for run_id, fut in zip(run_ids, waits, strict=True):
        try:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                outcome.results.append(fut.result())
            else:
                outcome.results.append(await client.get(run_id))
        except TideflowError as exc:
            outcome.report(run_id, exc)


__all__ = ["resume_cmd", "resume_run_cmd"]
