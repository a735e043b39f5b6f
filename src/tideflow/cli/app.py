"""The `tideflow` command's typer app: thin over the DSL and the runtime.

Exit codes: 0 success; 1 the run ended in any state but `succeeded`, or
`validate` found errors; 2 a usage error, a definition that does not compile,
run input that is not valid JSON or does not fit the input schema, a store that
cannot be opened, or a run that is not in the store; 130 interrupted (Ctrl-C).

Commands: `run` (cli/run.py), `validate`, `graph` (cli/validate.py), `executors list`
(cli/executors.py), `resume`, `runs …` (cli/runs.py, cli/resume.py), `db …` (cli/db.py),
`tokens …` (cli/tokens.py) and the others of ``COMMANDS``.

The command starts fast (docs/operations.md, "A fast CLI"): ``--version`` is answered
before this module is imported (cli/main.py); the root group (``LazyGroup``) lists its commands
from ``COMMANDS`` and imports a command's module, and builds its click command, only
when that command is looked up; a command's options are converted without pydantic
when they can be (cli/params.py).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, MutableMapping
from importlib import import_module
from typing import Annotated, Any

import typer
import typer.core
import typer.main
import typer.models
from typer._click import Command, Context, HelpFormatter

from tideflow.cli.main import VERSION

COMMANDS: dict[str, tuple[str, str]] = {
    # name: (module:attribute, the first paragraph of the command's help)
    "resume": (
        "tideflow.cli.resume:resume_cmd",
        "Resume every unfinished run in the store and wait until they all end.",
    ),
    "server": (
        "tideflow.cli.cluster:server_cmd",
        "Run one of a cluster's engines: scheduler, relay, timers and recovery, no workers.",
    ),
    "worker": (
        "tideflow.cli.cluster:worker_cmd",
        "Run a worker pool on a cluster's bus: execute the tasks of its queues.",
    ),
    "ui": (
        "tideflow.cli.ui:ui_cmd",
        "Serve the web UI for a local store, running its engine and workers here.",
    ),
    "queues": (
        "tideflow.cli.queues:queues_cmd",
        "Show the task queues of a cluster's bus: per queue and priority, the tasks\n"
        "waiting (depth), delivered and not settled (held), the age of the oldest\n"
        "waiting one, and the workers reading the queue (consumers); then the workers,\n"
        "each with the queues it reads and its last heartbeat (a worker whose process\n"
        "died is listed as stopped, with the time its heartbeat stopped, for a day).",
    ),
    "validate": (
        "tideflow.cli.validate:validate_cmd",
        "Check definitions without running them: every problem of each, at once.",
    ),
    "graph": (
        "tideflow.cli.validate:graph_cmd",
        "Print the workflow's graph as Mermaid (default) or Graphviz DOT.",
    ),
    "run": (
        "tideflow.cli.run:run_cmd",
        "Run a workflow embedded (in-process bus and workers) and print its output.",
    ),
    "executors": (
        "tideflow.cli.executors:executors_app",
        "Inspect the executors (step types run by workers).",
    ),
    "runs": (
        "tideflow.cli.runs:runs_app",
        "List, inspect, cancel, signal, retry and resume the runs kept in a store.",
    ),
    "db": (
        "tideflow.cli.db:db_app",
        "Manage a store: schema migrations (upgrade, status) and retention (prune).",
    ),
    "definitions": (
        "tideflow.cli.definitions:definitions_app",
        "Register, list and show workflow definitions kept in a store.",
    ),
    "tokens": (
        "tideflow.cli.tokens:tokens_app",
        "Create, list and revoke the API tokens of a store (roles viewer, operator, admin).",
    ),
    "schedules": (
        "tideflow.cli.schedules:schedules_app",
        "List, create, pause, resume, trigger and delete the schedules of workflows.",
    ),
    "events": (
        "tideflow.cli.events:events_app",
        "The events the gateway kept as unmatched (the dead letter): list and replay them.",
    ),
}
"""Every command of `tideflow`, in the order its help lists them. The help text is what
`tideflow --help` shows without importing the command (tests/unit/cli/test_lazy_commands.py
keeps it equal to the command's own)."""


def build_command(name: str, group: typer.core.TyperGroup) -> Command:
    """The click command ``name`` of ``COMMANDS``, built as ``app.add_typer`` /
    ``app.command`` would have built it under ``group``, its options converted by
    cli/params.py."""
    from tideflow.cli.params import convert_plainly

    module, _, attribute = COMMANDS[name][0].partition(":")
    target = getattr(import_module(module), attribute)
    command: Command
    if isinstance(target, typer.Typer):
        command = typer.main.get_group_from_info(
            typer.models.TyperInfo(target, name=name),
            pretty_exceptions_short=app.pretty_exceptions_short,
            rich_markup_mode=group.rich_markup_mode,
            suggest_commands=group.suggest_commands,
        )
    else:
        holder = typer.Typer()
        holder.command(name)(target)
        command = typer.main.get_command_from_info(
            holder.registered_commands[0],
            pretty_exceptions_short=app.pretty_exceptions_short,
            rich_markup_mode=group.rich_markup_mode,
        )
    convert_plainly(command)
    return command


class _Commands(MutableMapping[str, Command]):
    """A group's commands: every name of ``COMMANDS``, each built on first look-up."""

    def __init__(self, group: typer.core.TyperGroup) -> None:
        self._group = group
        self._built: dict[str, Command] = {}

    def __getitem__(self, name: str) -> Command:
        command = self._built.get(name)
        if command is None:
            if name not in COMMANDS:
                raise KeyError(name)
            command = self._built[name] = build_command(name, self._group)
        return command

    def __setitem__(self, name: str, command: Command) -> None:
        self._built[name] = command

    def __delitem__(self, name: str) -> None:
        del self._built[name]

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys([*COMMANDS, *self._built]))

    def __len__(self) -> int:
        return len(dict.fromkeys([*COMMANDS, *self._built]))


class LazyGroup(typer.core.TyperGroup):
    """The root group (click's "lazy loading subcommands"): a command's module is
    imported when the command is looked up (to run it, or for its own ``--help``), and
    the group's help lists every command from ``COMMANDS`` without importing any."""

    def __init__(self, **attrs: Any) -> None:
        from tideflow.cli.params import convert_own_plainly

        super().__init__(**attrs)
        convert_own_plainly(self)
        self.commands = _Commands(self)

    def list_commands(self, ctx: Context) -> list[str]:
        return list(self.commands)

    def format_help(self, ctx: Context, formatter: HelpFormatter) -> None:
        listed = typer.core.TyperGroup(
            name=self.name,
            commands={
                name: typer.core.TyperCommand(name=name, help=help)
                for name, (_, help) in COMMANDS.items()
            },
            rich_markup_mode=self.rich_markup_mode,
            no_args_is_help=self.no_args_is_help,
            params=self.params,
            help=self.help,
            epilog=self.epilog,
            short_help=self.short_help,
            options_metavar=self.options_metavar,
            add_help_option=self.add_help_option,
        )
        listed.format_help(ctx, formatter)


app = typer.Typer(
    name="tideflow",
    help="tideflow: a durable, event-driven workflow engine.",
    cls=LazyGroup,
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
)


def _print_version(value: bool) -> None:
    if value:
        sys.stdout.write(VERSION + "\n")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            "-V",
            callback=_print_version,
            is_eager=True,
            help="Print the installed version and exit.",
        ),
    ] = False,
) -> None:
    from tideflow.cli.common import json_mode

    json_mode(False)  # each invocation starts in text mode; a command's --json switches
