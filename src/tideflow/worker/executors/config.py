"""Checking a step's rendered config against its executor's schema, and its durations.

The DSL compiler checks configs before a run starts, but templated values are
only known at execution time, so each executor checks the rendered config again
(with a validator compiled once per schema) and fails with ``InvalidStepConfig``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jsonschema import Draft202012Validator

from tideflow.model.durations import parse_duration
from tideflow.worker.executors.errors import InvalidStepConfig

_validators: dict[int, tuple[Mapping[str, Any], Draft202012Validator]] = {}


def check_config(executor_name: str, schema: Mapping[str, Any], config: Any) -> Mapping[str, Any]:
    """Return ``config`` (``None`` counts as ``{}``) or raise ``InvalidStepConfig``."""
    config = {} if config is None else config
    errors = sorted(_validator(schema).iter_errors(config), key=lambda e: list(e.absolute_path))
    if errors:
        problems = "; ".join(_describe(e.absolute_path, e.message) for e in errors[:5])
        raise InvalidStepConfig(f"invalid config for executor '{executor_name}': {problems}")
    assert isinstance(config, Mapping)
    return config


def seconds(value: Any, key: str = "timeout") -> float | None:
    """A positive duration in seconds (`tideflow.model.durations`); ``None`` stays ``None``."""
    if value is None:
        return None
    try:
        result = parse_duration(value)
    except ValueError as exc:
        raise _not_positive(key, value) from exc
    if result <= 0:
        raise _not_positive(key, value)
    return result


def _not_positive(key: str, value: Any) -> InvalidStepConfig:
    return InvalidStepConfig(
        f"'{key}' must be a positive number of seconds or a duration like '30s', got {value!r}"
    )


def _validator(schema: Mapping[str, Any]) -> Draft202012Validator:
    # Keyed by identity: schemas are class attributes that live as long as the process;
    # the schema is kept in the value so its id cannot be reused while cached.
    cached = _validators.get(id(schema))
    if cached is None or cached[0] is not schema:
        cached = (schema, Draft202012Validator(schema))
        _validators[id(schema)] = cached
    return cached[1]


def _describe(path: Any, message: str) -> str:
    where = ".".join(str(p) for p in path)
    return f"{where}: {message}" if where else message
