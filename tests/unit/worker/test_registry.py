"""The executor registry: built-ins, entry-point plugins, code registration, schemas."""

from __future__ import annotations

from collections.abc import Mapping
from importlib.metadata import EntryPoint
from typing import Any, ClassVar

import pytest
from jsonschema import Draft202012Validator

from tideflow.errors import ExecutorNotFound
from tideflow.worker.executors import registry as registry_module
from tideflow.worker.executors.base import Executor, StepContext
from tideflow.worker.executors.errors import ExecutorPluginError
from tideflow.worker.executors.http import HttpExecutor
from tideflow.worker.executors.python import PythonExecutor
from tideflow.worker.executors.registry import ENTRY_POINT_GROUP, ExecutorRegistry

from .conftest import make_ctx

BUILTINS = {"python", "http", "shell", "noop"}


class Shout(Executor):
    name: ClassVar[str] = "shout"
    config_schema: ClassVar[Mapping[str, Any]] = {
        "type": "object",
        "properties": {"word": {"type": "string"}},
        "required": ["word"],
    }

    async def execute(self, ctx: StepContext, config: Mapping[str, Any], input: Any) -> Any:
        return config["word"].upper() + "!"


class BadSchema(Shout):
    config_schema: ClassVar[Mapping[str, Any]] = {"type": "no-such-type"}


def _point(name: str, value: str) -> EntryPoint:
    return EntryPoint(name=name, value=value, group=ENTRY_POINT_GROUP)


@pytest.fixture
def fake_plugins(monkeypatch: pytest.MonkeyPatch) -> list[EntryPoint]:
    """Entry points that the registry discovers in place of the installed ones."""
    points: list[EntryPoint] = []
    monkeypatch.setattr(registry_module, "entry_points", lambda group: list(points))
    return points


async def test_builtins_are_there() -> None:
    registry = ExecutorRegistry(discover=False)
    assert set(registry.names()) == BUILTINS
    assert await registry.get("noop").execute(make_ctx(), {}, {"a": 1}) == {"a": 1}
    await registry.aclose()


async def test_the_installed_example_plugin_is_discovered() -> None:
    registry = ExecutorRegistry()
    assert "echo_upper" in registry.names()
    assert registry.problems() == {}
    assert registry.schemas()["echo_upper"]["properties"]["text"] == {
        "type": "string",
        "description": "text to upper-case instead of the input",
    }
    executor = registry.get("echo_upper")
    assert await executor.execute(make_ctx(), {"text": "hi"}, None) == "HI"
    assert await executor.execute(make_ctx(), {}, {"a": ["b", 1]}) == {"a": ["B", 1]}
    info = {i.name: i for i in registry.describe()}["echo_upper"]
    assert info.source.startswith("plugin tideflow-example-plugin")
    await registry.aclose()


async def test_executors_are_created_lazily_once_per_registry() -> None:
    first, second = ExecutorRegistry(discover=False), ExecutorRegistry(discover=False)
    assert first.get("http") is first.get("http")
    assert first.get("http") is not second.get("http")
    await first.aclose()
    await second.aclose()


async def test_aclose_closes_created_executors() -> None:
    registry = ExecutorRegistry(discover=False)
    http = registry.get("http")
    assert isinstance(http, HttpExecutor)
    client = http.client
    await registry.aclose()
    assert client.is_closed


def test_options_reach_builtin_constructors() -> None:
    registry = ExecutorRegistry(discover=False, options={"python": {"max_workers": 3}})
    executor = registry.get("python")
    assert isinstance(executor, PythonExecutor)
    assert executor.pool.max_workers == 3
    executor.pool.shutdown()


def test_unknown_step_type_suggests_a_name() -> None:
    registry = ExecutorRegistry(discover=False)
    with pytest.raises(ExecutorNotFound) as caught:
        registry.get("htp")
    assert "did you mean 'http'" in caught.value.message
    assert not caught.value.retryable


