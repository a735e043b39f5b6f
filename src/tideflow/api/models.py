"""The bodies the API takes and returns (pydantic: the edge where untrusted data comes in,
and where `/openapi.json` gets its schemas)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_serializer
from pydantic_core import PydanticCustomError

from tideflow.api.times import Time, shown_time
from tideflow.bus.base import QueueStats, WorkerBeat
from tideflow.dsl.schema_values import NAME_RE
from tideflow.model.plan import Plan, Priority
from tideflow.model.states import SignalOutcome
from tideflow.runtime.result import RunResult
from tideflow.runtime.why import Diagnosis, WhyKind
from tideflow.store.base import DefinitionSummary, HistoryEntry, RunPage, RunSummary


class Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Health(BaseModel):
    status: Literal["ok"] = "ok"


class Ready(BaseModel):
    status: Literal["ready"] = "ready"


Title = Annotated[
    str | None,
    Field(description="The definition's `title:`: how people read its name (any language)"),
]


class CompiledDefinition(BaseModel):
    name: str
    title: Title = None
    version: str
    hash: str
    """The content hash runs pin."""
    steps: list[str]
    """The ids of the definition's steps."""

    @classmethod
    def of(cls, plan: Plan) -> CompiledDefinition:
        return cls(
            name=plan.name,
            title=plan.title,
            version=plan.version,
            hash=plan.hash,
            steps=list(plan.specs),
        )


class StoredDefinition(CompiledDefinition):
    source: dict[str, Any]
    """The definition in its normalised form."""

    @classmethod
    def of(cls, plan: Plan) -> StoredDefinition:
        compiled = CompiledDefinition.of(plan)
        return cls(**compiled.model_dump(), source=dict(plan.source))


class DefinitionRow(BaseModel):
    name: str
    title: Title = None
    version: str
    hash: str
    created_at: Time
    active: bool = Field(description="Whether the version starts new runs")

    @classmethod
    def of(cls, row: DefinitionSummary) -> DefinitionRow:
        return cls(
            name=row.name,
            title=row.title,
            version=row.version,
            hash=row.hash,
            created_at=row.created_at,
            active=row.active,
        )


class DefinitionActivity(BaseModel):
    name: str
    version: str
    active: bool
    changed: bool = Field(description="False when the version already was so")


class DefinitionList(BaseModel):
    definitions: list[DefinitionRow]


def _workflow_name(value: str) -> str:
    """A workflow name as the DSL writes it; anything else (a file path, a module) is
    refused with the same message whatever it names, and whatever exists on the server."""
    if NAME_RE.fullmatch(value) is None:
        raise PydanticCustomError(
            "workflow_name",
            "not a workflow name: a run is started by the name of a registered workflow "
            "(lower case letters, digits, '_', '.' and '-', first a letter or a digit), "
            "never by a file of the server; register a definition file first "
            "(`tideflow definitions register FILE`, or POST /definitions) and start it "
            "by its name",
        )
    return value


WorkflowName = Annotated[
    str,
    AfterValidator(_workflow_name),
    Field(
        min_length=1,
        json_schema_extra={"pattern": f"^{NAME_RE.pattern}$"},
        description="A registered workflow's name (never a file: docs/security.md).",
    ),
]


class StartRun(Request):
    workflow: WorkflowName
    version: str | None = Field(None, min_length=1, description="Default: the highest.")
    input: Any = None
    idempotency_key: str | None = Field(
        None, min_length=1, max_length=200, description="A second start with it starts nothing."
    )
    run_id: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]*$",
        description="The new run's id (default: a fresh one); a stored run's id is a 409 "
        "run-exists.",
    )
    priority: Priority | None = Field(
        None,
        description="The run's place in the queue of runs waiting to be admitted: high, "
        "normal (the default) or low (docs/concepts.md, Admission).",
    )


class StartedRun(BaseModel):
    run_id: str
    created: bool
    """False when the idempotency key named a run that exists already."""


class RunRow(BaseModel):
    run_id: str
    workflow: str
    title: Title = None
    version: str
    status: str
    created_at: Time
    updated_at: Time
    finished_at: Time | None
    parent_run_id: str | None
    output: Any
    error: dict[str, Any] | None

    @classmethod
    def of(cls, row: RunSummary) -> RunRow:
        return cls(**row.to_dict(), title=row.title)


class RunList(BaseModel):
    runs: list[RunRow]
    next_cursor: str | None
    """Pass as ``cursor`` for the next page; null on the last page."""

    @classmethod
    def of(cls, page: RunPage) -> RunList:
        return cls(runs=[RunRow.of(r) for r in page.runs], next_cursor=page.next_cursor)


class StepView(BaseModel):
    status: str
    attempts: int
    output: Any
    error: dict[str, Any] | None


class RunView(BaseModel):
    run_id: str
    workflow: str
    title: Title = None
    version: str
    status: str
    output: Any
    error: dict[str, Any] | None
    steps: dict[str, StepView]
    """By step key: the step id, or ``loop@2/inner`` / ``map[3]`` for nested instances."""
    compensation: dict[str, Any] | None
    created_at: Time
    updated_at: Time
    finished_at: Time | None
    parent_run_id: str | None

    @classmethod
    def of(cls, result: RunResult, summary: RunSummary) -> RunView:
        return cls(
            run_id=result.run_id,
            workflow=result.workflow,
            title=summary.title,
            version=result.version,
            status=result.status,
            output=result.output,
            error=result.error,
            steps={key: StepView(**step.to_dict()) for key, step in result.steps.items()},
            compensation=result.compensation,
            created_at=summary.created_at,
            updated_at=summary.updated_at,
            finished_at=summary.finished_at,
            parent_run_id=summary.parent_run_id,
        )


