"""A working directory with workflows and step functions, and two ways to call `tideflow`:
as a real subprocess (``tideflow``) or in-process through typer's runner (``invoke``)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from tideflow.cli.main import app
from tideflow.runtime.runtime import Runtime
from tideflow.testing.waiting import step_is, wait_until

STEPS_MODULE = "cli_test_steps"

STEPS = """
def echo(value):
    return {"echo": value}
"""

WAIT = f"""
name: approval
version: "1"
steps:
  - {{id: ask, type: wait, signal: approve}}
  - id: done
    type: python
    function: "{STEPS_MODULE}:echo"
    depends_on: [ask]
    input: {{value: "{{{{ steps.ask.output }}}}"}}
output: "{{{{ steps.done.output }}}}"
"""

QUICK = f"""
name: quick
version: "1"
steps:
  - {{id: a, type: python, function: "{STEPS_MODULE}:echo", input: {{value: "{{{{ inputs }}}}"}}}}
output: "{{{{ steps.a.output }}}}"
"""


@dataclass
class Workdir:
    path: Path

    @property
    def store(self) -> str:
        """An absolute SQLite URL (four slashes) for a database in this directory."""
        return f"sqlite:///{self.path / 'runs.db'}"

    @property
    def db(self) -> Path:
        return self.path / "runs.db"


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Workdir]:
    (tmp_path / f"{STEPS_MODULE}.py").write_text(textwrap.dedent(STEPS), encoding="utf-8")
    (tmp_path / "wait.yaml").write_text(WAIT, encoding="utf-8")
    (tmp_path / "quick.yaml").write_text(QUICK, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # `run` puts the cwd on sys.path
    monkeypatch.delenv("TIDEFLOW_STORE", raising=False)
    yield Workdir(tmp_path)
    sys.modules.pop(STEPS_MODULE, None)


def tideflow(
    cwd: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`tideflow ARGS` as a real process in ``cwd``."""
    return subprocess.run(
        [sys.executable, "-m", "tideflow.cli.main", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env={**os.environ, **(env or {})},
    )


def command_paths() -> list[list[str]]:
    """Every command `tideflow` runs, as its words (``["runs", "list"]``), in help order:
    read from the click commands (the root group builds each on demand)."""
    import typer
    import typer.main

    root = typer.main.get_command(app)
    context = typer.Context(root)
    found: list[list[str]] = []
    for name in root.list_commands(context):  # type: ignore[attr-defined]
        command = root.get_command(context, name)  # type: ignore[attr-defined]
        subcommands = getattr(command, "commands", None)
        if subcommands is None:
            found.append([name])
        else:
            found += [[name, sub] for sub in subcommands]
    return found


def invoke(*args: str, env: dict[str, str] | None = None) -> Result:
    """`tideflow ARGS` in this process (stdout and stderr captured apart)."""
    return CliRunner().invoke(app, list(args), env=env)


def stdout_json(result: Result | subprocess.CompletedProcess[str]) -> Any:
    return json.loads(result.stdout)


def waiting_runs(store: str, count: int, workflow: Path) -> list[str]:
    """Start ``count`` runs that wait for the signal `approve`, then stop the runtime."""

    async def start() -> list[str]:
        async with Runtime(store=store, workers=1) as rt:
            ids = []
            for _ in range(count):
                run_id = await rt.start_run(workflow)
                await wait_until(rt, run_id, step_is("ask", "waiting"))
                ids.append(run_id)
            return ids

    return asyncio.run(start())
