"""The Python API: build a definition in code.

The builder only produces the same plain data a YAML file holds, and compiles it
through the same path (`compile_definition`), so a workflow built here and the
equivalent YAML have the same normalised definition and the same plan hash::

    wf = Workflow("orders", "1.0.0", input={"type": "object"})
    wf.python("reserve", "shop.orders:reserve", input={"id": "{{ inputs.id }}"})
    wf.http("notify", "https://example.com/hook", method="POST", depends_on=["reserve"])

    @wf.task("ship", depends_on=["reserve"], retry=3)
    def ship(order_id: str, reserve: dict) -> dict: ...

    plan = wf.compile()

A ``@wf.task`` function's parameters are bound to input when the definition is
built (`to_dict`): an explicit ``input={...}`` key as given; a parameter named after
another top-level step to that step's output (``{{ steps.reserve.output }}``), which
also makes the task depend on it; any other parameter to the run input of the same
name (``{{ inputs.order_id }}``) when the workflow declares no ``input`` schema, or
declares that property (a parameter with a default only when the schema requires
it). ``ctx`` receives the step context. A required parameter left unbound, or an
input key the function does not take (without ``**kwargs``), is a `DefinitionError`
naming the step and the parameter.

Every step method takes the step id first, the type's main keys next, and any
other DSL key as a keyword (``depends_on``, ``when``, ``retry``, ``timeout``,
``input``, ``compensate``, …). ``while_`` is written ``while``. Durations may be
``datetime.timedelta``. Keyword values of None are left out. Step methods return
the builder, so calls chain.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any, Self, TypeVar

from tideflow.dsl.compiler import compile_definition
from tideflow.dsl.inputs import ActionTypes
from tideflow.dsl.signatures import call_problems, keyword_parameters
from tideflow.errors import DefinitionError, Diagnostic
from tideflow.model.plan import Plan

__all__ = ["Steps", "Workflow"]

F = TypeVar("F", bound=Callable[..., Any])


class Steps:
    """An ordered list of steps: a workflow's, or a loop body (``Steps().python(...)``)."""

    def __init__(self) -> None:
        self._steps: list[dict[str, Any]] = []

    def step(self, step_id: str | None, /, *, type: str, **keys: Any) -> Self:
        """Any step type with any keys; ``step_id`` None only for a map template."""
        step = {"id": step_id, "type": type, **keys}
        self._steps.append({_key(k): _plain(v) for k, v in step.items() if v is not None})
        return self

    def python(self, step_id: str, function: str, /, **keys: Any) -> Self:
        return self.step(step_id, type="python", function=function, **keys)

    def http(self, step_id: str, url: str, /, **keys: Any) -> Self:
        return self.step(step_id, type="http", url=url, **keys)

    def shell(self, step_id: str, command: Sequence[str], /, **keys: Any) -> Self:
        return self.step(step_id, type="shell", command=command, **keys)

    def noop(self, step_id: str, /, **keys: Any) -> Self:
        return self.step(step_id, type="noop", **keys)

    def set(self, step_id: str, values: Mapping[str, Any], /, **keys: Any) -> Self:
        return self.step(step_id, type="set", values=values, **keys)

    def switch(
        self,
        step_id: str,
        cases: Sequence[Mapping[str, Any]],
        /,
        *,
        default: Sequence[str] | str,
        **keys: Any,
    ) -> Self:
        """``default`` is a list of step ids or ``"fail"``."""
        return self.step(step_id, type="switch", cases=cases, default=default, **keys)

    def wait(self, step_id: str, signal: str, /, **keys: Any) -> Self:
        return self.step(step_id, type="wait", signal=signal, **keys)

    def sleep(
        self,
        step_id: str,
        duration: str | float | timedelta | None = None,
        /,
        *,
        until: str | None = None,
        **keys: Any,
    ) -> Self:
        return self.step(step_id, type="sleep", duration=duration, until=until, **keys)

    def map(
        self,
        step_id: str,
        items: Any,
        /,
        *,
        step: Mapping[str, Any] | Steps,
        **keys: Any,
    ) -> Self:
        """``step`` is the template: a step mapping, or a `Steps` holding exactly one step."""
        if isinstance(step, Steps):
            if len(step._steps) != 1:
                raise ValueError(f"a map template is one step, got {len(step._steps)}")
            step = step._steps[0]
        return self.step(step_id, type="map", items=items, step=step, **keys)

    def loop(
        self,
        step_id: str,
        steps: Steps | Sequence[Mapping[str, Any]],
        /,
        *,
        max_iterations: int,
        **keys: Any,
    ) -> Self:
        """Pass ``until=`` or ``while_=``, as in the DSL."""
        return self.step(step_id, type="loop", steps=steps, max_iterations=max_iterations, **keys)

    def subflow(self, step_id: str, workflow: str, /, **keys: Any) -> Self:
        return self.step(step_id, type="subflow", workflow=workflow, **keys)

    def emit(self, step_id: str, event: Mapping[str, Any], /, **keys: Any) -> Self:
        """``event`` is ``{type, source, data}``."""
        return self.step(step_id, type="emit", event=event, **keys)

    def to_list(self) -> list[dict[str, Any]]:
        return [dict(step) for step in self._steps]


