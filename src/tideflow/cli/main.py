"""The `tideflow` command: thin over the DSL and the runtime.

Exit codes: 0 success; 1 the run ended in any state but `succeeded`, or
`validate` found errors; 2 a usage error, a definition that does not compile,
or run input that is not valid JSON or does not fit the input schema.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Annotated, Any

import orjson
import typer
from rich.console import Console

from tideflow.cli.progress import Progress
from tideflow.dsl import compile_definition, to_dot, to_mermaid, validate
from tideflow.errors import DefinitionError, InputValidationError
from tideflow.model.plan import Plan

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

err = Console(stderr=True, highlight=False)
out = Console(highlight=False)

EXIT_USAGE = 2


def _fail_usage(message: str) -> typer.Exit:
    err.print(f"[bold red]error:[/] {message}", markup=True)
    return typer.Exit(EXIT_USAGE)


def _registry() -> Any:
    from tideflow.worker.executors.registry import ExecutorRegistry

    return ExecutorRegistry()


def _load(file: Path, registry: Any) -> Plan:
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise _fail_usage(f"cannot read {file}: {exc.strerror or exc}") from None
    try:
        return compile_definition(text, file=str(file), action_types=registry.schemas())
    except DefinitionError as exc:
        for diagnostic in exc.diagnostics:
            err.print(diagnostic.format(), markup=False)
        raise typer.Exit(EXIT_USAGE) from None


def _parse_input(raw: str | None) -> Any:
    if raw is None:
        return None
    text = raw
    if raw.startswith("@"):
        try:
            text = Path(raw[1:]).read_text(encoding="utf-8")
        except OSError as exc:
            raise _fail_usage(f"cannot read input file {raw[1:]}: {exc.strerror or exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise _fail_usage(
            f"--input is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno} "
            "(pass a JSON value, or @path/to/file.json)"
        ) from None


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
        raise _fail_usage("--format must be text or json")
    registry = _registry()
    report: dict[str, list[dict[str, Any]]] = {}
    failed = False
    for file in files:
        try:
            text = file.read_text(encoding="utf-8")
        except OSError as exc:
            raise _fail_usage(f"cannot read {file}: {exc.strerror or exc}") from None
        diagnostics = validate(text, file=str(file), action_types=registry.schemas())
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
        raise _fail_usage("--format must be mermaid or dot")
    plan = _load(file, _registry())
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
) -> None:
    """Run a workflow embedded (in-process bus, in-memory state) and print its output.

    Exit 0 when the run succeeded, 1 when it ended in any other state, 2 for a usage
    or definition error or run input that does not fit the definition's input schema.

    Examples:
      tideflow run examples/etl.yaml
      tideflow run order.yaml --input '{"order_id": "A1", "amount": 30}'
      tideflow run order.yaml --input @order.json --json
    """
    registry = _registry()
    plan = _load(file, registry)
    value = _parse_input(input)
    from tideflow.dsl import validate_input

    try:
        validate_input(plan, value)
    except InputValidationError as exc:
        raise _fail_usage(exc.message) from None
    sys.path.insert(0, str(Path.cwd()))
    result = asyncio.run(
        _run(plan, value, registry, definitions or file.parent, workers, timeout, show=not as_json)
    )
    if as_json:
        sys.stdout.buffer.write(orjson.dumps(result.to_dict(), default=str) + b"\n")
    else:
        _print_result(result)
    raise typer.Exit(0 if result.succeeded else 1)


async def _run(
    plan: Plan,
    value: Any,
    registry: Any,
    definitions: Path,
    workers: int,
    timeout: float | None,
    show: bool,
) -> Any:
    from tideflow.runtime.runtime import Runtime

    async with Runtime(executors=registry, definitions_dir=definitions, workers=workers) as rt:
        progress = Progress(err, plan) if show and err.is_terminal else None
        if progress is not None:
            rt.add_listener(progress.update)
        run_id = await rt.start_run(plan, value)
        try:
            if progress is not None:
                with progress:
                    return await rt.wait(run_id, timeout)
            return await rt.wait(run_id, timeout)
        except TimeoutError:
            await rt.cancel(run_id, f"tideflow run --timeout {timeout}s passed")
            return await rt.wait(run_id, 30)


def _print_result(result: Any) -> None:
    colour = "green" if result.succeeded else "red"
    err.print(f"run {result.run_id} [bold {colour}]{result.status}[/]", markup=True)
    for key, step in result.steps.items():
        line = f"  {key:<32} {step.status:<10}"
        if step.attempts > 1:
            line += f" attempts={step.attempts}"
        if step.error:
            line += f"  {step.error['type']}: {step.error['message']}"
        err.print(line, markup=False)
    if result.error:
        err.print(f"error: {result.error['type']}: {result.error['message']}", markup=False)
    sys.stdout.buffer.write(
        orjson.dumps(result.output, option=orjson.OPT_INDENT_2, default=str) + b"\n"
    )


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
    registry = _registry()
    schemas = registry.schemas()
    if as_json:
        sys.stdout.write(json.dumps(schemas, indent=2, default=str) + "\n")
        return
    for name in sorted(schemas):
        schema = schemas[name] or {}
        keys = ", ".join(sorted((schema.get("properties") or {}).keys())) or "-"
        out.print(f"{name:<16} config: {keys}", markup=False)
    for problem in getattr(registry, "problems", list)():
        err.print(f"warning: {problem}", markup=False)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
