"""Definition -> `Plan`: load, validate, normalise, check, compile.

The phases, each reporting every problem it finds before the next one runs:

1. load (YAML/JSON syntax errors stop here),
2. structure (`schema.check_definition`: keys, types, enums, durations, ids,
   action config); when it finds errors, the later phases check what
   `salvage.salvage` keeps of the definition, so all problems are reported at once,
3. normalise (`normalize.normalize`), then the whole-definition checks: duplicate
   ids, unknown / foreign ``depends_on`` and switch targets, cycles, every
   expression and template compiled, and the static reference check (a step may
   only read ``steps.X`` when it transitively depends on X).

`validate` returns errors and warnings without raising; `compile_definition`
raises `DefinitionError` with every error, and returns a `Plan` otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tideflow.dsl.expr import compile_expression, compile_template
from tideflow.dsl.graph import (
    TOP,
    StepEntry,
    StepIndex,
    check_graph,
    index_steps,
    never_running,
)
from tideflow.dsl.inputs import BUILTIN_ACTION_TYPES, ActionTypes
from tideflow.dsl.loader import DataPath, Loaded, Reporter, did_you_mean, load
from tideflow.dsl.normalize import normalize
from tideflow.dsl.salvage import salvage
from tideflow.dsl.schema import check_definition
from tideflow.dsl.specs import build_plan, plan_hash
from tideflow.errors import DefinitionError, Diagnostic, ExpressionError
from tideflow.model.expressions import Expression, Template
from tideflow.model.plan import ENGINE_TYPES, Plan, TriggerSpec

__all__ = [
    "PlanCheck",
    "StepReporter",
    "compile_definition",
    "load_plan",
    "plan_hash",
    "validate",
]

Source = str | Path | Mapping[str, Any]


def compile_definition(
    source: Source, *, file: str | None = None, action_types: ActionTypes | None = None
) -> Plan:
    """Compile a definition (YAML/JSON text, a file path, or a mapping) into a `Plan`."""
    plan, diagnostics = _compile(source, file, action_types)
    if plan is None:
        raise DefinitionError([d for d in diagnostics if d.severity == "error"])
    return plan


def load_plan(path: str | Path, *, action_types: ActionTypes | None = None) -> Plan:
    """Compile the definition in the file at ``path``."""
    return compile_definition(Path(path), action_types=action_types)


def validate(
    source: Source,
    *,
    file: str | None = None,
    action_types: ActionTypes | None = None,
    checks: Sequence[PlanCheck] = (),
) -> list[Diagnostic]:
    """Every error and warning of a definition; never raises for a bad definition.

    ``checks`` run on the compiled plan (when it compiles), reporting through a
    `StepReporter` so that their diagnostics point at the step in the source.
    """
    try:
        return _compile(source, file, action_types, checks)[1]
    except DefinitionError as exc:
        return list(exc.diagnostics)


class StepReporter:
    """Reports a problem of a compiled step at the position it was written."""

    def __init__(self, report: Reporter, index: StepIndex) -> None:
        self._report = report
        self._index = index

    def error(
        self, step_id: str, message: str, *, at: DataPath = (), hint: str | None = None
    ) -> None:
        """``at``: the path inside the step's normal form, e.g. ``("config", "function")``."""
        entry = self._index.entries[step_id]
        self._report.error((*entry.path, *at), message, hint=hint, step_id=step_id)


PlanCheck = Callable[[Plan, StepReporter], None]


