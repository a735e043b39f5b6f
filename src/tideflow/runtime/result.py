"""What a finished (or running) run looks like to a caller: the shape of `tideflow run --json`."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from tideflow.model.masking import mask
from tideflow.model.plan import Plan
from tideflow.model.quick import quick_init
from tideflow.model.run import RunState
from tideflow.model.states import RunStatus


@quick_init  # a result has one per step
@dataclass(frozen=True, slots=True, kw_only=True)
class StepResult:
    status: str
    attempts: int
    """How many times the step's action was executed (0 for engine steps and skipped steps)."""
    output: Any = None
    error: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "attempts": self.attempts,
            "output": self.output,
            "error": self.error,
        }


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class RunResult:
    run_id: str
    workflow: str
    version: str
    status: str
    output: Any = None
    error: dict[str, Any] | None = None
    """``{"type", "message"}`` or None."""
    steps: dict[str, StepResult] = field(default_factory=dict)
    """Keyed by step key: the step id, or ``loop@2/inner`` / ``map[3]`` for nested instances."""
    compensation: dict[str, Any] | None = None
    """When compensations ran: ``{"outcome": "compensating" | "compensated" |
    "compensation_failed", "steps": {step key: {status, attempts, error}}}``, newest first."""

    @property
    def succeeded(self) -> bool:
        return self.status == "succeeded"

    def to_dict(self) -> dict[str, Any]:
        out = {
            "run_id": self.run_id,
            "status": self.status,
            "output": self.output,
            "error": self.error,
            "steps": {key: step.to_dict() for key, step in self.steps.items()},
        }
        if self.compensation is not None:
            out["compensation"] = self.compensation
        return out


def result_of(state: RunState, plan: Plan | None = None) -> RunResult:
    """The caller's view of a run state, masked by the one set of rules
    (``tideflow.model.masking``): keys that name a credential everywhere, and with the
    plan the fields a step marks `sensitive` in its output (the run's output: those of
    every step). The run state itself keeps the values."""
    result = _result(state)
    specs = plan.specs if plan is not None else {}
    for key, step in result.steps.items():
        spec = specs.get(state.steps[key].step_id)
        masked = mask(step.output, spec.sensitive if spec is not None else ())
        if masked is not step.output:
            result.steps[key] = replace(step, output=masked)  # a dict of this result's own
    output = mask(result.output, plan_sensitive(plan))
    return result if output is result.output else replace(result, output=output)


def plan_sensitive(plan: Plan | None) -> list[str]:
    """Every field name the plan's steps declare sensitive (what a run-wide value, such
    as the run's output or a history event, is masked by)."""
    if plan is None:
        return []
    names = _PLAN_SENSITIVE.get(plan.hash)
    if names is None:
        if len(_PLAN_SENSITIVE) >= 1024:  # plans are few; a bound all the same
            _PLAN_SENSITIVE.clear()
        names = sorted({name for spec in plan.specs.values() for name in spec.sensitive})
        _PLAN_SENSITIVE[plan.hash] = names
    return names


_PLAN_SENSITIVE: dict[str, list[str]] = {}
"""Plan hash -> ``plan_sensitive`` (every run's result asks for it)."""


def _result(state: RunState) -> RunResult:
    return RunResult(
        run_id=state.run_id,
        workflow=state.workflow,
        version=state.version,
        status=state.status._value_,  # the attribute: .value is a property (two calls)
        output=state.output,
        error=state.error.to_dict() if state.error else None,
        steps={
            key: StepResult(
                status=st.status._value_,
                attempts=st.attempts,
                output=st.output,
                error=st.error.to_dict() if st.error else None,
            )
            for key, st in state.steps.items()
        },
        compensation=_compensation(state),
    )


def _compensation(state: RunState) -> dict[str, Any] | None:
    comp = state.compensation
    if comp is None:
        return None
    if state.status is RunStatus.COMPENSATING:
        outcome = "compensating"
    else:
        outcome = "compensation_failed" if comp.failed else "compensated"
    steps = {key: dict(comp.results[key]) for key in comp.queue if key in comp.results}
    return {"outcome": outcome, "steps": steps}
