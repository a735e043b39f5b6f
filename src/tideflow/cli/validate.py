"""`tideflow validate` and `tideflow graph`, and how every command loads a definition.

A definition on the command line is a YAML or JSON file, or Python that builds a
workflow: ``flow.py``, ``flow.py:name``, ``package.module`` or ``package.module:name``
(`tideflow.runtime.definitions.load_python_workflow` says how the workflow is found).

``validate --strict`` adds the checks that need more than the definition: every
``python`` step's function is imported and its signature checked against the
step's ``input``, and every ``subflow`` must name a workflow in the store (``--store``)
or among the definition files next to the file (or in ``--definitions``).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from tideflow.cli.common import (
    EXIT_USAGE,
    STORE_ENV,
    err,
    fail_error,
    fail_usage,
    format_mode,
    opened_store,
    out,
    registry,
    run_async,
    store_exists,
    use_working_directory_modules,
)
from tideflow.errors import DefinitionError, DefinitionUnreadable, Diagnostic

if TYPE_CHECKING:
    from tideflow.dsl.compiler import PlanCheck, StepReporter
    from tideflow.model.plan import Plan, StepSpec
    from tideflow.runtime.definitions import DefinitionSource
    from tideflow.worker.executors.registry import ExecutorRegistry

# The compiler (and jsonschema under it) is imported by the functions that compile: the
# `tideflow` command imports this module to list its commands (docs/operations.md, "A fast CLI").

__all__ = ["definition_directory", "graph_cmd", "load_definition", "validate_cmd"]


def _is_python(reference: str) -> bool:
    from tideflow.runtime.definitions import is_python_reference

    target = reference.partition(":")[0]
    if Path(reference).is_file() and not reference.endswith(".py"):
        return False
    return is_python_reference(reference) and (target.endswith(".py") or not Path(target).exists())


def definition_directory(reference: str) -> Path:
    """Where a definition's subflows are looked for by default: the file's directory."""
    if _is_python(reference) and not reference.partition(":")[0].endswith(".py"):
        return Path.cwd()
    return Path(reference.partition(":")[0] if _is_python(reference) else reference).parent


def _source(reference: str) -> tuple[Any, str]:
    """What to compile for ``reference`` and the file name diagnostics carry.

    DefinitionUnreadable when there is nothing to compile; DefinitionError when the
    Python code builds a workflow that is wrong already (a task parameter left unbound).
    """
    from tideflow.dsl.loader import read_definition
    from tideflow.runtime.definitions import load_python_workflow

    if _is_python(reference):
        use_working_directory_modules()
        return load_python_workflow(reference).to_dict(), reference.partition(":")[0]
    return read_definition(Path(reference)), reference


def load_definition(reference: str, executors: ExecutorRegistry) -> Plan:
    """The plan of a definition named on the command line; exit 2 when it does not compile."""
    from tideflow.dsl import compile_definition

    try:
        source, file = _source(reference)
        return compile_definition(source, file=file, action_types=executors.schemas())
    except DefinitionUnreadable as exc:
        raise fail_usage(_one_line(exc), type=type(exc).__name__) from None
    except DefinitionError as exc:
        raise fail_error(exc) from None


def _one_line(exc: DefinitionError) -> str:
    return "; ".join(d.message for d in exc.diagnostics)


# --- validate ---------------------------------------------------------------------------


@dataclass
class _Outcome:
    diagnostics: list[Diagnostic] = field(default_factory=list)
    unreadable: bool = False

    @property
    def failed(self) -> bool:
        return self.unreadable or any(d.severity == "error" for d in self.diagnostics)


def _validate_one(reference: str, executors: ExecutorRegistry, checks: list[PlanCheck]) -> _Outcome:
    from tideflow.dsl import validate

    try:
        source, file = _source(reference)
    except DefinitionUnreadable as exc:
        return _Outcome(list(exc.diagnostics), unreadable=True)
    except DefinitionError as exc:
        return _Outcome(list(exc.diagnostics))
    return _Outcome(validate(source, file=file, action_types=executors.schemas(), checks=checks))


def validate_cmd(
    files: Annotated[
        list[str],
        typer.Argument(
            help="Definitions: YAML or JSON files, or flow.py[:name] / module[:name].",
            show_default=False,
        ),
    ],
    format: Annotated[
        str, typer.Option("--format", help="text or json.", callback=format_mode)
    ] = "text",
    strict: Annotated[
        bool,
        typer.Option(
            "--strict",
            help="Also import python step functions and check their parameters, and check "
            "that subflows exist.",
        ),
    ] = False,
    store: Annotated[
        str | None,
        typer.Option(
            "--store",
            envvar=STORE_ENV,
            metavar="URL",
            help="With --strict: a store whose registered workflows subflows may name.",
        ),
    ] = None,
    definitions: Annotated[
        Path | None,
        typer.Option(
            "--definitions",
            help="With --strict: where subflow definitions are (default: each file's directory).",
        ),
    ] = None,
) -> None:
    """Check definitions without running them: every problem of each, at once.

    Exit 0 when every definition is valid (warnings allowed), 1 when any has errors,
    2 when one cannot be read at all (not a file, not UTF-8 text, too large).

    Examples:
      tideflow validate flows/*.yaml
      tideflow validate order.yaml --format json
      tideflow validate flow.py --strict --store sqlite:///runs.db
    """
    from tideflow.runtime.definitions import DefinitionSource

    if format not in ("text", "json"):
        raise fail_usage("--format must be text or json")
    executors = registry()
    registered = _registered(store) if strict and store else frozenset()
    outcomes: dict[str, _Outcome] = {}
    for reference in files:
        checks: list[PlanCheck] = []
        if strict:
            where = definitions or definition_directory(reference)
            subflows = _Subflows(registered, DefinitionSource(where, executors), store, where)
            checks = [_check_functions, subflows.check]
        outcomes[reference] = outcome = _validate_one(reference, executors, checks)
        if format == "text":
            _print_outcome(reference, outcome)
    failed = any(o.failed for o in outcomes.values())
    if format == "json":
        report = {ref: [d.to_dict() for d in o.diagnostics] for ref, o in outcomes.items()}
        sys.stdout.write(json.dumps({"valid": not failed, "files": report}, indent=2) + "\n")
    unreadable = any(o.unreadable for o in outcomes.values())
    raise typer.Exit(EXIT_USAGE if unreadable else 1 if failed else 0)


def _print_outcome(reference: str, outcome: _Outcome) -> None:
    if outcome.unreadable:
        for diagnostic in outcome.diagnostics:
            err.print(f"error: {diagnostic.message}", markup=False)
        return
    for diagnostic in outcome.diagnostics:
        err.print(diagnostic.format(), markup=False)
    if not outcome.failed:
        out.print(f"{reference}: ok", markup=False)


# --- strict checks ----------------------------------------------------------------------


def _check_functions(plan: Plan, report: StepReporter) -> None:
    """Each python step's (and compensation's) function imports and takes its input."""
    for spec in plan.specs.values():
        if spec.type == "python":
            _check_function(report, spec.id, spec.config, spec.input, ())
        if spec.compensate is not None and spec.compensate.type == "python":
            undo = spec.compensate
            _check_function(report, spec.id, undo.config, undo.input, ("compensate",))


def _check_function(
    report: StepReporter, step_id: str, config: Any, input: Any, at: tuple[str, ...]
) -> None:
    from tideflow.dsl.signatures import call_problems
    from tideflow.worker.executors.functions import resolve_function

    source = config.source if config is not None else {}
    spec = source.get("function") if isinstance(source, Mapping) else None
    if not isinstance(spec, str) or "{{" in spec:
        return  # only known at run time
    where = (*at, "config", "function")
    try:
        function = resolve_function(spec)
    except Exception as exc:
        hint = "fix the import path ('pkg.module:callable'), or register the function"
        report.error(step_id, " ".join(str(exc).split()), at=where, hint=hint)
        return
    keys = _input_keys(input)
    if keys is None:
        return
    for problem in call_problems(function, keys, repr(spec)):
        report.error(step_id, problem.message, at=(*at, "input"), hint=problem.hint)


def _input_keys(input: Any) -> set[str] | None:
    """The keys the step passes (None: one template, known only at run time)."""
    source = input.source if input is not None else {}
    return set(source) if isinstance(source, Mapping) else None


@dataclass(frozen=True)
class _Subflows:
    registered: frozenset[tuple[str, str]]
    files: DefinitionSource
    store: str | None
    directory: Path

    def check(self, plan: Plan, report: StepReporter) -> None:
        for spec in plan.specs.values():
            if spec.subflow is not None:
                self._check(spec, report)

    def _check(self, spec: StepSpec, report: StepReporter) -> None:
        assert spec.subflow is not None
        name, version = spec.subflow.workflow, spec.subflow.version
        if "{{" in name or self._known(name, version):
            return
        what = f"workflow {name!r}" + (f" version {version!r}" if version else "")
        places = [f"the definition files in {self.directory}"]
        if self.store:
            places.append(f"the store {self.store}")
        report.error(
            spec.id,
            f"subflow {what} is not in {' or '.join(places)}",
            at=("workflow",),
            hint="register it (tideflow definitions register), put its file next to this "
            "one, or point --definitions / --store at it",
        )

    def _known(self, name: str, version: str | None) -> bool:
        if any(n == name and version in (None, v) for n, v in self.registered):
            return True
        return self.files.find(name, version) is not None


def _registered(url: str) -> frozenset[tuple[str, str]]:
    if not store_exists(url):
        return frozenset()  # a SQLite store not created yet has nothing registered

    async def listed() -> frozenset[tuple[str, str]]:
        async with opened_store(url) as store:
            return frozenset((d.name, d.version) for d in await store.list_definitions())

    return run_async(listed())


# --- graph ------------------------------------------------------------------------------


def graph_cmd(
    file: Annotated[
        str,
        typer.Argument(
            help="A definition: YAML or JSON file, or flow.py[:name] / module[:name].",
            show_default=False,
        ),
    ],
    format: Annotated[str, typer.Option("--format", help="mermaid or dot.")] = "mermaid",
) -> None:
    """Print the workflow's graph as Mermaid (default) or Graphviz DOT.

    Examples:
      tideflow graph order.yaml > order.mmd
      tideflow graph order.yaml --format dot | dot -Tsvg > order.svg
      tideflow graph examples/python_builder.py
    """
    from tideflow.dsl import to_dot, to_mermaid

    renderers: Mapping[str, Callable[[Plan], str]] = {"mermaid": to_mermaid, "dot": to_dot}
    if format not in renderers:
        raise fail_usage("--format must be mermaid or dot")
    plan = load_definition(file, registry())
    sys.stdout.write(renderers[format](plan) + "\n")
