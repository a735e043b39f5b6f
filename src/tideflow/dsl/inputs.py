"""JSON Schema in the DSL: the run input, the `input:` schema itself, and action config.

- `validate_input` checks a run's input against the definition's ``input`` schema
  (draft 2020-12) and reports its errors (up to 50), best first.
- `input_schema_errors` checks at compile time that ``input`` is a valid schema whose
  patterns RE2 takes (they run on RE2, in linear time: dsl/regexes.py).
- `check_action_config` checks an action step's ``config`` against its type's
  schema (`BUILTIN_ACTION_TYPES`, from `tideflow.model.action_schemas`, for the
  executors tideflow ships; the runtime passes its executor registry's schemas).
  A value that is a template string is only known at run time, so schema errors
  about such a value are not reported. A property marked ``"x-duration": true`` takes a
  duration; the normaliser turns it into seconds.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterable, Mapping
from typing import Any

import orjson
from jsonschema import Draft202012Validator, ValidationError
from jsonschema.protocols import Validator

from tideflow.dsl.durations import DURATION_HINT, parse_duration
from tideflow.dsl.loader import DataPath, did_you_mean, format_path
from tideflow.dsl.regexes import INPUT_FORMATS, InputValidator, input_schema_problems
from tideflow.errors import InputValidationError
from tideflow.model.action_schemas import BUILTIN_ACTION_TYPES
from tideflow.model.plan import Plan

__all__ = [
    "BUILTIN_ACTION_TYPES",
    "ActionTypes",
    "check_action_config",
    "direct_config_keys",
    "duration_config_keys",
    "input_schema_errors",
    "validate_input",
]

ActionTypes = Mapping[str, Mapping[str, Any] | None]
ConfigProblem = tuple[DataPath, str, str | None, bool]
"""(path inside config, message, hint, whether it is about the key rather than its value)"""


# --- run input --------------------------------------------------------------------


MAX_INPUT_ERRORS = 50
"""Errors of a run input listed at most: finding (and sending) every one of a large input's
could take seconds and megabytes."""


def validate_input(plan: Plan, value: Any) -> None:
    """Raise InputValidationError listing the ways ``value`` breaks the input schema (the
    first `MAX_INPUT_ERRORS`)."""
    if plan.input_schema is None:
        return
    found = list(itertools.islice(_input_validator(plan).iter_errors(value), MAX_INPUT_ERRORS + 1))
    errors = sorted(found[:MAX_INPUT_ERRORS], key=_relevance)
    if errors:
        fields = [(_json_path(error.absolute_path), error.message) for error in errors]
        more = len(found) > MAX_INPUT_ERRORS
        raise InputValidationError(
            f"run input of {plan.name} {plan.version} does not match its input schema:\n"
            + "\n".join(f"  {path}: {message}" for path, message in fields)
            + (f"\n  (and more: the first {MAX_INPUT_ERRORS} are listed)" if more else ""),
            fields=fields,
        )


@functools.lru_cache(maxsize=64)
def _input_validator(plan: Plan) -> Validator:
    return InputValidator(plan.input_schema or {}, format_checker=INPUT_FORMATS)


def _relevance(error: ValidationError) -> tuple[int, bool, str]:
    """Errors higher up in the instance first; anyOf/oneOf summaries after the rest."""
    return len(error.path), error.validator in ("anyOf", "oneOf"), str(list(error.path))


def _json_path(path: Iterable[Any]) -> str:
    return "$" + "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in path)


def input_schema_errors(schema: Mapping[str, Any]) -> list[tuple[DataPath, str, str]]:
    """Where (inside the schema), why and what to do: ``schema`` is not a valid draft
    2020-12 schema, or holds a pattern RE2 does not take (dsl/regexes.py)."""
    return input_schema_problems(schema)


# --- action config ----------------------------------------------------------------


def direct_config_keys(action_types: ActionTypes, kind: str) -> frozenset[str] | None:
    """Config keys that may be written directly on a step; None means any key."""
    schema = action_types.get(kind)
    if schema is None:
        return None
    properties = schema.get("properties")
    if isinstance(properties, Mapping):
        return frozenset(properties)
    return frozenset() if schema.get("additionalProperties") is False else None


def duration_config_keys(action_types: ActionTypes, kind: str) -> frozenset[str]:
    properties = (action_types.get(kind) or {}).get("properties") or {}
    return frozenset(key for key, sub in properties.items() if sub.get("x-duration") is True)


def check_action_config(
    config: Mapping[str, Any], schema: Mapping[str, Any] | None, kind: str
) -> list[ConfigProblem]:
    """Problems of ``config`` as (path inside config, message, hint)."""
    if schema is None:
        return []
    try:
        key = (id(schema), kind, orjson.dumps(config, option=orjson.OPT_SORT_KEYS))
    except TypeError:
        return _config_problems(config, schema, kind)
    cached = _checked.get(key)
    if cached is None or cached[0] is not schema:
        if len(_checked) > 4096:
            _checked.clear()
        cached = _checked[key] = (schema, _config_problems(config, schema, kind))
    return list(cached[1])


# Generated definitions repeat configs (10,000 noop or http steps alike): check each once.
_checked: dict[tuple[int, str, bytes], tuple[Mapping[str, Any], list[ConfigProblem]]] = {}


def _config_problems(
    config: Mapping[str, Any], schema: Mapping[str, Any], kind: str
) -> list[ConfigProblem]:
    problems: list[ConfigProblem] = []
    for error in sorted(_config_validator(schema).iter_errors(config), key=_relevance):
        if not _is_template(error.instance):
            problems.extend(_describe_error(error, kind))
    problems.extend(_duration_problems(config, schema))
    return problems


_validators: dict[int, tuple[Mapping[str, Any], Draft202012Validator]] = {}


def _config_validator(schema: Mapping[str, Any]) -> Draft202012Validator:
    """One validator per schema object (building one costs more than validating a config)."""
    cached = _validators.get(id(schema))
    if cached is None or cached[0] is not schema:
        if len(_validators) > 256:
            _validators.clear()
        cached = _validators[id(schema)] = (schema, Draft202012Validator(schema))
    return cached[1]


def _describe_error(error: ValidationError, kind: str) -> list[ConfigProblem]:
    where = tuple(error.absolute_path)
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        known = list(error.schema.get("properties", {})) if isinstance(error.schema, dict) else []
        return [_unknown_key(where, key, known, kind) for key in error.instance if key not in known]
    if error.validator == "required" and isinstance(error.instance, dict):
        required = error.validator_value if isinstance(error.validator_value, list) else []
        missing = [key for key in required if key not in error.instance]
        props = error.schema.get("properties", {}) if isinstance(error.schema, dict) else {}
        return [
            (
                where,
                f"missing required key '{key}' in {kind} config",
                f"add `{key}:` ({_description(props.get(key), 'see the executor docs')})",
                False,
            )
            for key in missing
        ]
    label = format_path(where) or "config"
    hint = _description(error.schema, None)
    message = f"invalid {kind} config {label}: {error.message}"
    return [(where, message, hint and f"expected {hint}", False)]


def _unknown_key(where: DataPath, key: str, known: list[str], kind: str) -> ConfigProblem:
    suggestion = did_you_mean(key, known)
    hint = f"did you mean '{suggestion}'?" if suggestion else f"known keys: {', '.join(known)}"
    return (*where, key), f"unknown key '{key}' in {kind} config", hint, True


def _description(schema: object, fallback: str | None) -> str | None:
    if isinstance(schema, Mapping) and isinstance(schema.get("description"), str):
        return str(schema["description"])
    return fallback


def _duration_problems(config: Mapping[str, Any], schema: Mapping[str, Any]) -> list[ConfigProblem]:
    problems: list[ConfigProblem] = []
    for key, sub in (schema.get("properties") or {}).items():
        value = config.get(key)
        if sub.get("x-duration") is not True or not _duration_like(value):
            continue
        try:
            seconds = parse_duration(value)
        except ValueError:
            problems.append(((key,), f"invalid {key} duration {value!r}", DURATION_HINT, False))
            continue
        if seconds <= 0:
            message = f"{key} must be greater than zero, got {value!r}"
            problems.append(((key,), message, DURATION_HINT, False))
    return problems


def _duration_like(value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return False
    return not _is_template(value)


def _is_template(value: object) -> bool:
    return isinstance(value, str) and "{{" in value