def test_plugin_that_fails_to_import_is_reported_not_fatal(fake_plugins: list[EntryPoint]) -> None:
    fake_plugins.append(_point("broken", "tf_no_such_plugin_module:Thing"))
    fake_plugins.append(_point("shout", f"{__name__}:Shout"))
    registry = ExecutorRegistry()
    assert {"broken", "shout"} <= set(registry.names())
    assert "broken" not in registry.schemas()
    assert "shout" in registry.schemas()
    problem = registry.problems()["broken"]
    assert "entry point 'broken = tf_no_such_plugin_module:Thing'" in problem
    assert "ModuleNotFoundError" in problem
    with pytest.raises(ExecutorPluginError, match="tf_no_such_plugin_module"):
        registry.get("broken")


def test_plugin_that_is_not_an_executor(fake_plugins: list[EntryPoint]) -> None:
    fake_plugins.append(_point("dumps", "json:dumps"))
    registry = ExecutorRegistry()
    assert "not an Executor subclass or instance" in registry.problems()["dumps"]


def test_plugin_with_an_invalid_schema(fake_plugins: list[EntryPoint]) -> None:
    fake_plugins.append(_point("bad", f"{__name__}:BadSchema"))
    assert "not a valid JSON Schema" in ExecutorRegistry().problems()["bad"]


def test_plugin_instance_entry_point(fake_plugins: list[EntryPoint]) -> None:
    fake_plugins.append(_point("shout2", f"{__name__}:SHOUT_INSTANCE"))
    registry = ExecutorRegistry()
    assert registry.get("shout2") is SHOUT_INSTANCE


SHOUT_INSTANCE = Shout()


def test_plugin_cannot_shadow_a_builtin(fake_plugins: list[EntryPoint]) -> None:
    fake_plugins.append(_point("http", f"{__name__}:Shout"))
    registry = ExecutorRegistry()
    assert isinstance(registry.get("http"), HttpExecutor)
    assert "is ignored" in registry.problems()["http"]


async def test_register_from_code() -> None:
    registry = ExecutorRegistry(discover=False)
    registry.register(Shout)
    assert await registry.get("shout").execute(make_ctx(), {"word": "hey"}, None) == "HEY!"
    with pytest.raises(ValueError, match="registered already"):
        registry.register(Shout())
    replacement = Shout()
    registry.register(replacement, replace=True)
    assert registry.get("shout") is replacement
    registry.register(Shout(), name="yell")
    assert "yell" in registry.schemas()
    assert [i.source for i in registry.describe() if i.name == "yell"] == ["code"]


def test_register_checks_the_schema() -> None:
    with pytest.raises(ValueError, match="not a valid JSON Schema"):
        ExecutorRegistry(discover=False).register(BadSchema)


def test_builtin_schemas_are_valid_2020_12() -> None:
    schemas = ExecutorRegistry(discover=False).schemas()
    assert set(schemas) == BUILTINS
    for schema in schemas.values():
        Draft202012Validator.check_schema(schema)


@pytest.mark.parametrize(
    ("name", "config", "valid"),
    [
        (
            "http",
            {
                "url": "https://x",
                "method": "POST",
                "body": {"a": 1},
                "expect_status": [200, 201],
                "headers": {"A": "b"},
                "query": {"q": 1},
                "timeout": "30s",
                "max_response_bytes": 10,
                "follow_redirects": False,
            },
            True,
        ),
        ("http", {"method": "GET"}, False),
        ("http", {"url": "https://x", "retries": 3}, False),
        (
            "shell",
            {
                "command": ["ls", "-l"],
                "env": {"A": "1"},
                "env_allow": ["AWS_REGION"],
                "cwd": "/tmp",
                "timeout": 5,
                "max_output_bytes": 100,
                "stdin": "json",
            },
            True,
        ),
        ("shell", {"command": "ls -l"}, False),
        ("shell", {"command": []}, False),
        ("python", {"function": "pkg.mod:fn", "isolation": "process", "timeout": "2m"}, True),
        ("python", {"function": "pkg.mod:fn", "isolation": "fork"}, False),
        ("noop", {}, True),
        ("noop", None, True),
    ],
)
def test_config_problems(name: str, config: Any, valid: bool) -> None:
    problems = ExecutorRegistry(discover=False).config_problems(name, config)
    assert (problems == []) is valid, problems
