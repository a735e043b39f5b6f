"""The Plan: the immutable, compiled form of a workflow definition.

A Plan is what the engine core runs. The DSL compiler builds it from a validated
definition; everything in it is already checked, durations are seconds, and
every expression and template is compiled. Step ids are unique across the whole
plan (nested loop bodies and map templates included), so ``Plan.specs`` is a
flat index and a step instance only needs its id to find its spec.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

import orjson

from tideflow.model.expressions import Expression, Template
from tideflow.model.schedules import ScheduleSpec

DEFAULT_SIGNAL_BUFFER = 24 * 3600.0
"""Seconds a `wait` without ``buffer`` keeps a signal that arrives before it starts."""

ENGINE_TYPES = frozenset({"set", "switch", "wait", "sleep", "map", "loop", "subflow", "emit"})


class Backoff(StrEnum):
    FIXED = "fixed"
    LINEAR = "linear"
    EXPONENTIAL = "exponential"


class OnError(StrEnum):
    FAIL = "fail"
    CONTINUE = "continue"
    COMPENSATE = "compensate"


class Priority(StrEnum):
    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    max_attempts: int = 1
    backoff: Backoff = Backoff.EXPONENTIAL
    initial_delay: float = 1.0
    multiplier: float = 2.0
    max_delay: float | None = None
    jitter: bool = False
    retry_on: tuple[str, ...] = ()
    """Error type names that may be retried; empty means every retryable error."""


NO_RETRY = RetryPolicy()


@dataclass(frozen=True, slots=True, kw_only=True)
class Join:
    kind: Literal["all", "any", "at_least"] = "all"
    at_least: int = 0
    cancel_others: bool = False


JOIN_ALL = Join()


@dataclass(frozen=True, slots=True, kw_only=True)
class Compensation:
    """The action that undoes a completed step."""

    type: str
    config: Template
    input: Template
    retry: RetryPolicy = NO_RETRY
    timeout: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class SwitchCase:
    when: Expression
    next: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class SwitchSpec:
    cases: tuple[SwitchCase, ...]
    default: tuple[str, ...] | None
    """Steps activated when no case matches; None means `default: fail`."""

    @property
    def targets(self) -> frozenset[str]:
        out: set[str] = set(self.default or ())
        for case in self.cases:
            out.update(case.next)
        return frozenset(out)


MAX_CORRELATION_KEY = 512
"""Characters of a correlation row name at most; a longer key is not indexed."""


def correlation_row(name: str, path: tuple[str, ...], value: Any) -> str | None:
    """The wait row a correlated wait (or a signal) is found under: the signal name, the
    path and the value's canonical JSON (an integral float as the integer, so 7 == 7.0;
    7 and "7" differ). None for a value JSON cannot hold or a key that is too long."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    try:
        text = orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:
        return None
    row = f"{name}\x1f{'.'.join(path)}\x1f{text}"
    return row if len(row) <= MAX_CORRELATION_KEY else None


