"""The built-in executors' config schemas: one source for the DSL and the worker."""

from __future__ import annotations

from typing import Any

import pytest
from jsonschema import Draft202012Validator

from tideflow.dsl.inputs import BUILTIN_ACTION_TYPES as DSL_ACTION_TYPES
from tideflow.model.action_schemas import BUILTIN_ACTION_TYPES, DURATION_SCHEMA
from tideflow.worker.executors.base import Executor
from tideflow.worker.executors.http import HttpExecutor
from tideflow.worker.executors.noop import NoopExecutor
from tideflow.worker.executors.python import PythonExecutor
from tideflow.worker.executors.shell import ShellExecutor


def test_the_dsl_and_the_executors_read_the_same_schemas() -> None:
    executors: list[type[Executor]] = [PythonExecutor, HttpExecutor, ShellExecutor, NoopExecutor]
    assert {e.name: e.config_schema for e in executors} == BUILTIN_ACTION_TYPES
    assert all(e.config_schema is BUILTIN_ACTION_TYPES[e.name] for e in executors)
    assert DSL_ACTION_TYPES is BUILTIN_ACTION_TYPES


@pytest.mark.parametrize("schema", list(BUILTIN_ACTION_TYPES.values()))
def test_schemas_are_valid_draft_2020_12(schema: dict[str, Any]) -> None:
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"


@pytest.mark.parametrize("kind", ["python", "http", "shell"])
def test_timeouts_are_durations(kind: str) -> None:
    assert BUILTIN_ACTION_TYPES[kind]["properties"]["timeout"] is DURATION_SCHEMA
    assert DURATION_SCHEMA["x-duration"] is True


@pytest.mark.parametrize(
    ("kind", "config", "valid"),
    [
        ("python", {"function": "pkg.mod:func"}, True),
        ("python", {"function": "pkg.mod:Class.method"}, True),
        ("python", {"function": "rt.add"}, True),
        ("python", {"function": "not a path"}, False),
        ("python", {"function": ""}, False),
        ("http", {"url": "https://example.org/x"}, True),
        ("http", {"url": "HTTP://example.org/x"}, True),
        ("http", {"url": "ftp://example.org/x"}, False),
        ("http", {"url": "https://x", "method": "PROPFIND"}, True),
        ("http", {"url": "https://x", "method": "GET /"}, False),
        ("http", {"url": "https://x", "expect_status": [200, 404]}, True),
        ("http", {"url": "https://x", "expect_status": 42}, False),
        ("shell", {"command": ["echo", "hi"]}, True),
        ("shell", {"command": []}, False),
        ("noop", {}, True),
        ("noop", {"x": 1}, False),
    ],
)
def test_what_the_schemas_accept(kind: str, config: dict[str, Any], valid: bool) -> None:
    assert Draft202012Validator(BUILTIN_ACTION_TYPES[kind]).is_valid(config) is valid
