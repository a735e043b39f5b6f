"""Checking a step's rendered config against its executor's schema, and small parsers.

The DSL compiler checks configs before a run starts, but templated values are
only known at execution time, so each executor checks the rendered config again
(with a validator compiled once per schema) and fails with ``InvalidStepConfig``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from jsonschema import Draft202012Validator

from tideflow.worker.executors.errors import InvalidStepConfig

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"

DURATION_SCHEMA: dict[str, Any] = {
    "type": ["number", "string"],
    "x-duration": True,  # the DSL checks it as a duration and normalises it to seconds
    "description": "seconds, or a duration such as 500ms, 30s, 5m, 2h, 1d or PT5M",
}

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")
_ISO_RE = re.compile(
    r"^P(?:(?P<d>\d+(?:\.\d+)?)D)?"
    r"(?:T(?:(?P<h>\d+(?:\.\d+)?)H)?(?:(?P<m>\d+(?:\.\d+)?)M)?(?:(?P<s>\d+(?:\.\d+)?)S)?)?$"
)
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
    """A positive duration in seconds from a number, ``30s``-style text or ISO-8601 ``PT30S``."""
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        result: float | None = float(value)
    else:
        result = _parse_duration(str(value).strip())
    if result is None or result <= 0:
        raise InvalidStepConfig(
            f"'{key}' must be a positive number of seconds or a duration like '30s', got {value!r}"
        )
    return result


def _parse_duration(text: str) -> float | None:
    short = _DURATION_RE.match(text)
    if short is not None:
        return float(short.group(1)) * _UNITS[short.group(2)]
    iso = _ISO_RE.match(text.upper())
    if iso is None or text.upper() in ("P", "PT") or text.upper().endswith("T"):
        return None
    parts = {unit: float(iso.group(unit) or 0) for unit in "dhms"}
    return sum(parts[unit] * _UNITS[unit] for unit in "dhms")


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