def _compile(
    source: Source,
    file: str | None,
    action_types: ActionTypes | None,
    checks: Sequence[PlanCheck] = (),
) -> tuple[Plan | None, list[Diagnostic]]:
    loaded = load(source, file=file, keep_going=True)
    types = BUILTIN_ACTION_TYPES if action_types is None else action_types
    report = Reporter(loaded.positions, loaded.file, list(loaded.problems))
    check_definition(loaded.data, report, types)
    data = loaded.data
    if report.has_errors:
        # Check what can still be checked, so that one run reports every problem.
        data = salvage(loaded.data, report.error_paths, types)
        if data is None:
            return None, report.diagnostics
    normal, report.positions = normalize(data, types, loaded.positions)
    index = index_steps(normal, report)
    acyclic = check_graph(index, report)
    compiler = _Expressions(report, loaded)
    parts = {step_id: _compile_step(compiler, entry) for step_id, entry in index.entries.items()}
    output = None
    if "output" in normal:
        output = compiler.template(normal["output"], ("output",), _Reader(None, "output", True))
    triggers = _compile_triggers(compiler, normal, report)
    _check_reads(index, compiler.reads, report, normal.get("input"))
    if acyclic:
        _warn_never_running(index, parts, report)
    if report.has_errors:
        return None, report.diagnostics
    plan = build_plan(normal, index, parts, output, report, triggers)
    for check in checks:
        check(plan, StepReporter(report, index))
    return plan, report.diagnostics


def _compile_triggers(
    compiler: _Expressions, normal: Mapping[str, Any], report: Reporter
) -> tuple[TriggerSpec, ...]:
    """The definition's ``triggers``: their ``match`` and ``input`` read ``event`` only."""
    reader = _Reader(None, "trigger", True)
    triggers = []
    for i, raw in enumerate(normal.get("triggers", ())):
        path: DataPath = ("triggers", i)
        match = input = None
        if "match" in raw:
            match = compiler.expression(raw["match"], (*path, "match"), reader)
        if "input" in raw:
            input = compiler.template(raw["input"], (*path, "input"), reader)
        for key, compiled in (("match", match), ("input", input)):
            if compiled is not None and (compiled.step_references() or compiled.input_references()):
                report.error(
                    (*path, key),
                    "a trigger reads only `event`, the event that starts the run: there is "
                    "no run yet, so no `inputs` or `steps`",
                    hint="read the event's attributes, such as event.data.order_id",
                )
        triggers.append(TriggerSpec(event=raw["event"], match=match, input=input))
    compiler.reads = [read for read in compiler.reads if read.reader is not reader]
    return tuple(triggers)


# --- expressions and templates ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Reader:
    step_id: str | None
    """None for the run-level output."""
    scope: str
    """step | compensate (may read itself) | condition (loop body in scope) | output"""
    engine: bool
    """Evaluated by the engine, which only ever sees secret placeholders."""


@dataclass(frozen=True, slots=True)
class _Read:
    reader: _Reader
    path: DataPath
    steps: frozenset[str]
    inputs: frozenset[str]
    secrets: frozenset[str]
    value: Any = None
    """The template's value (None for an expression), to find the exact string on a problem."""

    def where(self, reads: Callable[[Template], frozenset[str]], name: str) -> DataPath:
        """The path of the first string of the template that reads ``name``."""
        for path, text in _template_strings(self.value, self.path):
            try:
                if name in reads(compile_template(text)):
                    return path
            except ExpressionError:
                continue
        return self.path


class _Expressions:
    """Compiles expressions and templates, reporting errors and recording what they read."""

    def __init__(self, report: Reporter, loaded: Loaded) -> None:
        self.report = report
        self.loaded = loaded
        self.reads: list[_Read] = []

    def expression(self, source: str, path: DataPath, reader: _Reader) -> Expression | None:
        try:
            compiled = compile_expression(source)
        except ExpressionError as exc:
            self._error(self._as_written(path, exc), path, reader)
            return None
        self._record(compiled, path, reader)
        return compiled

    def template(self, value: Any, path: DataPath, reader: _Reader) -> Template | None:
        try:
            compiled = compile_template(value)
        except ExpressionError:
            # Compile each string on its own to report every broken one at its position.
            for leaf_path, text in _template_strings(value, path):
                try:
                    compile_template(text)
                except ExpressionError as exc:
                    self._error(exc, leaf_path, reader)
            return None
        if not compiled.is_constant:
            self._record(compiled, path, reader, value)
        return compiled

    def _record(
        self, compiled: Expression | Template, path: DataPath, reader: _Reader, value: Any = None
    ) -> None:
        refs = (compiled.step_references(), compiled.input_references())
        self.reads.append(_Read(reader, path, *refs, compiled.secret_references(), value))

    def _as_written(self, path: DataPath, exc: ExpressionError) -> ExpressionError:
        """The error for the text the user wrote (normalisation rewrites expressions)."""
        original = _lookup(self.loaded.data, self.report.positions.source_path(path))
        try:
            if isinstance(original, str):
                compile_expression(original)
        except ExpressionError as again:
            return again
        return exc

    def _error(self, exc: ExpressionError, path: DataPath, reader: _Reader) -> None:
        first = exc.diagnostics[0] if exc.diagnostics else Diagnostic(message=exc.message)
        self.report.error(
            path,
            first.message,
            hint=first.hint,
            step_id=reader.step_id,
            column_offset=getattr(exc, "column_offset", None),
        )


