"""The root of the `tideflow` command as data: its name, usage, help, options and
commands. It imports nothing, so the entry point (cli/main.py) can answer ``--version``
and ``--help`` from it without typer; the typer app (cli/app.py) is built from the same
table, so there is one.

tests/unit/cli/test_lazy_commands.py keeps ``COMMANDS`` equal to the commands' own help;
tests/unit/cli/test_root_help.py keeps the help printed from this table (cli/root_help.py)
byte for byte equal to typer's.
"""

from __future__ import annotations

PROG = "tideflow"
"""The command's name, as its usage line and its errors show it."""

USAGE = "[OPTIONS] COMMAND [ARGS]..."
"""What the usage line shows after the name: click's options metavar and typer's
subcommand metavar."""

HELP = "tideflow: a durable, event-driven workflow engine."
"""The root's help text (rich markup)."""


class Flag:
    """An option of the root that takes no value (a plain class: a NamedTuple or a
    dataclass would cost ``--version`` a tenth of its time)."""

    __slots__ = ("help", "long", "short")

    def __init__(self, long: str, short: str, help: str) -> None:
        self.long = long
        self.short = short
        """The short form, or "" when it has none."""
        self.help = help


VERSION_OPTION = Flag("--version", "-V", "Print the installed version and exit.")
HELP_OPTION = Flag("--help", "", "Show this message and exit.")
"""click's own help option (the app does not declare it; typer adds it)."""

OPTIONS = (VERSION_OPTION, HELP_OPTION)
"""The root's options, in the order its help lists them."""

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
`tideflow --help` shows without importing the command."""
