"""The `tideflow` command: thin over the DSL and the runtime.

Exit codes: 0 success; 1 the run ended in any state but `succeeded`, or
`validate` found errors; 2 a usage error, a definition that does not compile,
run input that is not valid JSON or does not fit the input schema, a store that
cannot be opened, or a run that is not in the store; 130 interrupted (Ctrl-C).

Commands: `run`, `validate`, `graph`, `executors list`, `resume`, `runs …`
(cli/runs.py, cli/resume.py) and `db …` (cli/db.py).
"""

from __future__ import annotations

import json
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from tideflow.cli.common import (
    DEFAULT_STORE,
    EXIT_USAGE,
    MAX_RUN_INPUT_ENV,
    MAX_STEP_OUTPUT_ENV,
    Limits,
    StoreOption,
    display_url,
    err,
    fail_usage,
    opened_runtime,
    out,
    parse_json_option,
    parse_size,
    registry,
    run_async,
    use_working_directory_modules,
    write_json,
)
from tideflow.cli.db import db_app
from tideflow.cli.definitions import definitions_app
from tideflow.cli.progress import Progress
from tideflow.cli.render import print_result
from tideflow.cli.resume import resume_cmd
from tideflow.cli.runs import runs_app
from tideflow.dsl import compile_definition, to_dot, to_mermaid, validate
from tideflow.errors import (
    DefinitionConflict,
    DefinitionError,
    InputValidationError,
    TideflowError,
)
from tideflow.model import storable
from tideflow.model.plan import Plan
from tideflow.runtime.result import RunResult

if TYPE_CHECKING:
    from tideflow.worker.executors.registry import ExecutorRegistry

app = typer.Typer(
    name="tideflow",
    help="tideflow: a durable, event-driven workflow engine.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
)
executors_app = typer.Typer(
    help="Inspect the executors (step types run by workers).", no_args_is_help=True
)
app.add_typer(executors_app, name="executors")
app.add_typer(runs_app, name="runs")
app.add_typer(db_app, name="db")
app.add_typer(definitions_app, name="definitions")
app.command("resume")(resume_cmd)


def _load(file: Path, executors: ExecutorRegistry) -> Plan:
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise fail_usage(f"cannot read {file}: {exc.strerror or exc}") from None
    try:
        return compile_definition(text, file=str(file), action_types=executors.schemas())
    except DefinitionError as exc:
        for diagnostic in exc.diagnostics:
            err.print(diagnostic.format(), markup=False)
        raise typer.Exit(EXIT_USAGE) from None


@app.command("validate")
def validate_cmd(
    files: Annotated[
        list[Path], typer.Argument(help="Definition files (YAML or JSON).", show_default=False)
    ],
    format: Annotated[str, typer.Option("--format", help="text or json.")] = "text",
) -> None:
    """Check definitions without running them.

    Exit 0 when every file is valid (warnings allowed), 1 when any has errors.

    Examples:
      tideflow validate flows/*.yaml
      tideflow validate order.yaml --format json
    """
    if format not in ("text", "json"):
        raise fail_usage("--format must be text or json")
    executors = registry()
    report: dict[str, list[dict[str, Any]]] = {}
    failed = False
    for file in files:
        try:
            text = file.read_text(encoding="utf-8")
        except OSError as exc:
            raise fail_usage(f"cannot read {file}: {exc.strerror or exc}") from None
        diagnostics = validate(text, file=str(file), action_types=executors.schemas())
        report[str(file)] = [d.to_dict() for d in diagnostics]
        failed = failed or any(d.severity == "error" for d in diagnostics)
        if format == "text":
            for d in diagnostics:
                err.print(d.format(), markup=False)
            if not any(d.severity == "error" for d in diagnostics):
                out.print(f"{file}: ok", markup=False)
    if format == "json":
        sys.stdout.write(json.dumps({"valid": not failed, "files": report}, indent=2) + "\n")
    raise typer.Exit(1 if failed else 0)


@app.command("graph")
def graph_cmd(
    file: Annotated[Path, typer.Argument(help="A definition file.", show_default=False)],
    format: Annotated[str, typer.Option("--format", help="mermaid or dot.")] = "mermaid",
) -> None:
    """Print the workflow's graph as Mermaid (default) or Graphviz DOT.

    Examples:
      tideflow graph order.yaml > order.mmd
      tideflow graph order.yaml --format dot | dot -Tsvg > order.svg
    """
    if format not in ("mermaid", "dot"):
        raise fail_usage("--format must be mermaid or dot")
    plan = _load(file, registry())
    sys.stdout.write((to_mermaid(plan) if format == "mermaid" else to_dot(plan)) + "\n")


@app.command("run")
def run_cmd(
    file: Annotated[Path, typer.Argument(help="The definition to run.", show_default=False)],
    input: Annotated[
        str | None, typer.Option("--input", "-i", help="Run input: JSON text, or @file.json.")
    ] = None,
    as_json: Annotated[
        bool,
        typer.Option("--json", help="No progress display; print one JSON object with the result."),
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
) -> None:
    """Run a workflow embedded (in-process bus and workers) and print its output.

    State is kept in --store (default: a SQLite file under ./.tideflow/, created
    when missing; memory:// keeps nothing). Starting on a durable store also
    resumes the store's other unfinished runs; this command waits for its own.

    Exit 0 when the run succeeded, 1 when it ended in any other state, 2 for a
    usage or definition error, run input that does not fit the definition's
    input schema, or a store that cannot be opened.

    Examples:
      tideflow run examples/etl.yaml
      tideflow run order.yaml --input '{"order_id": "A1", "amount": 30}'
      tideflow run order.yaml --input @order.json --json
      tideflow run order.yaml --idempotency-key order-A1 --store sqlite:///orders.db
      tideflow run flow.yaml --store memory://
    """
    executors = registry()
    plan = _load(file, executors)
    value = parse_json_option(input, "--input")
    from tideflow.dsl import validate_input

    try:
        validate_input(plan, value)
    except InputValidationError as exc:
        raise fail_usage(exc.message) from None
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
        definitions=definitions or file.parent,
        workers=workers,
        timeout=timeout,
        show=not as_json,
        limits=limits,
    )
    result = run_async(
        _run(request, executors),
        interrupted=f"interrupted: unfinished runs stay in {display_url(store)} "
        "and continue on the next `tideflow resume`",
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


async def _run(request: _RunRequest, executors: ExecutorRegistry) -> RunResult:
    async with opened_runtime(
        request.store,
        recover=True,
        workers=request.workers,
        create=True,
        upgrade=True,
        executors=executors,
        definitions_dir=request.definitions,
        limits=request.limits,
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
                "registered version; or run it with --store memory:// while you edit it)"
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


@executors_app.command("list")
def executors_list(
    as_json: Annotated[
        bool, typer.Option("--json", help="Print names and config schemas as JSON.")
    ] = False,
) -> None:
    """Show the installed executors and their config schemas.

    Examples:
      tideflow executors list
      tideflow executors list --json
    """
    executors = registry()
    schemas = executors.schemas()
    if as_json:
        sys.stdout.write(json.dumps(schemas, indent=2, default=str) + "\n")
        return
    for name in sorted(schemas):
        schema = schemas[name] or {}
        keys = ", ".join(sorted((schema.get("properties") or {}).keys())) or "-"
        out.print(f"{name:<16} config: {keys}", markup=False)
    for problem in getattr(executors, "problems", list)():
        err.print(f"warning: {problem}", markup=False)


def main() -> None:
    app(prog_name="tideflow")


if __name__ == "__main__":
    main()
