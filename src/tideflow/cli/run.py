"""`tideflow run`: run a workflow embedded (in-process bus and workers) and print its
output (cli/app.py lists it; this module is imported when the command runs)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from tideflow.cli.cluster import LogFormatOption, LogLevelOption, setup_logging
from tideflow.cli.common import (
    DEFAULT_STORE,
    MAX_RUN_INPUT_ENV,
    MAX_STEP_OUTPUT_ENV,
    Limits,
    StoreOption,
    WaitForEngineOption,
    display_url,
    err,
    fail_error,
    fail_usage,
    interrupted_message,
    json_mode,
    opened_runtime,
    parse_json_option,
    parse_size,
    registry,
    run_async,
    use_working_directory_modules,
    write_json,
)
from tideflow.cli.render import print_result
from tideflow.cli.validate import definition_directory, load_definition
from tideflow.errors import DefinitionConflict, InputValidationError, TideflowError
from tideflow.model import storable

if TYPE_CHECKING:
    from tideflow.model.plan import Plan
    from tideflow.runtime.result import RunResult
    from tideflow.worker.executors.registry import ExecutorRegistry


def run_cmd(
    file: Annotated[
        str,
        typer.Argument(
            help="The definition: a YAML or JSON file, or flow.py[:name] / module[:name].",
            show_default=False,
        ),
    ],
    input: Annotated[
        str | None, typer.Option("--input", "-i", help="Run input: JSON text, or @file.json.")
    ] = None,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="No progress display; print one JSON object with the result (or the error).",
            callback=json_mode,
        ),
    ] = False,
    definitions: Annotated[
        Path | None,
        typer.Option(
            "--definitions", help="Where `subflow` finds definitions (default: FILE's directory)."
        ),
    ] = None,
    workers: Annotated[
        int, typer.Option("--workers", min=1, help="Concurrent step executions.")
    ] = 32,
    timeout: Annotated[
        float | None,
        typer.Option(
            "--timeout", help="Stop waiting after this many seconds (the run is cancelled)."
        ),
    ] = None,
    store: StoreOption = DEFAULT_STORE,
    idempotency_key: Annotated[
        str | None,
        typer.Option(
            "--idempotency-key",
            metavar="KEY",
            help="Start at most one run per KEY: again with the same KEY waits for that run.",
        ),
    ] = None,
    max_step_output: Annotated[
        str | None,
        typer.Option(
            "--max-step-output",
            envvar=MAX_STEP_OUTPUT_ENV,
            metavar="SIZE",
            help="Largest step output as JSON (default 1MiB); a larger one fails the step.",
        ),
    ] = None,
    max_run_input: Annotated[
        str | None,
        typer.Option(
            "--max-run-input",
            envvar=MAX_RUN_INPUT_ENV,
            metavar="SIZE",
            help="Largest run input as JSON (default 16MiB); a larger one is refused.",
        ),
    ] = None,
    wait_for_engine: WaitForEngineOption = 0.0,
    log_format: LogFormatOption = "auto",
    log_level: LogLevelOption = None,
) -> None:
    """Run a workflow embedded (in-process bus and workers) and print its output.

    State is kept in --store (default: a SQLite file under ./.tideflow/, created
    when missing; memory:// keeps nothing). Starting on a durable store also
    resumes the store's other unfinished runs; this command waits for its own.

    One engine runs on a store at a time: while another `tideflow run` or
    `resume` is running on --store, this one is refused (exit 2, naming it)
    unless --wait-for-engine gives it time to exit; send that engine's runs
    signals with `tideflow runs signal` instead.

    Exit 0 when the run succeeded, 1 when it ended in any other state, 2 for a
    usage or definition error, run input that does not fit the definition's
    input schema, a store that cannot be opened, or one another engine runs on.

    Examples:
      tideflow run examples/etl.yaml
      tideflow run order.yaml --input '{"order_id": "A1", "amount": 30}'
      tideflow run order.yaml --input @order.json --json
      tideflow run order.yaml --idempotency-key order-A1 --store sqlite:///orders.db
      tideflow run flow.yaml --store memory://
      tideflow run examples/python_builder.py --input '{"name": "Ada", "words": ["hi"]}'
    """
    setup_logging(False, log_level, log_format, default="warning")  # the display is stdout's
    executors = registry()
    plan = load_definition(file, executors)
    value = parse_json_option(input, "--input")
    from tideflow.dsl import validate_input

    try:
        validate_input(plan, value)
    except InputValidationError as exc:
        raise fail_error(exc) from None
    use_working_directory_modules()
    try:
        limits = Limits(
            step_output=parse_size(max_step_output, storable.MAX_STEP_OUTPUT),
            run_input=parse_size(max_run_input, storable.MAX_RUN_INPUT),
        )
    except TideflowError as exc:
        raise fail_usage(exc.message) from None
    request = _RunRequest(
        plan=plan,
        input=value,
        store=store,
        idempotency_key=idempotency_key,
        definitions=definitions or definition_directory(file),
        workers=workers,
        timeout=timeout,
        show=not as_json,
        limits=limits,
        wait_for_engine=wait_for_engine,
    )
    result = run_async(
        _run(request, executors),
        interrupted=interrupted_message(store),
    )
    if as_json:
        write_json(result.to_dict())
    else:
        print_result(result)
    raise typer.Exit(0 if result.succeeded else 1)


@dataclass(frozen=True, slots=True, kw_only=True)
class _RunRequest:
    """What `tideflow run` was asked to do."""

    plan: Plan
    input: Any
    store: str
    idempotency_key: str | None
    definitions: Path
    workers: int
    timeout: float | None
    show: bool
    limits: Limits
    wait_for_engine: float = 0.0


async def _run(request: _RunRequest, executors: ExecutorRegistry) -> RunResult:
    import uuid

    from tideflow.cli.progress import Progress

    async with opened_runtime(
        request.store,
        recover=True,
        workers=request.workers,
        create=True,
        upgrade=True,
        executors=executors,
        definitions_dir=request.definitions,
        limits=request.limits,
        wait_for_engine=request.wait_for_engine,
    ) as rt:
        wanted = uuid.uuid4().hex
        progress = Progress(err, request.plan, wanted) if request.show and err.is_terminal else None
        if progress is not None:
            rt.add_listener(progress.update)
        try:
            run_id = await rt.start_run(
                request.plan,
                request.input,
                run_id=wanted,
                idempotency_key=request.idempotency_key,
            )
        except DefinitionConflict as exc:
            raise fail_usage(
                f"{exc.message} (the store {display_url(request.store)} keeps every "
                "registered version; or run it with --store memory:// while you edit it)",
                type=type(exc).__name__,
            ) from None
        if run_id != wanted:
            if progress is not None:
                progress.run_id = run_id
            if request.show:
                err.print(
                    f"run {run_id} already exists for idempotency key "
                    f"{escape(repr(request.idempotency_key))}: waiting for it",
                    markup=True,
                )
        try:
            if progress is not None:
                with progress:
                    return await rt.wait(run_id, request.timeout)
            return await rt.wait(run_id, request.timeout)
        except TimeoutError:
            await rt.cancel(run_id, f"tideflow run --timeout {request.timeout}s passed")
            return await rt.wait(run_id, 30)
