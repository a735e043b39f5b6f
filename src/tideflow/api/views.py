"""What the web UI reads beyond the REST basics: a plan's drawing, a run's state by plan
step (instances collapsed, so a 10,000-item map is one node with counts), one step's
instances a page at a time, and the attempts for the timeline. Reusable by any caller
(the remote CLI reads ``waiting_for`` from ``RunStateView``)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from pydantic import BaseModel, Field

from tideflow.api.models import Title
from tideflow.api.times import Time
from tideflow.model.masking import mask
from tideflow.model.plan import Plan
from tideflow.model.run import RunState, StepState
from tideflow.model.states import StepStatus
from tideflow.runtime import shown
from tideflow.store.base import HistoryEntry, RunSummary
from tideflow.ui.layout import NODE_HEIGHT, NODE_WIDTH, layout

__all__ = [
    "AttemptList",
    "PlanGraph",
    "RunStateView",
    "StepInstances",
    "attempts_of",
    "instances_of",
]

ACTIVE_FIRST = (
    StepStatus.RUNNING.value,
    "compensating",
    StepStatus.RETRYING.value,
    StepStatus.WAITING.value,
    StepStatus.READY.value,
    "compensation_failed",
    StepStatus.FAILED.value,
    StepStatus.PENDING.value,
    StepStatus.CANCELLED.value,
    "compensated",
    StepStatus.SUCCEEDED.value,
    StepStatus.SKIPPED.value,
)
"""Which status a plan step with instances in several shows: the most pressing one (a
step's shown state, ``runtime/shown.py``: a compensated step shows ``compensated``)."""
_SETTLED = {"succeeded", "skipped", "cancelled", "compensated"}


class GraphNode(BaseModel):
    id: str
    type: str
    layer: int
    x: float
    y: float
    parent: str | None = Field(description="The loop or map the step belongs to")


class GraphEdge(BaseModel):
    source: str
    target: str
    label: str | None = Field(description="A switch case's condition, or `default`")
    nested: bool = Field(description="From a loop or map to its body")
    points: list[tuple[float, float]] = Field(
        description="The line: the source's bottom, a bend per layer crossed, the target's top"
    )


class PlanGraph(BaseModel):
    name: str
    title: Title = None
    version: str
    hash: str
    width: float
    height: float
    node_width: float
    node_height: float
    nodes: list[GraphNode]
    edges: list[GraphEdge]

    @classmethod
    def of(cls, plan: Plan) -> PlanGraph:
        drawn = layout(plan)
        return cls(
            name=plan.name,
            title=plan.title,
            version=plan.version,
            hash=plan.hash,
            width=drawn.width,
            height=drawn.height,
            node_width=NODE_WIDTH,
            node_height=NODE_HEIGHT,
            nodes=[GraphNode(**_fields(n)) for n in drawn.nodes],
            edges=[GraphEdge(**_fields(e)) for e in drawn.edges],
        )


def _fields(obj: Any) -> dict[str, Any]:
    return {name: getattr(obj, name) for name in obj.__slots__}


class StepGroup(BaseModel):
    """One plan step: all its instances (loop iterations, map items) together."""

    status: str = Field(
        description="The most pressing shown state among its instances (a step state, or "
        "compensating, compensated, compensation_failed: runtime/shown.py)"
    )
    instances: int
    counts: dict[str, int] = Field(description="Instances by status")
    attempts: int = Field(description="Attempts of all its instances")
    started_at: Time | None
    finished_at: Time | None


class Waiting(BaseModel):
    step_key: str
    signal: str
    since: Time | None


class RunStateView(BaseModel):
    run_id: str
    workflow: str
    title: Title = None
    version: str
    status: str
    plan_hash: str
    output: Any
    error: dict[str, Any] | None
    created_at: Time
    updated_at: Time
    finished_at: Time | None
    steps: dict[str, StepGroup] = Field(description="By plan step id (not by instance)")
    waiting_for: list[Waiting] = Field(description="The signals the run waits for now")

    @classmethod
    def of(cls, state: RunState, plan: Plan, summary: RunSummary, output: Any) -> RunStateView:
        """``output``: the run's output as a person may see it (``result_of``)."""
        by_step: dict[str, list[StepState]] = {}
        compensations = _compensations(state)
        for step in state.steps.values():
            by_step.setdefault(step.step_id, []).append(step)
        return cls(
            run_id=state.run_id,
            workflow=state.workflow,
            title=plan.title,
            version=state.version,
            status=state.status.value,
            plan_hash=state.plan_hash,
            output=output,
            error=state.error.to_dict() if state.error else None,
            created_at=summary.created_at,
            updated_at=summary.updated_at,
            finished_at=summary.finished_at,
            steps={step_id: _group(steps, compensations) for step_id, steps in by_step.items()},
            waiting_for=_waiting(state, plan),
        )


def _group(steps: list[StepState], compensations: dict[str, str]) -> StepGroup:
    counts = Counter(_shown(s, compensations) for s in steps)
    starts = [s.started_at for s in steps if s.started_at is not None]
    ends = [s.finished_at for s in steps if s.finished_at is not None]
    status = next(s for s in ACTIVE_FIRST if s in counts)
    if status in _SETTLED and StepStatus.PENDING.value in counts:
        status = StepStatus.RUNNING.value  # some done, some to come: in progress
    return StepGroup(
        status=status,
        instances=len(steps),
        counts=dict(counts),
        attempts=sum(s.attempts for s in steps),
        started_at=min(starts, default=None),
        finished_at=max(ends, default=None) if len(ends) == len(steps) else None,
    )


def _shown(step: StepState, compensations: dict[str, str]) -> str:
    return shown.step_shown(step.status.value, compensations.get(step.key))


def _compensations(state: RunState) -> dict[str, str]:
    comp = state.compensation
    return shown.compensation_of(comp.results) if comp is not None else {}


def _waiting(state: RunState, plan: Plan) -> list[Waiting]:
    out = []
    for step in state.steps.values():
        spec = plan.specs.get(step.step_id)
        if step.status is StepStatus.WAITING and spec is not None and spec.wait is not None:
            out.append(Waiting(step_key=step.key, signal=spec.wait.signal, since=step.started_at))
    return out


class StepInstance(BaseModel):
    key: str
    status: str
    attempts: int
    input: Any
    output: Any
    error: dict[str, Any] | None
    started_at: Time | None
    finished_at: Time | None
    child_run_id: str | None


class StepInstances(BaseModel):
    run_id: str
    step: str
    type: str
    signal: str | None = Field(description="What a `wait` step waits for")
    total: int
    offset: int
    instances: list[StepInstance]


def instances_of(
    state: RunState, plan: Plan, step_id: str, offset: int, limit: int
) -> StepInstances:
    """The instances of plan step ``step_id`` (sensitive fields masked), one page.
    KeyError for a step the plan does not have."""
    spec = plan.specs[step_id]
    keys = [s for s in state.steps.values() if s.step_id == step_id]
    page = keys[offset : offset + limit]
    compensations = _compensations(state)
    return StepInstances(
        run_id=state.run_id,
        step=step_id,
        type=spec.type,
        signal=spec.wait.signal if spec.wait is not None else None,
        total=len(keys),
        offset=offset,
        instances=[
            StepInstance(
                key=s.key,
                status=_shown(s, compensations),
                attempts=s.attempts,
                input=mask(s.input, spec.sensitive),
                output=mask(s.output, spec.sensitive),
                error=s.error.to_dict() if s.error else None,
                started_at=s.started_at,
                finished_at=s.finished_at,
                child_run_id=s.child_run_id,
            )
            for s in page
        ],
    )


class AttemptRow(BaseModel):
    step_key: str
    round: int
    attempt: int
    compensation: bool
    started_at: Time | None
    ended_at: Time | None
    outcome: str = Field(
        description="running, succeeded, failed, cancelled, lost or timed_out (the attempt "
        "ended by a clock: its timeout, the step's deadline, the run's timeout)"
    )
    worker: str
    error: str | None


class AttemptList(BaseModel):
    run_id: str
    total: int
    attempts: list[AttemptRow] = Field(description="In the order they started, `limit` at most")


def attempts_of(run_id: str, history: list[HistoryEntry], limit: int) -> AttemptList:
    """Every attempt of the run's history, with its start, end and outcome
    (``runtime/shown.py`` decides them, for every view)."""
    listed = [AttemptRow(**_fields(row)) for row in shown.attempts_of(history)]
    return AttemptList(run_id=run_id, total=len(listed), attempts=listed[:limit])
