"""The root group lists its commands from a static table (cli/app.py ``COMMANDS``) and
builds a command when it is looked up; options convert plain values without pydantic
(cli/params.py). These tests keep the table equal to the commands and the plain
conversion equal to typer's own."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

import pytest
import typer
import typer.main
from typer._click import Command, Context
from typer._click.exceptions import BadParameter
from typer._coercion import build_runtime_param
from typer.core import TyperArgument, TyperGroup, TyperOption
from typer.testing import CliRunner

from tideflow.cli.app import COMMANDS, LazyGroup, build_command
from tideflow.cli.main import app
from tideflow.cli.params import PlainParam


def _root() -> LazyGroup:
    root = typer.main.get_command(app)
    assert isinstance(root, LazyGroup)
    return root


@pytest.mark.parametrize("name", list(COMMANDS))
def test_the_table_says_what_the_command_says_of_itself(name: str) -> None:
    """What `tideflow --help` lists without importing the command is the first paragraph
    of the command's own help, and nothing the listing leaves out would show."""
    command = build_command(name, _root())
    assert command.name == name
    first = inspect.cleandoc(command.short_help or command.help or "").split("\n\n")[0]
    assert COMMANDS[name][1] == first
    assert not command.hidden and not command.deprecated
    assert not getattr(command, "rich_help_panel", None)  # the default panel


def test_the_listing_is_the_help_the_built_commands_give() -> None:
    """The whole root help, listed from the table, is what click renders once every
    command is built."""
    listed = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "100"})
    root = _root()
    for name in COMMANDS:
        root.get_command(Context(root), name)  # built: the group now holds the real ones

    class Built(LazyGroup):
        def format_help(self, ctx: Any, formatter: Any) -> None:
            TyperGroup.format_help(self, ctx, formatter)

    built_app = typer.Typer(
        name="tideflow",
        help=root.help,
        cls=Built,
        no_args_is_help=True,
        add_completion=False,
        rich_markup_mode="rich",
    )
    built_app.registered_callback = app.registered_callback
    built = CliRunner().invoke(built_app, ["--help"], env={"COLUMNS": "100"})
    assert listed.exit_code == built.exit_code == 0
    assert listed.stdout == built.stdout
    assert "runs" in listed.stdout and "queues" in listed.stdout


def test_a_command_is_built_when_looked_up_and_once() -> None:
    root = _root()
    assert list(root.commands) == list(COMMANDS)
    context = Context(root)
    runs = root.get_command(context, "runs")
    assert runs is not None and runs is root.get_command(context, "runs")
    assert root.get_command(context, "nope") is None


def test_a_typo_is_still_told_the_command_it_resembles() -> None:
    done = CliRunner().invoke(app, ["rnus"])
    assert done.exit_code == 2
    assert "Did you mean 'runs'?" in done.stderr


def _plain_params() -> Iterator[tuple[str, Command, TyperOption | TyperArgument]]:
    root = _root()
    for name in COMMANDS:
        stack = [build_command(name, root)]
        while stack:
            command = stack.pop()
            stack.extend(getattr(command, "commands", {}).values())
            for param in command.get_params(Context(command)):
                if isinstance(param, TyperOption | TyperArgument) and isinstance(
                    param._runtime_param, PlainParam
                ):
                    yield f"{name} {command.name} {param.name}", command, param


VALUES = [
    "",
    "abc",
    "0",
    "7",
    "007",
    "50",
    "1000",
    "1001",
    "-1",
    "+3",
    " 3",
    "1_000",
    "1.5",
    "0.25",
    "1e3",
    "inf",
    "nan",
    "12345678901234567890",
    "١٢",
    "x\udcff",
    0,
    3,
    2.5,
    True,
]


def _converted(runtime: Any, value: Any, param: Any, ctx: Context) -> tuple[str, Any]:
    try:
        result = runtime.coerce(value, param=param, ctx=ctx)
    except BadParameter as exc:
        return "error", exc.format_message()
    return type(result).__name__, repr(result)  # repr: a NaN equals itself


def test_every_command_converts_its_plain_options_plainly() -> None:
    """Without this, each command run would import pydantic (the import tests check it)."""
    params = {where: param for where, _, param in _plain_params()}
    assert "runs list limit" in params and "runs list store" in params
    assert "runs list help" in params  # the --help option too


def test_plain_conversion_is_typers_for_every_value() -> None:
    """Every plain parameter of every command converts every value as typer's own
    conversion (pydantic's adapter) does: the same value and type, or the same error."""
    compared = 0
    for where, command, param in _plain_params():
        ctx = Context(command)
        typers = build_runtime_param(param.type_descriptor)
        for value in VALUES:
            plain = _converted(param._runtime_param, value, param, ctx)
            assert plain == _converted(typers, value, param, ctx), (where, value)
            compared += 1
    assert compared > 1000


def test_the_plain_conversion_can_differ() -> None:
    """The comparison above can fail: a conversion that kept digits as text is caught."""
    _, command, param = next(p for p in _plain_params() if p[0] == "runs list limit")
    ctx = Context(command)
    typers = build_runtime_param(param.type_descriptor)
    assert _converted(typers, "7", param, ctx) != ("str", repr("7"))
