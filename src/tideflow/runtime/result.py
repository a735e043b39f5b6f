"""What a finished (or running) run looks like to a caller: the shape of `tideflow run --json`."""

from __future__ import annotations

from dataclasses import dataclass, field
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
    by_step, names = _sensitive(plan)
    output = state.output
    return RunResult(
        run_id=state.run_id,
        workflow=state.workflow,
        version=state.version,
        status=state.status._value_,  # the attribute: .value is a property (two calls)
        output=output if output is None else mask(output, names),
        error=state.error.to_dict() if state.error else None,
        steps={
            key: StepResult(
                status=st.status._value_,
                attempts=st.attempts,
                # masked where it is made: no second walk over the steps, no copy
                output=(
                    st.output if st.output is None else mask(st.output, by_step.get(st.step_id, ()))
                ),
                error=st.error.to_dict() if st.error else None,
            )
            for key, st in state.steps.items()
        },
        compensation=_compensation(state),
    )


def plan_sensitive(plan: Plan | None) -> list[str]:
    """Every field name the plan's steps declare sensitive (what a run-wide value, such
    as the run's output or a history event, is masked by)."""
    return _sensitive(plan)[1]


_Sensitive = tuple[dict[str, tuple[str, ...]], list[str]]
"""Step id -> the names that step declares sensitive (steps that declare some), and
every name of the plan, sorted."""

_NOTHING: _Sensitive = ({}, [])

_SENSITIVE: dict[str, _Sensitive] = {}
"""Plan hash -> ``_sensitive`` (every run's result asks for it: a plan is read once)."""


def _sensitive(plan: Plan | None) -> _Sensitive:
    if plan is None:
        return _NOTHING
    known = _SENSITIVE.get(plan.hash)
    if known is None:
        if len(_SENSITIVE) >= 1024:  # plans are few; a bound all the same
            _SENSITIVE.clear()
        by_step = {sid: spec.sensitive for sid, spec in plan.specs.items() if spec.sensitive}
        names = sorted({name for declared in by_step.values() for name in declared})
        known = _SENSITIVE[plan.hash] = (by_step, names) if by_step else _NOTHING
    return known


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
