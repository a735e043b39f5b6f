"""What `tideflow runs show` shows of steps and attempts (runtime/shown.py, as the API
and the UI): a compensated step shows `compensated`, a cancelled attempt `cancelled`;
and what `tideflow run --json` prints: the run's JSON alone, whatever its steps print."""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tideflow.model.run import RunState
from tideflow.runtime.runtime import Runtime
from tideflow.testing.waiting import wait_until
from tideflow.worker.executors.functions import register, unregister

from .conftest import Workdir, invoke, stdout_json, tideflow

RELEASE = threading.Event()

SAGA = """
name: saga
version: "1"
on_failure: compensate
steps:
  - id: reserve
    type: python
    function: shown_steps:reserve
    compensate:
      type: python
      function: shown_steps:release
      input: {hold: "{{ steps.reserve.output.hold }}"}
  - {id: ship, type: python, function: "shown_steps:ship", depends_on: [reserve]}
"""
STEPS = """
def reserve():
    print("reserving, chatty on stdout")
    return {"hold": "H1"}

def release(hold):
    print("releasing", hold)
    return {"released": hold}

def ship():
    print("shipping...")
    raise ValueError("the carrier refused the address")

def chatty(n):
    print("a step that prints", n)
    return {"n": n}
"""
CHATTY = """
name: chatty
version: "1"
steps:
  - {id: talk, type: python, function: "shown_steps:chatty", input: {n: 7}}
output: "{{ steps.talk.output }}"
"""
BLOCKED = """
name: blocked
version: "1"
steps:
  - {id: work, type: python, function: shown.block}
"""


@pytest.fixture
def files(workdir: Workdir) -> Iterator[Path]:
    (workdir.path / "shown_steps.py").write_text(textwrap.dedent(STEPS), encoding="utf-8")
    (workdir.path / "saga.yaml").write_text(SAGA, encoding="utf-8")
    (workdir.path / "chatty.yaml").write_text(CHATTY, encoding="utf-8")
    (workdir.path / "blocked.yaml").write_text(BLOCKED, encoding="utf-8")
    yield workdir.path
    sys.modules.pop("shown_steps", None)


def test_runs_show_shows_a_compensated_step_and_its_compensation_attempt(
    workdir: Workdir, files: Path
) -> None:
    done = tideflow(files, "run", "saga.yaml", "--store", workdir.store, "--json")
    assert done.returncode == 1, done.stderr
    run_id = stdout_json(done)["run_id"]

    shown = invoke("runs", "show", run_id, "--json", "--store", workdir.store)
    assert shown.exit_code == 0, shown.stderr
    detail = stdout_json(shown)
    assert detail["status"] == "compensated"
    assert detail["steps"]["reserve"]["status"] == "compensated"
    assert detail["steps"]["ship"]["status"] == "failed"
    rows = [(a["step_key"], a["compensation"], a["outcome"]) for a in detail["attempts"]]
    assert rows == [
        ("reserve", False, "succeeded"),
        ("ship", False, "failed"),
        ("reserve", True, "succeeded"),
    ]
    assert all(a["ended_at"].endswith("Z") for a in detail["attempts"])

    text = invoke("runs", "show", run_id, "--store", workdir.store)
    assert text.exit_code == 0, text.stderr
    reserve_row = next(line for line in text.stdout.splitlines() if line.startswith("│ reserve "))
    assert "compensated" in reserve_row
    assert "reserve (compensation)" in text.stdout


def started(key: str) -> Callable[[RunState], bool]:
    def check(state: RunState) -> bool:
        st = state.steps.get(key)
        return st is not None and st.attempt_started_at is not None

    return check


@pytest.fixture
def blocking() -> Iterator[None]:
    RELEASE.clear()

    @register("shown.block")
    def block() -> str:
        RELEASE.wait(30)  # until the test is done with it (a worker thread cannot be killed)
        return "late"

    yield
    RELEASE.set()
    unregister("shown.block")


def test_runs_show_ends_a_cancelled_attempt_cancelled(
    workdir: Workdir, files: Path, blocking: None
) -> None:
    async def cancelled_while_running() -> str:
        async with Runtime(store=workdir.store, workers=1) as rt:
            run_id = await rt.start_run(files / "blocked.yaml")
            await wait_until(rt, run_id, started("work"))
            await rt.cancel(run_id, "not needed")
            await rt.wait(run_id, timeout=20)
            return run_id

    run_id = asyncio.run(cancelled_while_running())
    shown = invoke("runs", "show", run_id, "--json", "--store", workdir.store)
    assert shown.exit_code == 0, shown.stderr
    detail = stdout_json(shown)
    assert detail["steps"]["work"]["status"] == "cancelled"
    [attempt] = detail["attempts"]
    assert (attempt["outcome"], attempt["error"]) == ("cancelled", "not needed")
    text = invoke("runs", "show", run_id, "--store", workdir.store)
    attempts_table = text.stdout.split("attempts", 1)[1]
    assert "│ work " in attempts_table and "cancelled" in attempts_table
    assert "running" not in attempts_table


def test_what_a_step_prints_never_reaches_the_json_on_stdout(workdir: Workdir, files: Path) -> None:
    done = tideflow(files, "run", "chatty.yaml", "--store", workdir.store, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["output"] == {"n": 7}  # stdout is the JSON alone
    assert "a step that prints 7" in done.stderr
    in_process = invoke("run", "chatty.yaml", "--store", workdir.store, "--json")
    assert json.loads(in_process.stdout)["output"] == {"n": 7}
    assert "a step that prints 7" in in_process.stderr
    # what it printed is its attempt's output (docs/operations.md, Step output)
    for run in (done, in_process):
        run_id = json.loads(run.stdout)["run_id"]
        logs = stdout_json(invoke("runs", "logs", run_id, "--json", "--store", workdir.store))
        (attempt,) = logs["attempts"]
        assert attempt["streams"]["stdout"]["text"] == "a step that prints 7\n"