@dataclass(frozen=True, slots=True, kw_only=True)
class Correlation:
    """A `wait`'s ``match`` reads ``signal.<path> == <key>`` (dsl/correlation.py)."""

    path: tuple[str, ...]
    """Where in the signal's payload the value is (``("data", "order_id")``)."""
    key: Expression
    """The value for this run, evaluated in the wait's scope when it starts."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WaitSpec:
    signal: str
    match: Expression | None = None
    timeout: float | None = None
    timeout_action: Literal["fail", "continue"] = "fail"
    correlation: Correlation | None = None
    """How a signal for this wait is found among many runs (None: by name only)."""
    buffer: float = DEFAULT_SIGNAL_BUFFER
    """Seconds a signal for ``signal`` that arrives while no wait takes it is kept for a
    wait that starts later (0: dropped)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TriggerSpec:
    """An event type that starts a run: ``triggers: [{event, match?, input?}]``."""

    event: str
    """The event type (a CloudEvent's ``type``)."""
    match: Expression | None = None
    """Over ``event`` (the whole event: ``event.data.…``); every event of the type when None."""
    input: Template | None = None
    """The run's input, over ``event``; the event's ``data`` when None."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SleepSpec:
    duration: float | None = None
    until: Template | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class MapSpec:
    items: Template
    template: str
    """The id of the template step (its spec is in Plan.specs)."""
    max_concurrency: int | None = None
    tolerated_failures: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Graph:
    """A DAG of steps: the top level of a plan, or the body of a loop."""

    steps: tuple[str, ...]
    """Step ids in definition order."""
    dependents: Mapping[str, tuple[str, ...]]
    roots: tuple[str, ...]
    sinks: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class LoopSpec:
    body: Graph
    until: Expression | None = None
    while_: Expression | None = None
    max_iterations: int
    delay: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class SubflowSpec:
    workflow: str
    version: str | None
    input: Template
    mode: Literal["sync", "async"] = "sync"


@dataclass(frozen=True, slots=True, kw_only=True)
class StepSpec:
    id: str
    type: str
    depends_on: tuple[str, ...] = ()
    join: Join = JOIN_ALL
    when: Expression | None = None
    retry: RetryPolicy = NO_RETRY
    timeout: float | None = None
    """Per attempt of an action step, counted from when a worker starts it."""
    schedule_to_start: float | None = None
    """How long an attempt of an action step may wait for a worker to start it."""
    idempotent: bool = True
    """False: a started attempt whose outcome was lost is not run again blindly."""
    deadline: float | None = None
    queue: str = "default"
    priority: Priority = Priority.NORMAL
    compensate: Compensation | None = None
    on_error: OnError = OnError.FAIL
    input: Template | None = None
    config: Template | None = None
    """Executor configuration of an action step (templated), e.g. ``function`` or ``url``."""
    description: str | None = None
    sensitive: tuple[str, ...] = ()
    set_values: Template | None = None
    switch: SwitchSpec | None = None
    wait: WaitSpec | None = None
    sleep: SleepSpec | None = None
    map: MapSpec | None = None
    loop: LoopSpec | None = None
    subflow: SubflowSpec | None = None
    emit: Template | None = None
    line: int | None = None
    """Where the step is defined, for messages."""

    # Derived once, when the spec is built: the core reads them on every attempt.
    is_action: bool = field(init=False, repr=False, compare=False)
    """Whether an executor runs the step (its type is not one of ``ENGINE_TYPES``)."""
    constant_action: bool = field(init=False, repr=False, compare=False)
    """An action with no ``when`` and no templates in its input and config: it needs no
    expression scope to start."""
    secrets: tuple[str, ...] = field(init=False, repr=False, compare=False)
    """The secret names the action's config and input templates reference, sorted."""
    compensation_secrets: tuple[str, ...] = field(init=False, repr=False, compare=False)
    """The same of its compensation's templates (empty without one)."""

    def __post_init__(self) -> None:
        action = self.type not in ENGINE_TYPES
        constant = (
            action
            and self.when is None
            and (self.input is None or self.input.is_constant)
            and (self.config is None or self.config.is_constant)
        )
        comp = self.compensate
        derived = {
            "is_action": action,
            "constant_action": constant,
            "secrets": _secret_names(self.config, self.input),
            "compensation_secrets": (
                _secret_names(comp.config, comp.input) if comp is not None else ()
            ),
        }
        for name, value in derived.items():
            object.__setattr__(self, name, value)


def _secret_names(*templates: Template | None) -> tuple[str, ...]:
    names: set[str] = set()
    for template in templates:
        if template is not None:
            names |= template.secret_references()
    return tuple(sorted(names))


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    name: str
    version: str
    hash: str
    """sha256 of the canonical JSON of the normalised definition."""
    graph: Graph
    specs: Mapping[str, StepSpec]
    title: str | None = None
    """How people read the workflow's name (``title:``, any language, NFC); ``name`` stays
    the ASCII id of URLs, queues and metrics. Shown beside or instead of the name."""
    description: str | None = None
    input_schema: Mapping[str, Any] | None = None
    timeout: float | None = None
    on_failure: OnError = OnError.FAIL
    output: Template | None = None
    triggers: tuple[TriggerSpec, ...] = ()
    """Events that start a run of this definition (``triggers:``)."""
    schedules: tuple[ScheduleSpec, ...] = ()
    """When runs of this definition start by themselves (``schedule:``)."""
    source: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    """The normalised definition the plan was compiled from (JSON-compatible)."""
    owners: Mapping[str, str] = field(default_factory=dict)
    """Nested step id -> the id of the loop or map step that contains it."""

    def __hash__(self) -> int:
        return hash(self.hash)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Plan) and other.hash == self.hash
