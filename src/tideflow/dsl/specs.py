"""Compiled parts of a normalised definition -> the immutable `Plan` and its `StepSpec`s."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import orjson

from tideflow.dsl.correlation import correlation_of
from tideflow.dsl.expr import compile_template
from tideflow.dsl.graph import TOP, StepEntry, StepIndex, build_graph
from tideflow.dsl.loader import Reporter
from tideflow.model.expressions import Template
from tideflow.model.plan import (
    DEFAULT_SIGNAL_BUFFER,
    NO_RETRY,
    Backoff,
    Compensation,
    Join,
    LoopSpec,
    MapSpec,
    OnError,
    Plan,
    Priority,
    RetryPolicy,
    SleepSpec,
    StepSpec,
    SubflowSpec,
    SwitchCase,
    SwitchSpec,
    TriggerSpec,
    WaitSpec,
)
from tideflow.model.schedules import ScheduleSpec

__all__ = ["build_plan", "plan_hash"]

# Looked up in dicts: calling an Enum by value is slow, and a plan may have 10,000 steps.
_PRIORITIES = {member.value: member for member in Priority}
_ON_ERROR = {member.value: member for member in OnError}


def plan_hash(normal: Mapping[str, Any]) -> str:
    return hashlib.sha256(orjson.dumps(normal, option=orjson.OPT_SORT_KEYS)).hexdigest()


def build_plan(
    normal: dict[str, Any],
    index: StepIndex,
    parts: Mapping[str, Mapping[str, Any]],
    output: Template | None,
    report: Reporter,
    triggers: tuple[TriggerSpec, ...] = (),
) -> Plan:
    specs = {
        step_id: _spec(entry, parts[step_id], index, report)
        for step_id, entry in index.entries.items()
    }
    return Plan(
        name=normal["name"],
        version=normal["version"],
        hash=plan_hash(normal),
        graph=build_graph(index, TOP),
        specs=specs,
        title=normal.get("title"),
        description=normal.get("description"),
        input_schema=normal.get("input"),
        timeout=normal.get("timeout"),
        on_failure=OnError(normal.get("on_failure", "fail")),
        output=output,
        triggers=triggers,
        schedules=tuple(ScheduleSpec.of(s) for s in normal.get("schedule", ())),
        source=normal,
        owners={s: e.owner for s, e in index.entries.items() if e.owner is not None},
    )


def _spec(
    entry: StepEntry, parts: Mapping[str, Any], index: StepIndex, report: Reporter
) -> StepSpec:
    data, kind = entry.data, entry.data["type"]
    position = report.positions.peek(entry.path)  # deferred (JSON) positions stay unread
    return StepSpec(
        id=entry.id,
        type=kind,
        depends_on=tuple(data.get("depends_on", ())),
        join=_join(data),
        when=parts.get("when"),
        retry=_retry_policy(data.get("retry")),
        timeout=None if kind == "wait" else data.get("timeout"),
        schedule_to_start=data.get("schedule_to_start"),
        idempotent=data.get("idempotent", True),
        deadline=data.get("deadline"),
        queue=data.get("queue", "default"),
        priority=_PRIORITIES[data.get("priority", "normal")],
        compensate=_compensation(data.get("compensate"), parts),
        on_error=_ON_ERROR[data.get("on_error", "fail")],
        input=parts.get("input"),
        config=parts.get("config"),
        description=data.get("description"),
        sensitive=tuple(data.get("sensitive", ())),
        line=position[0] if position else None,
        **_engine_spec(data, parts, index),
    )


def _join(data: Mapping[str, Any]) -> Join:
    join, cancel = data.get("join", "all"), bool(data.get("cancel_others", False))
    if isinstance(join, dict):
        return Join(kind="at_least", at_least=join["at_least"], cancel_others=cancel)
    return Join(kind="any", cancel_others=cancel) if join == "any" else Join()


def _retry_policy(retry: Mapping[str, Any] | None) -> RetryPolicy:
    if retry is None:
        return NO_RETRY
    return RetryPolicy(
        max_attempts=retry["max_attempts"],
        backoff=Backoff(retry.get("backoff", "exponential")),
        initial_delay=retry.get("initial_delay", 1.0),
        multiplier=retry.get("multiplier", 2.0),
        max_delay=retry.get("max_delay"),
        jitter=retry.get("jitter", False),
        retry_on=tuple(retry.get("retry_on", ())),
    )


def _compensation(data: Mapping[str, Any] | None, parts: Mapping[str, Any]) -> Compensation | None:
    if data is None:
        return None
    return Compensation(
        type=data["type"],
        config=parts["compensate.config"],
        input=parts["compensate.input"],
        retry=_retry_policy(data.get("retry")),
        timeout=data.get("timeout"),
    )


def _engine_spec(
    data: Mapping[str, Any], parts: Mapping[str, Any], index: StepIndex
) -> dict[str, Any]:
    kind = data["type"]
    if kind == "set":
        return {"set_values": parts["values"]}
    if kind == "switch":
        cases = zip(data["cases"], parts["cases"], strict=True)
        default = data["default"]
        return {
            "switch": SwitchSpec(
                cases=tuple(SwitchCase(when=w, next=tuple(c["next"])) for c, w in cases),
                default=None if default == "fail" else tuple(default),
            )
        }
    if kind == "emit":
        return {"emit": parts["event"]}
    builder = _ENGINE_SPECS.get(kind)
    return {kind: builder(data, parts, index)} if builder else {}


def _wait(data: Mapping[str, Any], parts: Mapping[str, Any], index: StepIndex) -> WaitSpec:
    return WaitSpec(
        signal=data["signal"],
        match=parts.get("match"),
        correlation=correlation_of(parts.get("match")),
        timeout=data.get("timeout"),
        timeout_action=data.get("timeout_action", "fail"),
        buffer=data.get("buffer", DEFAULT_SIGNAL_BUFFER),
    )


def _sleep(data: Mapping[str, Any], parts: Mapping[str, Any], index: StepIndex) -> SleepSpec:
    return SleepSpec(duration=data.get("duration"), until=parts.get("until"))


def _map(data: Mapping[str, Any], parts: Mapping[str, Any], index: StepIndex) -> MapSpec:
    return MapSpec(
        items=parts["items"],
        template=data["step"]["id"],
        max_concurrency=data.get("max_concurrency"),
        tolerated_failures=data.get("tolerated_failures", 0),
    )


def _loop(data: Mapping[str, Any], parts: Mapping[str, Any], index: StepIndex) -> LoopSpec:
    return LoopSpec(
        body=build_graph(index, data["id"]),
        until=parts.get("until"),
        while_=parts.get("while"),
        max_iterations=data["max_iterations"],
        delay=data.get("delay"),
    )


def _subflow(data: Mapping[str, Any], parts: Mapping[str, Any], index: StepIndex) -> SubflowSpec:
    return SubflowSpec(
        workflow=data["workflow"],
        version=data.get("version"),
        input=parts.get("input") or compile_template({}),
        mode=data.get("mode", "sync"),
    )


_ENGINE_SPECS = {
    "wait": _wait,
    "sleep": _sleep,
    "map": _map,
    "loop": _loop,
    "subflow": _subflow,
}
