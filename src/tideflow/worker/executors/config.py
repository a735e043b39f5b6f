"""Checking a step's rendered config against its executor's schema, and its durations.

The DSL compiler checks configs before a run starts, but templated values are
only known at execution time, so each executor checks the rendered config again
(with a validator compiled once per schema) and fails with ``InvalidStepConfig``.

Most configs are the same on every attempt (no templates, or templates that render
the same), so a config that passed is remembered, by a digest of its JSON form
(the rendered config may hold secrets: the digest does not), and is not validated
again: encoding a small config costs a microsecond, validating it tens. A config that
comes again as the very same object (a constant config is the plan's own object on every
attempt) is recognised by its identity, without encoding it again: a rendered config is
never changed in place (the plan's constants are shared by every run).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import orjson
from jsonschema import Draft202012Validator

from tideflow.model.durations import parse_duration
from tideflow.worker.executors.errors import InvalidStepConfig

_validators: dict[int, tuple[Mapping[str, Any], Draft202012Validator]] = {}

VALID_CONFIGS_KEPT = 4096
"""How many distinct valid configs are remembered (least recently used ones are dropped)."""
_valid: OrderedDict[tuple[int, bytes], None] = OrderedDict()
SAME_CONFIGS_KEPT = 256
"""How many valid config objects are remembered by identity (oldest dropped first)."""
_same: dict[int, tuple[Mapping[str, Any], Any]] = {}
"""id(config) -> (its schema, the config itself: kept alive so that its id is not reused)."""


def check_config(executor_name: str, schema: Mapping[str, Any], config: Any) -> Mapping[str, Any]:
    """Return ``config`` (``None`` counts as ``{}``) or raise ``InvalidStepConfig``."""
    config = {} if config is None else config
    same = _same.get(id(config))
    if same is not None and same[1] is config and same[0] is schema:
        return config  # type: ignore[no-any-return]
    key = _key(schema, config)
    if key is not None and key in _valid:
        _valid.move_to_end(key)
        _remember(schema, config)  # seen twice: likely to come again as this object
        return config  # type: ignore[no-any-return]
    errors = sorted(_validator(schema).iter_errors(config), key=lambda e: list(e.absolute_path))
    if errors:
        problems = "; ".join(_describe(e.absolute_path, e.message) for e in errors[:5])
        raise InvalidStepConfig(f"invalid config for executor '{executor_name}': {problems}")
    assert isinstance(config, Mapping)
    if key is not None:
        _valid[key] = None
        if len(_valid) > VALID_CONFIGS_KEPT:
            _valid.popitem(last=False)
    return config


def _remember(schema: Mapping[str, Any], config: Any) -> None:
    _same[id(config)] = (schema, config)
    if len(_same) > SAME_CONFIGS_KEPT:
        del _same[next(iter(_same))]


def _key(schema: Mapping[str, Any], config: Any) -> tuple[int, bytes] | None:
    """The cache key of a config checked against ``schema``; None when its JSON form does
    not tell it apart from other configs (it is validated every time)."""
    try:
        data = orjson.dumps(config, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        return None
    if b"null" in data:
        return None  # NaN and infinities are written as null too: not the same config
    # The validator cache keeps the schema alive, so its id names it for the process.
    _validator(schema)
    return id(schema), hashlib.blake2b(data, digest_size=16).digest()


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
