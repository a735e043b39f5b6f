"""Structural validation of a loaded definition, with errors a person can act on.

Hand-rolled key tables, one per step type, so an unknown key gets a did-you-mean
among exactly the keys that type accepts. Every problem is reported (nothing
stops at the first), each at the position of the offending key or value, with
the step id and a hint. Action ``config`` is checked against the action type's
JSON Schema here too (`inputs.check_action_config`); what needs the whole graph (ids,
references, cycles) is checked later by the compiler.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from tideflow.dsl.durations import DURATION_HINT, parse_duration
from tideflow.dsl.inputs import (
    ActionTypes,
    check_action_config,
    direct_config_keys,
    input_schema_errors,
)
from tideflow.dsl.loader import DataPath, Reporter, did_you_mean

__all__ = [
    "ACTION_STEP_KEYS",
    "COMMON_STEP_KEYS",
    "ENGINE_KINDS",
    "ENGINE_STEP_KEYS",
    "EngineKind",
    "check_definition",
    "is_template",
]

NAME_RE = re.compile(r"[a-z0-9][a-z0-9_.-]*")
STEP_ID_RE = re.compile(r"[a-z_][a-z0-9_]*")

CASE_KEYS = frozenset({"when", "next"})
EVENT_KEYS = frozenset({"type", "source", "subject", "data"})
BACKOFFS = ("fixed", "linear", "exponential")

_REQUIRED_HINTS = {
    "default": "add `default: [step ids]` (run when no case matches) or `default: fail`",
    "max_iterations": "add `max_iterations: N`; the loop fails with MaxIterationsExceeded "
    "when it reaches N without `until` holding",
    "steps": "add `steps:` with at least one step",
}


def is_template(value: object) -> bool:
    """A string whose value is only known at run time."""
    return isinstance(value, str) and "{{" in value


@dataclass(frozen=True)
class Check:
    """What a validator needs: where to report, the action types, the current step."""

    report: Reporter
    action_types: ActionTypes
    step_id: str | None = None

    def error(
        self, path: DataPath, message: str, hint: str | None, *, at_key: bool = False
    ) -> None:
        self.report.error(path, message, hint=hint, step_id=self.step_id, at_key=at_key)


Validator = Callable[[Check, Any, DataPath], None]


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


# --- generic checks -------------------------------------------------------------


def describe(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    for kind, name in ((int, "an integer"), (float, "a number"), (str, "a string")):
        if isinstance(value, kind):
            return f"{name} ({value!r})"
    return "a list" if isinstance(value, list) else "a mapping"


def check_keys(
    check: Check,
    mapping: Mapping[str, Any],
    path: DataPath,
    allowed: frozenset[str],
    where: str,
    required: tuple[str, ...] = (),
) -> None:
    for key in mapping:
        if key not in allowed:
            suggestion = did_you_mean(key, allowed)
            listing = f"allowed keys {where}: {', '.join(sorted(allowed))}"
            hint = f"did you mean '{suggestion}'?" if suggestion else listing
            check.error((*path, key), f"unknown key '{key}' {where}", hint, at_key=True)
    for key in required:
        if key not in mapping:
            hint = _REQUIRED_HINTS.get(key, f"add `{key}: ...`")
            check.error(path, f"missing required key '{key}' {where}", hint)


def expect(
    check: Check, value: Any, path: DataPath, kinds: type | tuple[type, ...], what: str
) -> bool:
    allowed = kinds if isinstance(kinds, tuple) else (kinds,)
    if isinstance(value, kinds) and (bool in allowed or not isinstance(value, bool)):
        return True
    message = f"{_label(path)} must be {what}, got {describe(value)}"
    check.error(path, message, f"write {what} here")
    return False


def _string(check: Check, value: Any, path: DataPath) -> None:
    expect(check, value, path, str, "a string")


def _nonempty_string(check: Check, value: Any, path: DataPath) -> None:
    if expect(check, value, path, str, "a non-empty string") and not value.strip():
        check.error(path, "expected a non-empty string, got an empty one", "write a value here")


def _expression(check: Check, value: Any, path: DataPath) -> None:
    if isinstance(value, bool) or (isinstance(value, str) and value.strip()):
        return
    check.error(
        path,
        f"expected an expression string, got {describe(value)}",
        'write an expression such as "{{ inputs.amount > 100 }}"',
    )


def _bool(check: Check, value: Any, path: DataPath) -> None:
    expect(check, value, path, bool, "true or false")


def _int_at_least(minimum: int) -> Validator:
    def validate(check: Check, value: Any, path: DataPath) -> None:
        if expect(check, value, path, int, "an integer") and value < minimum:
            hint = f"use a value >= {minimum}"
            message = f"{_label(path)} must be at least {minimum}, got {value}"
            check.error(path, message, hint)

    return validate


def _a(word: str) -> str:
    return f"an {word}" if word[:1] in "aeiou" or word == "http" else f"a {word}"


def _label(path: DataPath) -> str:
    """The key a value belongs to, for messages: ``timeout``, ``next[0]`` -> ``next``."""
    names = [part for part in path if isinstance(part, str)]
    return names[-1] if names else "value"


def _not_one_of(check: Check, path: DataPath, what: str, value: Any, known: Iterable[str]) -> None:
    known = sorted(known)
    suggestion = did_you_mean(str(value), known)
    hint = f"did you mean '{suggestion}'? " if suggestion else ""
    check.error(path, f"{what} {value!r}", f"{hint}allowed: {', '.join(known)}")


def _enum(*allowed: str) -> Validator:
    def validate(check: Check, value: Any, path: DataPath) -> None:
        if not (isinstance(value, str) and value in allowed):
            _not_one_of(check, path, f"invalid {_label(path)}", value, allowed)

    return validate


def _duration(*, allow_zero: bool) -> Validator:
    def validate(check: Check, value: Any, path: DataPath) -> None:
        try:
            seconds = parse_duration(value)
        except ValueError:
            check.error(path, f"{_label(path)} is not a valid duration: {value!r}", DURATION_HINT)
            return
        if seconds < 0 or (seconds == 0 and not allow_zero):
            limit = "zero or more" if allow_zero else "greater than zero"
            message = f"{_label(path)} must be {limit}, got {value!r}"
            check.error(path, message, DURATION_HINT)

    return validate


_positive_duration = _duration(allow_zero=False)
_any_duration = _duration(allow_zero=True)


def _string_list(what: str) -> Validator:
    def validate(check: Check, value: Any, path: DataPath) -> None:
        if not isinstance(value, list):
            example = value if isinstance(value, str) else "a, b"
            hint = f"write [{example}]"
            check.error(path, f"expected a list of {what}, got {describe(value)}", hint)
            return
        for i, item in enumerate(value):
            expect(check, item, (*path, i), str, f"a string ({what[:-1]})")

    return validate


def _nonempty_list(inner: Validator, what: str) -> Validator:
    def validate(check: Check, value: Any, path: DataPath) -> None:
        inner(check, value, path)
        if value == []:
            check.error(path, f"the list of {what} is empty", f"name at least one of the {what}")

    return validate


def _mapping(check: Check, value: Any, path: DataPath) -> None:
    expect(check, value, path, dict, "a mapping")


def _anything(check: Check, value: Any, path: DataPath) -> None:
    return None


def _mapping_or_template(check: Check, value: Any, path: DataPath) -> None:
    if isinstance(value, dict) or is_template(value):
        return
    check.error(
        path,
        f"expected a mapping (or one template string), got {describe(value)}",
        'write a mapping such as {order_id: "{{ inputs.order_id }}"}',
    )


def _list_or_template(check: Check, value: Any, path: DataPath) -> None:
    if isinstance(value, list) or is_template(value):
        return
    check.error(
        path,
        f"expected a list or a template, got {describe(value)}",
        'write items: "{{ inputs.items }}" or a literal list',
    )


def _suggest_id(text: str, pattern: re.Pattern[str], first: str) -> str:
    fixed = re.sub(r"[^a-z0-9_.-]" if first == "0" else r"[^a-z0-9_]", "_", text.lower())
    return fixed if pattern.fullmatch(fixed) else f"{first}{fixed}"


def _name(check: Check, value: Any, path: DataPath) -> None:
    if expect(check, value, path, str, "a string") and not NAME_RE.fullmatch(value):
        check.error(
            path,
            f"invalid name {value!r}: must match [a-z0-9][a-z0-9_.-]*",
            f"use lower case letters, digits, '_', '.', '-', e.g. "
            f"'{_suggest_id(value, NAME_RE, '0')}'",
        )


def _step_id(check: Check, value: Any, path: DataPath) -> None:
    if expect(check, value, path, str, "a string") and not STEP_ID_RE.fullmatch(value):
        check.error(
            path,
            f"invalid step id {value!r}: must match [a-z_][a-z0-9_]*",
            f"use lower case letters, digits and '_', e.g. '{_suggest_id(value, STEP_ID_RE, '_')}'",
        )


def _version(check: Check, value: Any, path: DataPath) -> None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        hint = f'quote it: version: "{value}"'
        check.error(path, f"version must be a string, got {describe(value)}", hint)
    else:
        _nonempty_string(check, value, path)


def _input_schema(check: Check, value: Any, path: DataPath) -> None:
    if not expect(check, value, path, dict, "a JSON Schema mapping"):
        return
    for where, message in input_schema_errors(value):
        hint = "fix the JSON Schema (draft 2020-12)"
        check.error((*path, *where), f"invalid input schema: {message}", hint)


# --- retry, join, compensate ------------------------------------------------------


def _retry(check: Check, value: Any, path: DataPath) -> None:
    if value is False:
        return
    if isinstance(value, int) and not isinstance(value, bool):
        _int_at_least(1)(check, value, path)
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
        _int_at_least(1)(check, value["at_least"], (*path, "at_least"))


def _compensate(check: Check, value: Any, path: DataPath) -> None:
    if not expect(check, value, path, dict, "a mapping with `type`"):
        return
    kind = value.get("type")
    if not _action_type(check, kind, (*path, "type"), required="type" in value):
        check_keys(check, value, path, COMPENSATE_KEYS, "in compensate", ("type",))
        return
    direct = direct_config_keys(check.action_types, kind)
    allowed = COMPENSATE_KEYS | (direct or frozenset(value))
    check_keys(check, value, path, allowed, f"in {_a(kind)} compensation")
    _check_fields(check, value, path, _COMPENSATE_FIELDS)
    _action_config(check, value, path, kind, COMPENSATE_KEYS)


def _action_type(check: Check, kind: Any, path: DataPath, *, required: bool) -> bool:
    if not required:
        return False
    if isinstance(kind, str) and kind in check.action_types:
        return True
    _not_one_of(check, path, "unknown action type", kind, check.action_types)
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
        hint = _REQUIRED_HINTS["steps"]
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
    check = replace(check, step_id=step_id)
    if "id" in raw:
        _step_id(check, raw["id"], (*path, "id"))
    elif template_of is None:
        hint = "add `id: <name>` ([a-z_][a-z0-9_]*)"
        check.error(path, "missing required key 'id' in step", hint)
    kind = _step_type(check, raw.get("type"), path, "type" in raw)
    if kind is None:
        _check_fields(check, raw, path, _COMMON_FIELDS)  # still report what can be checked
        return
    allowed, fields, required = _step_keys(check, raw, kind)
    check_keys(check, raw, path, allowed, f"in {_a(kind)} step", required)
    _check_fields(check, raw, path, _COMMON_FIELDS)
    _check_fields(check, raw, path, fields)
    _cross_checks(check, raw, path, kind, template_of)


def _step_keys(
    check: Check, raw: Mapping[str, Any], kind: str
) -> tuple[frozenset[str], Mapping[str, Validator], tuple[str, ...]]:
    """The keys a step of ``kind`` accepts, their validators, and the required ones."""
    engine = ENGINE_KINDS.get(kind)
    if engine is not None:
        return COMMON_STEP_KEYS | engine.keys, engine.fields, engine.required
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
        _not_one_of(check, (*path, "type"), "unknown step type", kind, known)
    return None


def _cross_checks(
    check: Check, raw: Mapping[str, Any], path: DataPath, kind: str, template_of: str | None
) -> None:
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
            _check_fields(check, case, at, {"when": _expression, "next": _targets})


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
        fields = {"type": _nonempty_string, "source": _string, "subject": _string}
        _check_fields(check, value, path, fields)


def _workflow(check: Check, value: Any, path: DataPath) -> None:
    if not is_template(value):
        _name(check, value, path)


_targets = _nonempty_list(_string_list("step ids"), "step ids")

_TOP_FIELDS: Mapping[str, Validator] = {
    "name": _name,
    "version": _version,
    "description": _string,
    "input": _input_schema,
    "defaults": lambda check, value, path: _defaults(check, value, path),
    "timeout": _positive_duration,
    "on_failure": _enum("fail", "compensate"),
    "output": _anything,
    "steps": _steps,
}
_RETRY_FIELDS: Mapping[str, Validator] = {
    "max_attempts": _int_at_least(1),
    "backoff": _backoff,
    "initial_delay": _any_duration,
    "multiplier": _multiplier,
    "max_delay": _positive_duration,
    "jitter": _bool,
    "retry_on": _string_list("error type names"),
}
_COMMON_FIELDS: Mapping[str, Validator] = {
    "depends_on": _string_list("step ids"),
    "join": _join,
    "cancel_others": _bool,
    "when": _expression,
    "retry": _retry,
    "timeout": _positive_duration,
    "deadline": _positive_duration,
    "queue": _nonempty_string,
    "priority": _enum("high", "normal", "low"),
    "compensate": _compensate,
    "on_error": _enum("fail", "continue", "compensate"),
    "input": _mapping_or_template,
    "description": _string,
    "sensitive": _string_list("field names"),
}
_COMPENSATE_FIELDS: Mapping[str, Validator] = {
    "config": _mapping,
    "input": _mapping_or_template,
    "retry": _retry,
    "timeout": _positive_duration,
}
_DEFAULTS_FIELDS: Mapping[str, Validator] = {
    key: _COMMON_FIELDS[key] for key in ("retry", "timeout", "queue", "priority")
}
_ACTION_FIELDS: Mapping[str, Validator] = {"config": _mapping}
"""Keys of action steps beyond the common ones (their executor's config keys aside)."""


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
    "set": EngineKind({"values": _mapping}, ("values",)),
    "switch": EngineKind({"cases": _cases, "default": _switch_default}, ("cases", "default")),
    "wait": EngineKind(
        {
            "signal": _nonempty_string,
            "match": _expression,
            "timeout_action": _enum("fail", "continue"),
        },
        ("signal",),
    ),
    "sleep": EngineKind({"duration": _any_duration, "until": _nonempty_string}),
    "map": EngineKind(
        {
            "items": _list_or_template,
            "step": _anything,  # checked in _cross_checks, where the map's id is known
            "max_concurrency": _int_at_least(1),
            "tolerated_failures": _int_at_least(0),
        },
        ("items", "step"),
    ),
    "loop": EngineKind(
        {
            "steps": _steps,
            "until": _expression,
            "while": _expression,
            "max_iterations": _int_at_least(1),
            "delay": _any_duration,
        },
        ("steps", "max_iterations"),
    ),
    "subflow": EngineKind(
        {"workflow": _workflow, "version": _version, "mode": _enum("sync", "async")},
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
