"""What a finished (or running) run looks like to a caller: the shape of `tideflow run --json`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tideflow.model.run import RunState


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

    @property
    def succeeded(self) -> bool:
        return self.status == "succeeded"

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "status": self.status,
            "output": self.output,
            "error": self.error,
            "steps": {key: step.to_dict() for key, step in self.steps.items()},
        }


def result_of(state: RunState) -> RunResult:
    """The caller's view of a run state."""
    return RunResult(
        run_id=state.run_id,
        workflow=state.workflow,
        version=state.version,
        status=state.status.value,
        output=state.output,
        error=state.error.to_dict() if state.error else None,
        steps={
            key: StepResult(
                status=st.status.value,
                attempts=st.attempts,
                output=st.output,
                error=st.error.to_dict() if st.error else None,
            )
            for key, st in state.steps.items()
        },
    )
