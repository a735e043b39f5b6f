"""What a finished (or running) run looks like to a caller: the shape of `tideflow run --json`."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from tideflow.model.plan import Plan
from tideflow.model.quick import quick_init
from tideflow.model.run import RunState
from tideflow.model.states import RunStatus
from tideflow.worker.secrets import redact_fields


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
    """The caller's view of a run state; with the plan, fields a step marks `sensitive`
    are masked in its input and output (the run state itself keeps them)."""
    result = _result(state)
    if plan is None or not any(spec.sensitive for spec in plan.specs.values()):
        return result
    steps = dict(result.steps)
    for key, step in result.steps.items():
        spec = plan.specs.get(state.steps[key].step_id)
        if spec is not None and spec.sensitive:
            steps[key] = replace(step, output=redact_fields(step.output, spec.sensitive))
    return replace(result, steps=steps, output=_redact_output(result.output, plan))


def _redact_output(output: Any, plan: Plan) -> Any:
    names = sorted({name for spec in plan.specs.values() for name in spec.sensitive})
    return redact_fields(output, names)


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
