"""`tideflow executors …`: the executors (step types run by workers) installed here."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from tideflow.cli.common import err, json_mode, out, registry

executors_app = typer.Typer(
    help="Inspect the executors (step types run by workers).", no_args_is_help=True
)


@executors_app.command("list")
def executors_list(
    as_json: Annotated[
        bool,
        typer.Option("--json", help="Print names and config schemas as JSON.", callback=json_mode),
    ] = False,
) -> None:
    """Show the installed executors and their config schemas.

    Examples:
      tideflow executors list
      tideflow executors list --json
    """
    executors = registry()
    schemas = executors.schemas()
    if as_json:
        sys.stdout.write(json.dumps(schemas, indent=2, default=str) + "\n")
        return
    for name in sorted(schemas):
        schema = schemas[name] or {}
        keys = ", ".join(sorted((schema.get("properties") or {}).keys())) or "-"
        out.print(f"{name:<16} config: {keys}", markup=False)
    for problem in getattr(executors, "problems", list)():
        err.print(f"warning: {problem}", markup=False)