def _lookup(data: Any, path: DataPath) -> Any:
    for part in path:
        if isinstance(data, dict) and isinstance(part, str):
            data = data.get(part)
        elif isinstance(data, list) and isinstance(part, int) and part < len(data):
            data = data[part]
        else:
            return None
    return data


def _template_strings(value: Any, path: DataPath) -> Iterator[tuple[DataPath, str]]:
    if isinstance(value, str):
        if "{{" in value or "}}" in value:
            yield path, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _template_strings(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _template_strings(item, (*path, i))


def _compile_step(compiler: _Expressions, entry: StepEntry) -> dict[str, Any]:
    data, path, kind = entry.data, entry.path, entry.data["type"]
    engine = kind in ENGINE_TYPES
    plain, worker = _Reader(entry.id, "step", True), _Reader(entry.id, "step", engine)
    parts: dict[str, Any] = {}
    if "when" in data:
        parts["when"] = compiler.expression(data["when"], (*path, "when"), plain)
    if "input" in data:
        parts["input"] = compiler.template(data["input"], (*path, "input"), worker)
    if not engine:
        parts["config"] = compiler.template(data.get("config", {}), (*path, "config"), worker)
    if "compensate" in data:
        undo = _Reader(entry.id, "compensate", False)
        for key in ("config", "input"):
            value = data["compensate"].get(key, {})
            parts[f"compensate.{key}"] = compiler.template(value, (*path, "compensate", key), undo)
    for key, is_expression, scope in _ENGINE_FIELDS.get(kind, ()):
        if key in data:
            reader, at = _Reader(entry.id, scope, True), (*path, key)
            compile_one = compiler.expression if is_expression else compiler.template
            parts[key] = compile_one(data[key], at, reader)
    if kind == "switch":
        parts["cases"] = [
            compiler.expression(case["when"], (*path, "cases", i, "when"), plain)
            for i, case in enumerate(data["cases"])
        ]
    return parts


_ENGINE_FIELDS: Mapping[str, tuple[tuple[str, bool, str], ...]] = {
    "set": (("values", False, "step"),),
    "wait": (("match", True, "step"),),
    "sleep": (("until", False, "step"),),
    "map": (("items", False, "step"),),
    "loop": (("until", True, "condition"), ("while", True, "condition")),
    "emit": (("event", False, "step"),),
}


# --- what expressions may read --------------------------------------------------------


def _check_reads(index: StepIndex, reads: list[_Read], report: Reporter, schema: Any) -> None:
    properties = schema.get("properties") if isinstance(schema, dict) else None
    declared = frozenset(properties) if isinstance(properties, dict) else None
    for read in reads:
        for step_id in sorted(read.steps):
            if not _may_read(index, read.reader, step_id):
                _bad_read(index, report, read, step_id)
        if declared is not None:
            _undeclared_inputs(report, read, declared)
        if read.reader.engine and read.secrets:
            name = sorted(read.secrets)[0]
            report.warning(
                read.where(_secrets_read, name),
                f"secrets.{name} is read where the engine evaluates it",
                hint="the engine only sees a placeholder; read secrets in an action step's "
                "config or input",
                step_id=read.reader.step_id,
            )


def _undeclared_inputs(report: Reporter, read: _Read, declared: frozenset[str]) -> None:
    for name in sorted(read.inputs - declared):
        suggestion = did_you_mean(name, declared)
        hint = f"did you mean '{suggestion}'? " if suggestion else ""
        report.warning(
            read.where(_inputs_read, name),
            f"inputs.{name} is not declared in the input schema",
            hint=f"{hint}add '{name}' to input.properties, or fix the name",
            step_id=read.reader.step_id,
        )


def _steps_read(template: Template) -> frozenset[str]:
    return template.step_references()


def _inputs_read(template: Template) -> frozenset[str]:
    return template.input_references()


def _secrets_read(template: Template) -> frozenset[str]:
    return template.secret_references()


def _may_read(index: StepIndex, reader: _Reader, target: str) -> bool:
    entry = index.entries.get(target)
    if entry is None:
        return False
    if reader.step_id is None:
        return entry.graph == TOP
    if reader.scope == "compensate" and target == reader.step_id:
        return True
    if reader.scope == "condition" and entry.graph == reader.step_id:
        return True
    return index.can_read(reader.step_id, target)


def _bad_read(index: StepIndex, report: Reporter, read: _Read, target: str) -> None:
    reader = read.reader.step_id
    who = f"step '{reader}'" if reader else "the run output"
    if target not in index.entries:
        suggestion = did_you_mean(target, index.entries)
        message = f"{who} reads steps.{target}, but there is no step '{target}'"
        hint = f"did you mean '{suggestion}'?" if suggestion else "check the step id"
    elif target == reader:
        message = f"{who} reads its own result (steps.{target})"
        hint = "only `compensate` may read the step it undoes"
    elif reader is None:
        message = f"{who} reads steps.{target}, which is not a top-level step"
        hint = _read_hint(index, reader, target)
    else:
        message = f"{who} reads steps.{target} but does not depend on {target}"
        hint = _read_hint(index, reader, target)
    report.error(read.where(_steps_read, target), message, hint=hint, step_id=reader)


def _read_hint(index: StepIndex, reader: str | None, target: str) -> str:
    chain = _owner_chain(index, reader)
    graphs = {index.entries[s].graph for s in chain} if chain else {TOP}
    outer = target
    while index.entries[outer].graph not in graphs and index.entries[outer].owner:
        outer = index.entries[outer].owner or outer
    if outer != target:
        depend = f" and depend on {outer}" if reader else ""
        return f"'{target}' runs inside '{outer}'; read steps.{outer}.output{depend}"
    if reader is None:
        return "the run output can only read top-level steps"
    holder = next(s for s in chain if index.entries[s].graph == index.entries[target].graph)
    where = "" if holder == reader else f" of '{holder}' (which contains '{reader}')"
    return f"add {target} to depends_on{where}"


def _owner_chain(index: StepIndex, step_id: str | None) -> list[str]:
    chain: list[str] = []
    while step_id is not None:
        chain.append(step_id)
        step_id = index.entries[step_id].owner
    return chain


def _warn_never_running(index: StepIndex, parts: Mapping[str, Any], report: Reporter) -> None:
    false_when = {s for s, p in parts.items() if _always_false(p.get("when"))}
    for step_id, reason in never_running(index, false_when).items():
        entry = index.entries[step_id]
        at = (*entry.path, "when") if step_id in false_when else entry.path
        report.warning(
            at,
            f"step '{step_id}' can never run: {reason}",
            hint="remove the step, or fix its `when` / dependencies",
            step_id=step_id,
        )


def _always_false(when: Expression | None) -> bool:
    if when is None or when.step_references() or when.input_references():
        return False
    try:
        return not when.evaluate({})
    except Exception:  # it reads something only known at run time
        return False
