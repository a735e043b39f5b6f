"""Run state: the mutable, materialised state of one run that ``decide`` advances.

The runtime owns a RunState and hands it to ``decide`` with each event; ``decide``
updates it in place (copying a whole run per event would make a 10,000-step run
quadratic). Everything here is plain data — strings, numbers, lists, dicts — so a
store can serialise it and restore it between any two events.

Step keys name step *instances*: a top-level step's key is its id; a step inside
iteration 2 of loop ``poll`` is ``poll@2/check``; item 3 of map ``fan`` is
``fan[3]``. A *scope* is one instance of a graph (the top level, one loop
iteration, one map item) and is keyed by the prefix its step keys share
(``""``, ``"poll@2/"``, ``"fan[3]/"``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from tideflow.errors import InputValidationError
from tideflow.model.events import ErrorInfo
from tideflow.model.plan import Priority
from tideflow.model.states import RUN_TERMINAL, RunStatus, StepStatus

TimerKind = Literal[
    "run_timeout",
    "attempt_timeout",
    "schedule_to_start",
    "step_timeout",
    "deadline",
    "retry",
    "wait_timeout",
    "sleep",
    "loop_delay",
    "compensation_timeout",
    "compensation_retry",
]


@dataclass(slots=True, kw_only=True)
class TimerRef:
    kind: TimerKind
    step_key: str = ""
    attempt: int = 0
    fire_at: float = 0.0


@dataclass(slots=True, kw_only=True)
class MapProgress:
    total: int
    items: list[Any] = field(default_factory=list)
    next_index: int = 0
    running: int = 0
    done: int = 0
    failures: int = 0
    outputs: list[Any] = field(default_factory=list)
    retry: list[int] = field(default_factory=list)
    """Indices of items an operator retry runs again, before ``next_index`` goes on."""


@dataclass(slots=True, kw_only=True)
class StepState:
    key: str
    step_id: str
    scope: str
    """The prefix of the scope this instance belongs to."""
    status: StepStatus = StepStatus.PENDING
    attempts: int = 0
    """Executions of the step's action so far (the current attempt's number)."""
    attempt_started_at: float | None = None
    """When a worker started the current attempt (``TaskStarted``); None while it is only
    dispatched. Its ``timeout`` counts from here."""
    start_delivery: int = 0
    """The bus delivery of the current attempt's task whose start was recorded last (0:
    none): a start of a delivery already recorded is the same event delivered twice."""
    input: Any = None
    output: Any = None
    error: ErrorInfo | None = None
    started_at: float | None = None
    finished_at: float | None = None
    seq: int = 0
    """Completion order among succeeded steps (1-based), for compensation."""
    deps_done: int = 0
    deps_ok: int = 0
    deps_skipped: int = 0
    deadline_at: float | None = None
    timers: tuple[str, ...] = ()
    """Ids of the timers armed for this instance (a tuple: see core/timers.py)."""
    map: MapProgress | None = None
    iteration: int = 0
    """For a loop: the current iteration."""
    child_run_id: str | None = None


@dataclass(slots=True, kw_only=True)
class ScopeState:
    prefix: str
    parent: str | None
    """The prefix of the enclosing scope (None for the top level)."""
    owner: str | None
    """The key of the loop or map step that owns this scope (None for the top level)."""
    kind: Literal["top", "loop", "map_item"]
    vars: dict[str, Any] = field(default_factory=dict)
    keys: list[str] = field(default_factory=list)
    """The step keys of this scope."""
    remaining: int = 0
    """How many of ``keys`` are not terminal yet."""
    closing: bool = False
    """Set while the scope is being failed or cancelled, and once it is done: no further
    scheduling."""


@dataclass(slots=True, kw_only=True)
class BufferedSignal:
    event_id: str
    name: str
    payload: Any
    time: float


@dataclass(slots=True, kw_only=True)
class CompensationState:
    queue: list[str]
    """Step keys to compensate, in the order they will run (reverse completion)."""
    index: int = 0
    attempt: int = 0
    started_at: float | None = None
    """When a worker started the current attempt (``TaskStarted``); None while it is only
    dispatched. Its ``timeout`` counts from here, as an action attempt's does."""
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Step key -> {status, attempts, error} of its compensation."""
    failed: list[str] = field(default_factory=list)
    ends: str = "compensated"
    """The run status once every compensation succeeded: ``compensated`` after a failure,
    ``cancelled`` or ``timed_out`` when a cancel or the run timeout started it."""

    @property
    def current(self) -> str | None:
        return self.queue[self.index] if self.index < len(self.queue) else None


@dataclass(slots=True, kw_only=True)
class RunState:
    run_id: str
    workflow: str
    version: str
    plan_hash: str
    status: RunStatus = RunStatus.PENDING
    input: Any = None
    output: Any = None
    error: ErrorInfo | None = None
    created_at: float = 0.0
    started_at: float | None = None
    finished_at: float | None = None
    parent_run_id: str | None = None
    parent_step_key: str | None = None
    steps: dict[str, StepState] = field(default_factory=dict)
    scopes: dict[str, ScopeState] = field(default_factory=dict)
    timers: dict[str, TimerRef] = field(default_factory=dict)
    waiting: dict[str, list[str]] = field(default_factory=dict)
    """Signal name -> keys of ``wait`` steps waiting for it, in the order they started."""
    correlated: dict[str, str] = field(default_factory=dict)
    """Key of a waiting step whose ``match`` is indexed -> its wait row
    (``plan.correlation_row``): the store finds it by that row, not by its signal name."""
    signals: list[BufferedSignal] = field(default_factory=list)
    """Signals that arrived while no wait matched them, oldest first."""
    seen_signals: set[str] = field(default_factory=set)
    completed_seq: int = 0
    compensable: list[str] = field(default_factory=list)
    """Keys of succeeded steps that declare `compensate`, in completion order."""
    compensate_requested: bool = False
    compensation: CompensationState | None = None
    retries: int = 0
    """How many times an operator retried the run (``RunRetried``)."""
    trace: str | None = None
    """The W3C ``traceparent`` of the run's span, fixed when the run was created with
    tracing on (tideflow.observability.tracing); None otherwise. No event changes it."""
    priority: Priority = Priority.NORMAL
    """The run's place in its engine's admission queue (runtime/admission.py): pending
    runs are admitted high before normal before low, then oldest first. Fixed when the
    run is created."""

    @property
    def is_terminal(self) -> bool:
        return self.status in RUN_TERMINAL


def new_run_state(
    *,
    run_id: str,
    workflow: str,
    version: str,
    plan_hash: str,
    created_at: float,
    parent_run_id: str | None = None,
    parent_step_key: str | None = None,
    trace: str | None = None,
    priority: Priority = Priority.NORMAL,
) -> RunState:
    """A pending run; ``RunStarted`` makes it run."""
    return RunState(
        run_id=run_id,
        workflow=workflow,
        version=version,
        plan_hash=plan_hash,
        created_at=created_at,
        parent_run_id=parent_run_id,
        parent_step_key=parent_step_key,
        trace=trace,
        priority=priority,
    )


def run_priority(priority: Priority | str | None) -> Priority:
    """A run's priority as given to ``start`` (None: normal); a clear error for another
    word."""
    if priority is None:
        return Priority.NORMAL
    try:
        return Priority(priority)
    except ValueError:
        raise InputValidationError(
            f"priority {priority!r}: give high, normal or low (the run's place in the "
            "queue of runs waiting to be admitted)"
        ) from None
