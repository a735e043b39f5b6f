"""An attempt's timeout counts from when a worker starts it, not from when `runs signal`
dispatched it with no engine running (real `tideflow` processes on a SQLite store)."""

from __future__ import annotations

from typing import Any

from .conftest import Workdir, stdout_json, tideflow, waiting_runs

STEPS = """
import time


def pause(seconds):
    time.sleep(seconds)  # the step's own work: well inside its timeout
    return "done"
"""

LATE = """
name: late
version: "1"
steps:
  - {id: ask, type: wait, signal: approve}
  - id: act
    type: python
    function: "clock_steps:pause"
    depends_on: [ask]
    input: {seconds: 0.5}
    timeout: 5s
    schedule_to_start: 10s
output: "{{ steps.act.output }}"
"""

AN_HOUR_LATER = {"TIDEFLOW_CLOCK_OFFSET": "3600"}
"""The resuming process's clock runs an hour ahead: an hour passed since the signal."""


def _act_transitions(history: dict[str, Any]) -> list[dict[str, Any]]:
    return [t for e in history["events"] for t in e["transitions"] if t["subject"] == "act"]


def test_a_step_dispatched_by_signal_times_out_from_its_start_on_a_late_resume(
    workdir: Workdir,
) -> None:
    (workdir.path / "clock_steps.py").write_text(STEPS, encoding="utf-8")
    (workdir.path / "late.yaml").write_text(LATE, encoding="utf-8")
    (run_id,) = waiting_runs(workdir.store, 1, workdir.path / "late.yaml")

    signalled = tideflow(
        workdir.path, "runs", "signal", run_id, "approve", "--store", workdir.store
    )
    assert signalled.returncode == 0, signalled.stderr
    history = stdout_json(
        tideflow(workdir.path, "runs", "history", run_id, "--json", "--store", workdir.store)
    )
    causes = [t["cause"] for t in _act_transitions(history)]
    assert causes[-1] == "attempt 1 dispatched"  # no engine: nothing started it

    resumed = tideflow(
        workdir.path, "resume", "--json", "--store", workdir.store, env=AN_HOUR_LATER
    )
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    (run,) = stdout_json(resumed)["runs"]
    assert (run["status"], run["output"], run["error"]) == ("succeeded", "done", None)
    assert run["steps"]["act"]["attempts"] == 1

    history = stdout_json(
        tideflow(workdir.path, "runs", "history", run_id, "--json", "--store", workdir.store)
    )
    kinds = [e["kind"] for e in history["events"]]
    assert kinds[-2:] == ["task_started", "task_completed"]
    moves = [(t["old"], t["new"], t["cause"]) for t in _act_transitions(history)]
    assert [m[:2] for m in moves[-3:]] == [
        ("ready", "running"),
        ("running", "running"),
        ("running", "succeeded"),
    ]
    assert moves[-2][2].startswith("attempt 1 started by ")
    shown = tideflow(workdir.path, "runs", "history", run_id, "--store", workdir.store)
    assert "attempt 1 started" in shown.stdout
