"""The config JSON Schemas (draft 2020-12) of the executors tideflow ships.

One source for both readers: the executors in ``tideflow.worker.executors``
check a step's rendered config against them at run time, and the DSL checks a
definition against them at compile time (it may not import the worker). The DSL
turns a property's ``description`` into the hint "expected <description>", so
descriptions are written to read that way. A property marked
``"x-duration": true`` takes a duration (`tideflow.model.durations`), which the
DSL normalises to seconds.

Patterns stay within what ECMA-262 regexes understand too, so that other
JSON Schema tools read the schemas the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "BUILTIN_ACTION_TYPES",
    "DURATION_SCHEMA",
    "HTTP_CONFIG_SCHEMA",
    "NOOP_CONFIG_SCHEMA",
    "PYTHON_CONFIG_SCHEMA",
    "SCHEMA_DIALECT",
    "SHELL_CONFIG_SCHEMA",
]

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"

DURATION_SCHEMA: Mapping[str, Any] = {
    "type": ["number", "string"],
    "x-duration": True,
    "description": "seconds, or a duration such as 500ms, 30s, 5m, 2h, 1d or PT5M",
}

_KILL_GRACE = {
    "type": "number",
    "minimum": 0,
    "description": "seconds between SIGTERM and SIGKILL, zero or more",
}
_SCALAR = {"type": ["string", "number", "boolean"]}
_STATUS = {"type": "integer", "minimum": 100, "maximum": 599}


def _config(title: str, required: list[str], properties: dict[str, Any]) -> Mapping[str, Any]:
    return {
        "$schema": SCHEMA_DIALECT,
        "title": title,
        "type": "object",
        "required": required,
        "additionalProperties": False,
        "properties": properties,
    }


PYTHON_CONFIG_SCHEMA = _config(
    "python step config",
    ["function"],
    {
        "function": {
            "type": "string",
            # 'pkg.module:callable' (a dotted qualname after the colon) or a registered name
            "pattern": r"^[A-Za-z_][A-Za-z0-9_.]*(:[A-Za-z_][A-Za-z0-9_.]*)?$",
            "description": "an import path 'pkg.module:callable' or a registered name",
        },
        "isolation": {
            "enum": ["thread", "process"],
            "default": "thread",
            "description": "thread, or process: a child process killed at the timeout",
        },
        "timeout": DURATION_SCHEMA,
        "kill_grace": _KILL_GRACE,
    },
)

HTTP_CONFIG_SCHEMA = _config(
    "http step config",
    ["url"],
    {
        "url": {
            "type": "string",
            "pattern": "^[Hh][Tt][Tt][Pp][Ss]?://",  # the scheme is case-insensitive
            "description": "an http(s) URL",
        },
        "method": {
            "type": "string",
            "pattern": "^[A-Za-z]+$",  # HTTP methods are extensible (PROPFIND, QUERY, …)
            "description": "an HTTP method such as GET or POST (default GET, POST with a body)",
        },
        "headers": {
            "type": "object",
            "additionalProperties": _SCALAR,
            "description": "a mapping of header names to values",
        },
        "query": {
            "type": "object",
            "additionalProperties": {
                "anyOf": [_SCALAR, {"type": "null"}, {"type": "array", "items": _SCALAR}]
            },
            "description": "a mapping of query parameters",
        },
        "body": {"description": "any JSON value: an object or array is sent as JSON, text as is"},
        "expect_status": {
            "anyOf": [_STATUS, {"type": "array", "items": _STATUS, "minItems": 1}],
            "description": "an HTTP status code or a list of them, e.g. [200, 201]",
        },
        "timeout": DURATION_SCHEMA,
        "max_response_bytes": {
            "type": "integer",
            "minimum": 1,
            "description": "a positive number of bytes",
        },
        "follow_redirects": {"type": "boolean", "default": True},
    },
)

SHELL_CONFIG_SCHEMA = _config(
    "shell step config",
    ["command"],
    {
        "command": {
            "type": "array",
            "items": {"type": ["string", "number"]},
            "minItems": 1,
            "description": "a list of argv strings, e.g. [echo, hello]",
        },
        "env": {
            "type": "object",
            "additionalProperties": _SCALAR,
            "description": "a mapping of variable names to values",
        },
        "env_allow": {
            "type": "array",
            "items": {"type": "string"},
            "description": "a list of worker environment variables passed on besides the defaults",
        },
        "cwd": {"type": "string", "minLength": 1, "description": "a directory path"},
        "timeout": DURATION_SCHEMA,
        "max_output_bytes": {
            "type": "integer",
            "minimum": 1,
            "description": "a positive number of bytes",
        },
        "stdin": {"enum": ["json", "none"], "default": "none"},
        "kill_grace": _KILL_GRACE,
    },
)

NOOP_CONFIG_SCHEMA = _config("noop step config", [], {})

BUILTIN_ACTION_TYPES: Mapping[str, Mapping[str, Any]] = {
    "python": PYTHON_CONFIG_SCHEMA,
    "http": HTTP_CONFIG_SCHEMA,
    "shell": SHELL_CONFIG_SCHEMA,
    "noop": NOOP_CONFIG_SCHEMA,
}