class HistoryRow(BaseModel):
    seq: int
    time: Time
    kind: str
    event: dict[str, Any] = Field(description="The event's fields; its `time` as every time")
    transitions: list[dict[str, Any]] = Field(
        description="`{subject, old, new, time, cause, attempt}`: the state changes it caused"
    )

    @field_serializer("event", when_used="json")
    def _event_times(self, event: dict[str, Any]) -> dict[str, Any]:
        return _with_times(event, _EVENT_TIMES)

    @field_serializer("transitions", when_used="json")
    def _transition_times(self, transitions: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [_with_times(t, ("time",)) for t in transitions]


_EVENT_TIMES = ("time", "started_at")
"""The fields of a stored event that hold a time."""


def _with_times(fields: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    out = dict(fields)
    for name in names:
        value = out.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[name] = shown_time(value)
    return out


class WhyReason(BaseModel):
    kind: WhyKind = Field(description="What the run (or one of its steps) waits on.")
    text: str = Field(description="One sentence for a person, with what to do if anything.")
    step: str | None = Field(None, description="The step instance's key, for a step's reason.")
    since: Time | None = None
    at: Time | None = Field(None, description="When it is due (a timer, a timeout).")
    data: dict[str, Any] = Field(default_factory=dict)


class WhyView(BaseModel):
    run_id: str
    status: str
    checked_at: Time
    reasons: list[WhyReason]

    @classmethod
    def of(cls, diagnosis: Diagnosis) -> WhyView:
        return cls.model_validate(diagnosis.to_dict())


class History(BaseModel):
    run_id: str
    events: list[HistoryRow] = Field(description="Everything that happened, in order")
    entries: list[HistoryRow] = Field(
        json_schema_extra={"deprecated": True},
        description="The same list as `events`, under the name before it; removed in the "
        "next release",
    )

    @classmethod
    def of(cls, run_id: str, entries: list[HistoryEntry]) -> History:
        rows = [HistoryRow(**e.to_dict()) for e in entries]
        return cls(run_id=run_id, events=rows, entries=rows)


class Reason(Request):
    reason: str | None = Field(None, min_length=1, max_length=1000)


class RunStatusView(BaseModel):
    run_id: str
    status: str


class SendSignal(Request):
    name: str = Field(min_length=1, max_length=200)
    payload: Any = None
    signal_id: str | None = Field(
        None, min_length=1, max_length=200, description="A redelivery with it is applied once."
    )


class SignalSent(BaseModel):
    run_id: str
    name: str
    signal_id: str | None
    status: SignalOutcome = Field(
        description="`delivered`, or `unmatched` when the run has ended (nothing changed)"
    )


class QueueRow(BaseModel):
    queue: str
    priority: str = Field(description="high, normal or low")
    depth: int = Field(description="Tasks waiting: published and not delivered")
    held: int = Field(description="Tasks delivered to a worker and not settled yet")
    oldest_age: float | None = Field(
        description="Seconds since the oldest waiting task was queued (null: none waits)"
    )
    consumers: int = Field(description="Workers reading the queue")

    @classmethod
    def of(cls, row: QueueStats) -> QueueRow:
        return cls(
            queue=row.queue,
            priority=row.priority.value,
            depth=row.depth,
            held=row.held,
            oldest_age=row.oldest_age,
            consumers=row.consumers,
        )


class QueueList(BaseModel):
    queues: list[QueueRow]
    unserved: list[str] = Field(description="Queues with tasks waiting and no consumer")


class WorkerRow(BaseModel):
    worker: str = Field(description="The worker's name: host/pid, as its attempts record it")
    queues: list[str] | None = Field(description="The queues it reads (null: every queue)")
    last_beat: Time = Field(description="Its last heartbeat")
    live: bool = Field(
        description="Still reading; false: it stopped without closing (its process died)"
    )

    @classmethod
    def of(cls, beat: WorkerBeat) -> WorkerRow:
        return cls(
            worker=beat.worker,
            queues=None if beat.queues is None else list(beat.queues),
            last_beat=beat.last_beat,
            live=beat.live,
        )


class WorkerList(BaseModel):
    workers: list[WorkerRow]


class ScheduleView(BaseModel):
    """A schedule and its next fire time (times ISO 8601 UTC)."""

    workflow: str
    id: str
    version: str | None = Field(description="The definition version it comes from")
    origin: str
    spec: dict[str, Any] = Field(description="The schedule's normal form (durations in seconds)")
    paused: bool
    next_slot: str | None = Field(description="The next slot (None: no slot left)")
    next_fire_at: str | None = Field(description="When it fires: the slot plus its jitter")
    last_slot: str | None
    last_run_id: str | None
    buffered_slot: str | None = Field(description="buffer_one: the slot waiting for its turn")


class ScheduleList(BaseModel):
    schedules: list[ScheduleView]


class ScheduleChange(BaseModel):
    workflow: str
    id: str
    paused: bool
    changed: bool = Field(description="False when the schedule already was so")


class ScheduleTriggered(BaseModel):
    workflow: str
    id: str
    run_id: str


class ScheduleDeleted(BaseModel):
    workflow: str
    id: str
    deleted: bool = True


class CreateSchedule(Request):
    workflow: str = Field(min_length=1, description="A registered workflow")
    schedule: dict[str, Any] = Field(
        description="One schedule as `schedule:` takes it, with an id: "
        '{"id": "nightly", "cron": "0 2 * * *", "timezone": "Europe/Paris"}'
    )
