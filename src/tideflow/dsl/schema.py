"""Structural validation of a loaded definition, with errors a person can act on.

Hand-rolled key tables, one per step type, so an unknown key gets a did-you-mean
among exactly the keys that type accepts. Every problem is reported (nothing
stops at the first), each at the position of the offending key or value, with
the step id and a hint. Action ``config`` is checked against the action type's
JSON Schema here too (`inputs.check_action_config`); what needs the whole graph (ids,
references, cycles) is checked later by the compiler.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tideflow.dsl.durations import parse_duration
from tideflow.dsl.inputs import ActionTypes, check_action_config, direct_config_keys
from tideflow.dsl.loader import DataPath, Reporter
from tideflow.dsl.schedules import check_schedule
from tideflow.dsl.schema_values import (
    BACKOFFS,
    CASE_KEYS,
    EVENT_KEYS,
    REQUIRED_HINTS,
    TRIGGER_KEYS,
    Check,
    Validator,
    any_duration,
    anything,
    article,
    boolean,
    buffer_duration,
    check_keys,
    describe,
    enum,
    expect,
    expression,
    input_schema,
    int_at_least,
    is_template,
    list_or_template,
    mapping,
    mapping_or_template,
    nonempty_list,
    nonempty_string,
    not_one_of,
    positive_duration,
    step_identifier,
    string,
    string_list,
    version_string,
    workflow_name,
    workflow_title,
)

__all__ = [
    "ACTION_STEP_KEYS",
    "BACKOFFS",
    "COMMON_STEP_KEYS",
    "ENGINE_KINDS",
    "ENGINE_STEP_KEYS",
    "EngineKind",
    "check_definition",
    "is_template",
]


def check_definition(data: Any, report: Reporter, action_types: ActionTypes) -> None:
    """Report every structural problem of a definition."""
    check = Check(report, action_types)
    if not isinstance(data, dict):
        hint = "start with `name:`, `version:` and `steps:`"
        if isinstance(data, str) and data.strip().endswith((".yaml", ".yml", ".json")):
            hint = "to load a file, pass a pathlib.Path (or use load_plan)"
        check.error((), f"a definition must be a mapping, got {describe(data)}", hint)
        return
    check_keys(check, data, (), TOP_KEYS, "at the top level", ("name", "version", "steps"))
    for key, validate in _TOP_FIELDS.items():
        if key in data:
            validate(check, data[key], (key,))


# --- retry, join, compensate ------------------------------------------------------


def _retry(check: Check, value: Any, path: DataPath) -> None:
    if value is False:
        return
    if isinstance(value, int) and not isinstance(value, bool):
        int_at_least(1)(check, value, path)
        return
    if not isinstance(value, dict):
        check.error(
            path,
            f"expected a retry mapping, a number of attempts or false, got {describe(value)}",
            "write retry: {max_attempts: 3, backoff: exponential, initial_delay: 1s}",
        )
        return
    check_keys(check, value, path, RETRY_KEYS, "in retry")
    _check_fields(check, value, path, _RETRY_FIELDS)
    backoff = value.get("backoff", "exponential")
    if backoff not in BACKOFFS and "initial_delay" in value:
        hint = f"`backoff: {backoff}` sets the delay; remove initial_delay or write backoff: fixed"
        message = "initial_delay conflicts with a duration in `backoff`"
        check.error((*path, "initial_delay"), message, hint, at_key=True)


def _backoff(check: Check, value: Any, path: DataPath) -> None:
    if value in BACKOFFS:
        return
    try:
        if parse_duration(value) > 0:
            return
    except ValueError:
        pass
    hint = f"write one of {', '.join(BACKOFFS)}, or a duration (fixed delay)"
    check.error(path, f"invalid backoff {value!r}", hint)


def _multiplier(check: Check, value: Any, path: DataPath) -> None:
    if expect(check, value, path, (int, float), "a number") and value <= 0:
        hint = "use e.g. multiplier: 2"
        check.error(path, f"multiplier must be greater than zero, got {value}", hint)


def _join(check: Check, value: Any, path: DataPath) -> None:
    hint = "write join: all, join: any or join: {at_least: N}"
    if value in ("all", "any"):
        return
    if not isinstance(value, dict):
        check.error(path, f"invalid join {value!r}", hint)
        return
    check_keys(check, value, path, frozenset({"at_least"}), "in join", ("at_least",))
    if "at_least" in value:
        int_at_least(1)(check, value["at_least"], (*path, "at_least"))


def _compensate(check: Check, value: Any, path: DataPath) -> None:
    if not expect(check, value, path, dict, "a mapping with `type`"):
        return
    kind = value.get("type")
    if not _action_type(check, kind, (*path, "type"), required="type" in value):
        check_keys(check, value, path, COMPENSATE_KEYS, "in compensate", ("type",))
        return
    direct = direct_config_keys(check.action_types, kind)
    allowed = COMPENSATE_KEYS | (direct or frozenset(value))
    check_keys(check, value, path, allowed, f"in {article(kind)} compensation")
    _check_fields(check, value, path, _COMPENSATE_FIELDS)
    _action_config(check, value, path, kind, COMPENSATE_KEYS)


def _action_type(check: Check, kind: Any, path: DataPath, *, required: bool) -> bool:
    if not required:
        return False
    if isinstance(kind, str) and kind in check.action_types:
        return True
    not_one_of(check, path, "unknown action type", kind, check.action_types)
    return False


def _action_config(
    check: Check, raw: Mapping[str, Any], path: DataPath, kind: str, own: frozenset[str]
) -> None:
    """Merge `config:` and the config keys written on the step, then check the schema."""
    origins: dict[str, DataPath] = {}
    merged: dict[str, Any] = {}
    explicit = raw.get("config")
    if isinstance(explicit, dict):
        for key, item in explicit.items():
            merged[key], origins[key] = item, (*path, "config", key)
    direct = direct_config_keys(check.action_types, kind)
    for key, item in raw.items():
        if key in own or key == "config" or (direct is not None and key not in direct):
            continue
        if key in merged:
            check.error(
                (*path, key),
                f"'{key}' is given both on the step and under config",
                "keep one of them",
                at_key=True,
            )
        merged[key], origins[key] = item, (*path, key)
    schema = check.action_types.get(kind)
    for where, message, hint, at_key in check_action_config(merged, schema, kind):
        origin = origins.get(str(where[0])) if where else None
        if origin is None:
            check.error((*path, "config") if explicit else path, message, hint)
        else:
            check.error((*origin, *where[1:]), message, hint, at_key=at_key)


def _check_fields(
    check: Check, raw: Mapping[str, Any], path: DataPath, fields: Mapping[str, Validator]
) -> None:
    for key, validate in fields.items():
        if key in raw:
            validate(check, raw[key], (*path, key))


# --- steps ----------------------------------------------------------------------


def _steps(check: Check, value: Any, path: DataPath) -> None:
    if not isinstance(value, list) or not value:
        got = "an empty list" if value == [] else describe(value)
        hint = REQUIRED_HINTS["steps"]
        check.error(path, f"expected a non-empty list of steps, got {got}", hint)
        return
    for i, raw in enumerate(value):
        check_step(check, raw, (*path, i))


def check_step(check: Check, raw: Any, path: DataPath, *, template_of: str | None = None) -> None:
    if not isinstance(raw, dict):
        hint = "write `- id: ...` with `type: ...`"
        check.error(path, f"a step must be a mapping, got {describe(raw)}", hint)
        return
    step_id = raw.get("id") if isinstance(raw.get("id"), str) else None
    if step_id is None and template_of is not None:
        step_id = f"{template_of}_item"
    check = Check(check.report, check.action_types, step_id)
    if "id" in raw:
        step_identifier(check, raw["id"], (*path, "id"))
    elif template_of is None:
        hint = "add `id: <name>` ([a-z_][a-z0-9_]*)"
        check.error(path, "missing required key 'id' in step", hint)
    kind = _step_type(check, raw.get("type"), path, "type" in raw)
    if kind is None:
        _check_fields(check, raw, path, _COMMON_FIELDS)  # still report what can be checked
        return
    allowed, fields, required = _step_keys(check, raw, kind)
    check_keys(check, raw, path, allowed, f"in {article(kind)} step", required)
    _check_fields(check, raw, path, _COMMON_FIELDS)
    _check_fields(check, raw, path, fields)
    _cross_checks(check, raw, path, kind, template_of)


def _step_keys(
    check: Check, raw: Mapping[str, Any], kind: str
) -> tuple[frozenset[str], Mapping[str, Validator], tuple[str, ...]]:
    """The keys a step of ``kind`` accepts, their validators, and the required ones."""
    engine = ENGINE_KINDS.get(kind)
    if engine is not None:
        # action-only keys pass here and get their own message in _cross_checks
        allowed = COMMON_STEP_KEYS | engine.keys | frozenset(ACTION_ONLY_KEYS)
        return allowed, engine.fields, engine.required
    direct = direct_config_keys(check.action_types, kind)
    allowed = ACTION_STEP_KEYS | (frozenset(raw) if direct is None else direct)
    return allowed, _ACTION_FIELDS, ()


def _step_type(check: Check, kind: Any, path: DataPath, present: bool) -> str | None:
    known = set(check.action_types) | set(ENGINE_KINDS)
    if not present:
        hint = f"add `type:`, one of {', '.join(sorted(known))}"
        check.error(path, "missing required key 'type' in step", hint)
    elif isinstance(kind, str) and kind in known:
        return kind
    else:
        not_one_of(check, (*path, "type"), "unknown step type", kind, known)
    return None


def _cross_checks(
    check: Check, raw: Mapping[str, Any], path: DataPath, kind: str, template_of: str | None
) -> None:
    if kind in ENGINE_KINDS:
        _action_only_keys(check, raw, path, kind)
    if raw.get("cancel_others") is True and raw.get("join", "all") == "all":
        check.error(
            (*path, "cancel_others"),
            "cancel_others needs `join: any` or `join: {at_least: N}`",
            "add join: any, or remove cancel_others",
            at_key=True,
        )
    if template_of is not None and raw.get("depends_on"):
        check.error(
            (*path, "depends_on"),
            "a map template cannot have depends_on",
            f"put the dependencies on the map step '{template_of}'",
            at_key=True,
        )
    if kind == "sleep" and ("duration" in raw) == ("until" in raw):
        check.error(
            path,
            "a sleep step needs exactly one of `duration` or `until`",
            'write duration: 10m, or until: "{{ inputs.resume_at }}"',
        )
    if kind == "loop":
        _loop_condition(check, raw, path)
    if kind == "map" and "step" in raw:
        map_id = raw.get("id") if isinstance(raw.get("id"), str) else "map"
        check_step(check, raw["step"], (*path, "step"), template_of=map_id)
    if kind not in ENGINE_KINDS:
        _action_config(check, raw, path, kind, ACTION_STEP_KEYS)


def _action_only_keys(check: Check, raw: Mapping[str, Any], path: DataPath, kind: str) -> None:
    for key, why in ACTION_ONLY_KEYS.items():
        if key in raw:
            check.error(
                (*path, key),
                f"'{key}' applies to action steps only ({why}); {article(kind)} step runs in "
                "the engine, without a worker",
                f"remove '{key}' from this step",
                at_key=True,
            )


def _loop_condition(check: Check, raw: Mapping[str, Any], path: DataPath) -> None:
    if "until" in raw and "while" in raw:
        check.error(
            (*path, "while"),
            "a loop takes `until` or `while`, not both",
            "keep one condition",
            at_key=True,
        )
    elif "until" not in raw and "while" not in raw:
        check.error(
            path,
            "a loop needs `until` or `while`; without one it always runs max_iterations and fails",
            "add `until: <expr>` (checked after each iteration) or `while: <expr>` (before it)",
        )


def _cases(check: Check, value: Any, path: DataPath) -> None:
    if not isinstance(value, list) or not value:
        hint = "write cases: [{when: <expr>, next: [step ids]}]"
        check.error(path, f"expected a non-empty list of cases, got {describe(value)}", hint)
        return
    for i, case in enumerate(value):
        if expect(check, case, (*path, i), dict, "a case mapping {when, next}"):
            at = (*path, i)
            check_keys(check, case, at, CASE_KEYS, "in a switch case", ("when", "next"))
            _check_fields(check, case, at, {"when": expression, "next": _targets})


def _switch_default(check: Check, value: Any, path: DataPath) -> None:
    if value == "fail":
        return
    if isinstance(value, str):
        hint = f"write default: [{value}] (a list of step ids) or default: fail"
        check.error(path, f"invalid default {value!r}", hint)
        return
    _targets(check, value, path)


def _event(check: Check, value: Any, path: DataPath) -> None:
    if expect(check, value, path, dict, "a mapping {type, source, data}"):
        check_keys(check, value, path, EVENT_KEYS, "in event", ("type",))
        fields = {"type": nonempty_string, "source": string, "subject": string}
        _check_fields(check, value, path, fields)


MAX_TRIGGERS = 20


def _triggers(check: Check, value: Any, path: DataPath) -> None:
    hint = "write triggers: [{event: <event type>, match: <expr>?, input: <template>?}]"
    if not isinstance(value, list) or not value:
        check.error(path, f"expected a non-empty list of triggers, got {describe(value)}", hint)
        return
    if len(value) > MAX_TRIGGERS:
        check.error(path, f"at most {MAX_TRIGGERS} triggers, got {len(value)}", hint)
    for i, trigger in enumerate(value):
        at = (*path, i)
        if expect(check, trigger, at, dict, "a trigger mapping {event, match?, input?}"):
            check_keys(check, trigger, at, TRIGGER_KEYS, "in a trigger", ("event",))
            _check_fields(
                check,
                trigger,
                at,
                {"event": _trigger_event, "match": expression, "input": anything},
            )


def _trigger_event(check: Check, value: Any, path: DataPath) -> None:
    if not isinstance(value, str) or not value.strip():
        check.error(
            path,
            f"a trigger's event must be an event type, got {describe(value)}",
            "write the CloudEvents `type` that starts a run, such as event: order.paid",
        )


def _workflow(check: Check, value: Any, path: DataPath) -> None:
    if not is_template(value):
        workflow_name(check, value, path)


_targets = nonempty_list(string_list("step ids"), "step ids")

_TOP_FIELDS: Mapping[str, Validator] = {
    "name": workflow_name,
    "title": workflow_title,
    "version": version_string,
    "description": string,
    "input": input_schema,
    "defaults": lambda check, value, path: _defaults(check, value, path),
    "timeout": positive_duration,
    "on_failure": enum("fail", "compensate"),
    "output": anything,
    "steps": _steps,
    "triggers": _triggers,
    "schedule": check_schedule,
}
_RETRY_FIELDS: Mapping[str, Validator] = {
    "max_attempts": int_at_least(1),
    "backoff": _backoff,
    "initial_delay": any_duration,
    "multiplier": _multiplier,
    "max_delay": positive_duration,
    "jitter": boolean,
    "retry_on": string_list("error type names"),
}
_COMMON_FIELDS: Mapping[str, Validator] = {
    "depends_on": string_list("step ids"),
    "join": _join,
    "cancel_others": boolean,
    "when": expression,
    "retry": _retry,
    "timeout": positive_duration,
    "deadline": positive_duration,
    "queue": nonempty_string,
    "priority": enum("high", "normal", "low"),
    "compensate": _compensate,
    "on_error": enum("fail", "continue", "compensate"),
    "input": mapping_or_template,
    "description": string,
    "sensitive": string_list("field names"),
}
_COMPENSATE_FIELDS: Mapping[str, Validator] = {
    "config": mapping,
    "input": mapping_or_template,
    "retry": _retry,
    "timeout": positive_duration,
}
_ACTION_FIELDS: Mapping[str, Validator] = {
    "config": mapping,
    "schedule_to_start": positive_duration,
    "idempotent": boolean,
}
"""Keys of action steps beyond the common ones (their executor's config keys aside)."""
ACTION_ONLY_KEYS: Mapping[str, str] = {
    "schedule_to_start": "it bounds how long a task waits for a worker",
    "idempotent": "it says whether a worker may run an attempt again",
}
"""Action keys an engine step gets a message of their own for, and why."""
_DEFAULTS_FIELDS: Mapping[str, Validator] = {
    key: {**_COMMON_FIELDS, **_ACTION_FIELDS}[key]
    for key in ("retry", "timeout", "schedule_to_start", "queue", "priority")
} | {"buffer": buffer_duration}
"""``buffer`` applies to `wait` steps only; the others to action steps."""


@dataclass(frozen=True, slots=True)
class EngineKind:
    """The one declaration of an engine step kind: the keys it takes beyond the common
    ones (each with its validator) and which of them are required."""

    fields: Mapping[str, Validator]
    required: tuple[str, ...] = ()

    @property
    def keys(self) -> frozenset[str]:
        return frozenset(self.fields)


ENGINE_KINDS: Mapping[str, EngineKind] = {
    "set": EngineKind({"values": mapping}, ("values",)),
    "switch": EngineKind({"cases": _cases, "default": _switch_default}, ("cases", "default")),
    "wait": EngineKind(
        {
            "signal": nonempty_string,
            "match": expression,
            "timeout_action": enum("fail", "continue"),
            "buffer": buffer_duration,
        },
        ("signal",),
    ),
    "sleep": EngineKind({"duration": any_duration, "until": nonempty_string}),
    "map": EngineKind(
        {
            "items": list_or_template,
            "step": anything,  # checked in _cross_checks, where the map's id is known
            "max_concurrency": int_at_least(1),
            "tolerated_failures": int_at_least(0),
        },
        ("items", "step"),
    ),
    "loop": EngineKind(
        {
            "steps": _steps,
            "until": expression,
            "while": expression,
            "max_iterations": int_at_least(1),
            "delay": any_duration,
        },
        ("steps", "max_iterations"),
    ),
    "subflow": EngineKind(
        {"workflow": _workflow, "version": version_string, "mode": enum("sync", "async")},
        ("workflow",),
    ),
    "emit": EngineKind({"event": _event}, ("event",)),
}
"""Every engine step kind (the same set as `tideflow.model.plan.ENGINE_TYPES`)."""


# The key tables are the validator tables' keys: one source of truth.
TOP_KEYS = frozenset(_TOP_FIELDS)
DEFAULTS_KEYS = frozenset(_DEFAULTS_FIELDS)
RETRY_KEYS = frozenset(_RETRY_FIELDS)
COMMON_STEP_KEYS = frozenset(_COMMON_FIELDS) | {"id", "type"}
ACTION_STEP_KEYS = COMMON_STEP_KEYS | frozenset(_ACTION_FIELDS)
COMPENSATE_KEYS = frozenset(_COMPENSATE_FIELDS) | {"type"}
ENGINE_STEP_KEYS = {kind: declared.keys for kind, declared in ENGINE_KINDS.items()}


def _defaults(check: Check, value: Any, path: DataPath) -> None:
    if expect(check, value, path, dict, "a mapping"):
        check_keys(check, value, path, DEFAULTS_KEYS, "in defaults")
        _check_fields(check, value, path, _DEFAULTS_FIELDS)