class Workflow(Steps):
    """A workflow definition under construction."""

    def __init__(
        self,
        name: str,
        version: str,
        *,
        title: str | None = None,
        description: str | None = None,
        input: Mapping[str, Any] | None = None,
        defaults: Mapping[str, Any] | None = None,
        timeout: str | float | timedelta | None = None,
        on_failure: str | None = None,
        output: Any = None,
    ) -> None:
        super().__init__()
        self._tasks: dict[int, Callable[..., Any]] = {}
        """Position in the step list -> the function of a ``@task`` step."""
        self.name = name
        self.version = version
        self._top: dict[str, Any] = {
            "title": title,
            "description": description,
            "input": input,
            "defaults": defaults,
            "timeout": timeout,
            "on_failure": on_failure,
            "output": output,
        }

    def task(self, step_id: str | None = None, /, **keys: Any) -> Callable[[F], F]:
        """Register a module-level function as a python step (id: ``step_id`` or its name)."""

        def register(function: F) -> F:
            qualname = function.__qualname__
            if "<locals>" in qualname:
                raise ValueError(
                    f"@task needs a module-level function a worker can import; "
                    f"{qualname} is defined inside another function"
                )
            target = f"{function.__module__}:{qualname}"
            self._tasks[len(self._steps)] = function
            self.python(step_id or function.__name__, target, **keys)
            return function

        return register

    def to_dict(self) -> dict[str, Any]:
        """The definition as plain data, exactly what the equivalent YAML loads to."""
        top = {key: _plain(value) for key, value in self._top.items() if value is not None}
        steps = self.to_list()
        _bind_tasks(steps, self._tasks, top.get("input"))
        return {"name": self.name, "version": self.version, **top, "steps": steps}

    def compile(self, *, action_types: ActionTypes | None = None) -> Plan:
        return compile_definition(self.to_dict(), action_types=action_types)


def _bind_tasks(
    steps: list[dict[str, Any]], tasks: Mapping[int, Callable[..., Any]], schema: Any
) -> None:
    """Fill in each task's input from its parameters (see the module docstring)."""
    ids = {step.get("id") for step in steps}
    problems: list[Diagnostic] = []
    for position, function in tasks.items():
        step = steps[position]
        explicit = step.get("input", {})
        if not isinstance(explicit, Mapping):
            continue  # one template: its keys are only known at run time
        bound = {**_bindings(step, function, ids - {step["id"]}, schema), **explicit}
        step["input"] = bound
        for problem in call_problems(function, bound, step["function"]):
            problems.append(
                Diagnostic(
                    message=problem.message,
                    step_id=step["id"],
                    path=f"steps[{position}].input",
                    hint=f"{problem.hint}; or name the parameter after an upstream step, or "
                    "declare it in the workflow's input schema",
                )
            )
        if not bound:
            del step["input"]
    if problems:
        raise DefinitionError(problems)


def _bindings(
    step: dict[str, Any], function: Callable[..., Any], others: set[Any], schema: Any
) -> dict[str, str]:
    properties = schema.get("properties") if isinstance(schema, Mapping) else None
    required = schema.get("required", ()) if isinstance(schema, Mapping) else ()
    bound: dict[str, str] = {}
    for name, param in (keyword_parameters(function) or {}).items():
        optional = param.default is not param.empty
        if name in others:
            bound[name] = f"{{{{ steps.{name}.output }}}}"
            depends = list(step.get("depends_on", []))
            step["depends_on"] = depends if name in depends else [*depends, name]
        elif (not optional and not isinstance(properties, Mapping)) or (
            isinstance(properties, Mapping)
            and name in properties
            and (not optional or name in required)
        ):
            bound[name] = f"{{{{ inputs.{name} }}}}"
    return bound


def _key(name: str) -> str:
    return name[:-1] if name.endswith("_") else name


def _plain(value: Any) -> Any:
    if isinstance(value, Steps):
        return value.to_list()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value
