"""RunState to and from JSON-compatible data, for stores and for crash tests.

The format carries a ``format`` number; a state written by a newer format is
refused with a clear error instead of being misread.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import Any

import orjson

from tideflow.errors import StateFormatError as StateFormatError  # lives in the one tree
from tideflow.model.commands import (
    CancelChildRun,
    CancelTask,
    CancelTimer,
    Command,
    DispatchTask,
    EmitEvent,
    RunFinished,
    StartChildRun,
    StartTimer,
)
from tideflow.model.events import (
    EVENT_KINDS,
    EVENT_TYPES,
    AttemptEvent,
    ChildRunFinished,
    EngineFailed,
    ErrorInfo,
    Event,
    TaskFailed,
    Transition,
)
from tideflow.model.plan import Priority
from tideflow.model.run import (
    BufferedSignal,
    CompensationState,
    MapProgress,
    RunState,
    ScopeState,
    StepState,
    TimerRef,
)
from tideflow.model.states import RunStatus, StepStatus

FORMAT = 1


_READERS: dict[type, Callable[[Any], dict[str, Any]]] = {}


def _shallow(obj: Any) -> dict[str, Any]:
    """A dataclass's fields as a dict, values as they are (``asdict`` copies every nested
    value, which costs most of a snapshot; the result here is serialised at once)."""
    kind = type(obj)
    read = _READERS.get(kind)
    if read is None:
        read = _READERS[kind] = _reader(kind)
    return read(obj)


def _reader(
    kind: type, special: dict[str, str] | None = None, names: dict[str, Any] | None = None
) -> Callable[[Any], dict[str, Any]]:
    """A function that reads the fields of a ``kind`` into a dict, written out field by
    field as ``dataclasses`` writes ``__init__`` (twice as fast as a loop that calls
    ``getattr`` per name: a snapshot reads every field of every step). ``special`` gives
    the expression of a field that is not taken as it is (over ``obj``, with ``names``)."""
    special = special or {}
    items = ", ".join(f"{f.name!r}: {special.get(f.name, f'obj.{f.name}')}" for f in fields(kind))
    namespace: dict[str, Any] = dict(names or {})
    exec(f"def read(obj):\n    return {{{items}}}\n", namespace)
    read: Callable[[Any], dict[str, Any]] = namespace["read"]
    return read


def error_to_data(error: ErrorInfo | None) -> dict[str, Any] | None:
    if error is None:
        return None
    data = _shallow(error)
    data["classes"] = list(error.classes)
    data["causes"] = [dict(cause) for cause in error.causes]
    return data


def error_from_data(data: dict[str, Any] | None) -> ErrorInfo | None:
    if data is None:
        return None
    causes = tuple(dict(cause) for cause in data.get("causes") or ())
    return ErrorInfo(**{**data, "classes": tuple(data.get("classes") or ()), "causes": causes})


_step_to_data = _reader(
    StepState,
    # One call per step, not six: a snapshot converts every step of the run. The status
    # is read from the member's ``_value_`` (``value`` is a property: two calls).
    {
        "status": "obj.status._value_",
        "error": "None if obj.error is None else error_to_data(obj.error)",
        "map": "None if obj.map is None else _shallow(obj.map)",
        "timers": "list(obj.timers)",
    },
    {"error_to_data": error_to_data, "_shallow": _shallow},
)


def _step_from_data(data: dict[str, Any]) -> StepState:
    data = dict(data)
    data["status"] = StepStatus(data["status"])
    data["error"] = error_from_data(data["error"])
    data["map"] = MapProgress(**data["map"]) if data["map"] is not None else None
    data["timers"] = tuple(data.get("timers") or ())
    return StepState(**data)


def state_to_data(state: RunState) -> dict[str, Any]:
    comp = state.compensation
    return {
        "format": FORMAT,
        "run_id": state.run_id,
        "workflow": state.workflow,
        "version": state.version,
        "plan_hash": state.plan_hash,
        "status": state.status._value_,
        "input": state.input,
        "output": state.output,
        "error": error_to_data(state.error),
        "created_at": state.created_at,
        "started_at": state.started_at,
        "finished_at": state.finished_at,
        "parent_run_id": state.parent_run_id,
        "parent_step_key": state.parent_step_key,
        "steps": [_step_to_data(st) for st in state.steps.values()],
        "scopes": [_shallow(scope) for scope in state.scopes.values()],
        "timers": {tid: _shallow(ref) for tid, ref in state.timers.items()},
        "waiting": state.waiting,
        "correlated": state.correlated,
        "signals": [_shallow(sig) for sig in state.signals],
        "seen_signals": sorted(state.seen_signals),
        "completed_seq": state.completed_seq,
        "compensable": state.compensable,
        "compensate_requested": state.compensate_requested,
        "compensation": _shallow(comp) if comp is not None else None,
        "retries": state.retries,
        "trace": state.trace,
        "priority": state.priority._value_,
    }


def state_from_data(data: dict[str, Any]) -> RunState:
    version = data.get("format")
    if version != FORMAT:
        raise StateFormatError(
            f"run {data.get('run_id')!r}: state format {version!r} is not readable by this version "
            f"(reads format {FORMAT}); upgrade tideflow to read it"
        )
    try:
        return _build(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise StateFormatError(
            f"run {data.get('run_id')!r}: stored state is damaged ({exc})"
        ) from None


def _build(data: dict[str, Any]) -> RunState:
    steps = [_step_from_data(s) for s in data["steps"]]
    comp = data["compensation"]
    return RunState(
        run_id=data["run_id"],
        workflow=data["workflow"],
        version=data["version"],
        plan_hash=data["plan_hash"],
        status=RunStatus(data["status"]),
        input=data["input"],
        output=data["output"],
        error=error_from_data(data["error"]),
        created_at=data["created_at"],
        started_at=data["started_at"],
        finished_at=data["finished_at"],
        parent_run_id=data["parent_run_id"],
        parent_step_key=data["parent_step_key"],
        steps={st.key: st for st in steps},
        scopes={s["prefix"]: ScopeState(**s) for s in data["scopes"]},
        timers={tid: TimerRef(**ref) for tid, ref in data["timers"].items()},
        waiting={k: list(v) for k, v in data["waiting"].items()},
        correlated=dict(data.get("correlated") or {}),  # absent before correlation rows
        signals=[BufferedSignal(**s) for s in data["signals"]],
        seen_signals=set(data["seen_signals"]),
        completed_seq=data["completed_seq"],
        compensable=list(data["compensable"]),
        compensate_requested=data["compensate_requested"],
        compensation=CompensationState(**comp) if comp is not None else None,
        retries=data.get("retries", 0),
        trace=data.get("trace"),  # absent before tracing
        priority=Priority(data.get("priority", "normal")),  # absent before admission
    )


def dumps(state: RunState) -> bytes:
    return orjson.dumps(state_to_data(state))


def loads(raw: bytes | str) -> RunState:
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise StateFormatError(f"stored run state is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise StateFormatError("stored run state is not a JSON object")
    return state_from_data(data)


# -- events and commands ----------------------------------------------------------

_COMMAND_TYPES: dict[str, type[Command]] = {
    cls.__name__: cls
    for cls in (
        DispatchTask,
        CancelTask,
        StartTimer,
        CancelTimer,
        StartChildRun,
        CancelChildRun,
        EmitEvent,
        RunFinished,
    )
}


_ATTEMPT_KINDS = frozenset(
    kind for cls, kind in EVENT_KINDS.items() if issubclass(cls, AttemptEvent)
)
"""Kinds of the events that report an attempt: one stored or sent without ``round`` is
from a version before rounds (``AttemptEvent.round`` None: the run's current round)."""


def event_kind(event: Event) -> str:
    return EVENT_KINDS[type(event)]


def event_to_data(event: Event) -> dict[str, Any]:
    data = _shallow(event)
    data["kind"] = EVENT_KINDS[type(event)]
    if isinstance(event, TaskFailed | ChildRunFinished | EngineFailed):
        data["error"] = error_to_data(event.error)
    if data.get("logs", 0) is None:  # an attempt that wrote nothing stores nothing of it
        del data["logs"]
    return data


def event_from_data(data: dict[str, Any], *, run_id: str | None = None) -> Event:
    """Rebuild an event; an unknown kind or damaged row is a clear StateFormatError."""
    data = dict(data)
    kind = data.pop("kind", None)
    cls = EVENT_TYPES.get(str(kind))
    where = f"run {run_id or data.get('run_id')!r}"
    if cls is None:
        known = ", ".join(sorted(EVENT_TYPES))
        raise StateFormatError(
            f"{where}: history holds an event of unknown type {kind!r} "
            f"(this version knows: {known}); it was written by a newer tideflow or is damaged"
        )
    if "error" in data and data["error"] is not None:
        data["error"] = error_from_data(data["error"])
    if kind in _ATTEMPT_KINDS and "round" not in data:
        data["round"] = None
    try:
        return cls(**data)
    except TypeError as exc:
        raise StateFormatError(f"{where}: history event {kind!r} is damaged ({exc})") from None


def command_to_data(command: Command) -> dict[str, Any]:
    data = _shallow(command)
    data["command"] = type(command).__name__
    if isinstance(command, RunFinished):
        data["error"] = error_to_data(command.error)
    if isinstance(command, DispatchTask):
        data["priority"] = command.priority.value
        data["sensitive"] = list(command.sensitive)
        data["secrets"] = list(command.secrets)
    return data


def command_from_data(data: dict[str, Any]) -> Command:
    data = dict(data)
    name = data.pop("command", None)
    cls = _COMMAND_TYPES.get(str(name))
    if cls is None:
        raise StateFormatError(f"outbox holds a command of unknown type {name!r}")
    if cls is RunFinished:
        data["error"] = error_from_data(data.get("error"))
    if cls is DispatchTask:
        data["priority"] = Priority(data["priority"])
        data["sensitive"] = tuple(data["sensitive"])
        data["secrets"] = tuple(data["secrets"])
    try:
        return cls(**data)
    except TypeError as exc:
        raise StateFormatError(f"outbox command {name!r} is damaged ({exc})") from None


def transition_to_data(tr: Transition) -> dict[str, Any]:
    return {
        "subject": tr.subject,
        "old": tr.old,
        "new": tr.new,
        "time": tr.time,
        "cause": tr.cause,
        "attempt": tr.attempt,
    }
