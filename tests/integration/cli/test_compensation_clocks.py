"""A compensation's timeout counts from when a worker starts it, not from when `runs
cancel` dispatched it with no engine running (real `tideflow` processes on a SQLite
store, the resuming one with its clock an hour ahead)."""

from __future__ import annotations

from typing import Any

from .conftest import Workdir, stdout_json, tideflow, waiting_runs

STEPS = """
import time


def book():
    return "B1"


def unbook(seconds):
    time.sleep(seconds)  # the compensation's own work: well inside its timeout
    return "undone"
"""

SAGA = """
name: saga
version: "1"
on_failure: compensate
steps:
  - id: book
    type: python
    function: "saga_steps:book"
    compensate:
      type: python
      function: "saga_steps:unbook"
      input: {seconds: 0.5}
      timeout: 5s
      retry: {max_attempts: 1}
  - {id: ask, type: wait, signal: approve, depends_on: [book]}
"""

AN_HOUR_LATER = {"TIDEFLOW_CLOCK_OFFSET": "3600"}


def _compensation_moves(history: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [
        (t["old"], t["new"], t["cause"])
        for e in history["events"]
        for t in e["transitions"]
        if t["subject"] == "book:compensate"
    ]


def test_a_compensation_dispatched_by_cancel_times_out_from_its_start_on_a_late_resume(
    workdir: Workdir,
) -> None:
    (workdir.path / "saga_steps.py").write_text(STEPS, encoding="utf-8")
    (workdir.path / "saga.yaml").write_text(SAGA, encoding="utf-8")
    (run_id,) = waiting_runs(workdir.store, 1, workdir.path / "saga.yaml")

    cancelled = tideflow(workdir.path, "runs", "cancel", run_id, "--store", workdir.store)
    assert cancelled.returncode == 0, cancelled.stderr
    history = stdout_json(
        tideflow(workdir.path, "runs", "history", run_id, "--json", "--store", workdir.store)
    )
    assert _compensation_moves(history)[-1][2] == "compensation attempt 1 dispatched"

    resumed = tideflow(
        workdir.path, "resume", "--json", "--store", workdir.store, env=AN_HOUR_LATER
    )
    assert resumed.returncode == 1, resumed.stdout + resumed.stderr  # it did not succeed
    (run,) = stdout_json(resumed)["runs"]
    assert (run["status"], run["error"]["type"]) == ("cancelled", "Cancelled")
    assert run["compensation"]["outcome"] == "compensated"
    assert run["compensation"]["steps"]["book"]["status"] == "succeeded"
    assert run["compensation"]["steps"]["book"]["attempts"] == 1

    history = stdout_json(
        tideflow(workdir.path, "runs", "history", run_id, "--json", "--store", workdir.store)
    )
    moves = _compensation_moves(history)
    assert [m[:2] for m in moves[-2:]] == [("running", "running"), ("running", "succeeded")]
    assert moves[-2][2].startswith("compensation attempt 1 started by ")
