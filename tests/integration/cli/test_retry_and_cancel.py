"""`tideflow runs retry` and `runs cancel` across processes: the run fails or waits in one
process, the command records its event in another, and `resume` carries it out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import Workdir, invoke, stdout_json, tideflow, waiting_runs
from .test_postgres import pg_store  # noqa: F401  (the fixture)

STEPS = """
import json
from pathlib import Path


def _log(name):
    with open("calls.log", "a", encoding="utf-8") as log:
        log.write(name + "\\n")


def reserve(sku):
    _log("reserve")
    return {"hold": "H-" + sku}


def charge():
    _log("charge")
    if not Path("payments-up").exists():
        raise ConnectionError("payment service unavailable")
    return {"charge_id": "C-1"}


def release(hold):
    _log("release:" + hold)
"""

FLAKY = """
name: flaky
version: "1"
steps:
  - {id: reserve, type: python, function: "retry_steps:reserve", input: {sku: "X"}}
  - {id: charge, type: python, function: "retry_steps:charge", depends_on: [reserve]}
output: "{{ steps.charge.output }}"
"""

SAGA = """
name: saga
version: "1"
on_failure: compensate
steps:
  - id: reserve
    type: python
    function: "retry_steps:reserve"
    input: {sku: "X"}
    compensate:
      type: python
      function: "retry_steps:release"
      input: {hold: "{{ steps.reserve.output.hold }}"}
  - {id: ask, type: wait, signal: approve, depends_on: [reserve]}
"""


@pytest.fixture
def flows(workdir: Workdir) -> Workdir:
    (workdir.path / "retry_steps.py").write_text(STEPS, encoding="utf-8")
    (workdir.path / "flaky.yaml").write_text(FLAKY, encoding="utf-8")
    (workdir.path / "saga.yaml").write_text(SAGA, encoding="utf-8")
    return workdir


def _calls(path: Path) -> list[str]:
    log = path / "calls.log"
    return log.read_text(encoding="utf-8").split() if log.exists() else []


def _history_kinds(store: str, run_id: str) -> list[str]:
    shown = invoke("runs", "history", run_id, "--json", "--store", store)
    assert shown.exit_code == 0, shown.stderr
    return [e["kind"] for e in stdout_json(shown)["events"]]


def _retry_across_processes(flows: Workdir, store: str) -> None:
    failed = tideflow(flows.path, "run", "flaky.yaml", "--store", store, "--json")
    assert failed.returncode == 1, failed.stderr
    run_id = stdout_json(failed)["run_id"]
    assert stdout_json(failed)["status"] == "failed"
    assert _calls(flows.path) == ["reserve", "charge"]

    (flows.path / "payments-up").touch()
    retried = tideflow(flows.path, "runs", "retry", run_id, "--reason", "fixed", "--store", store)
    assert retried.returncode == 0, retried.stderr
    assert "now running" in retried.stderr and "tideflow runs resume" in retried.stderr

    resumed = tideflow(flows.path, "runs", "resume", run_id, "--json", "--store", store)
    assert resumed.returncode == 0, resumed.stderr
    result = stdout_json(resumed)
    assert result["status"] == "succeeded"
    assert result["output"] == {"charge_id": "C-1"}
    assert result["steps"]["charge"]["attempts"] == 1  # a fresh attempt count
    assert _calls(flows.path) == ["reserve", "charge", "charge"]  # reserve did not run again
    kinds = _history_kinds(store, run_id)
    assert "run_retried" in kinds
    assert kinds.index("run_retried") < len(kinds) - 1

    again = tideflow(flows.path, "runs", "retry", run_id, "--store", store)
    assert again.returncode == 1
    assert "is succeeded: only a failed or timed-out run can be retried" in again.stderr
    assert "Traceback" not in again.stderr
    assert _history_kinds(store, run_id) == kinds


def test_a_failed_run_is_retried_by_the_cli_and_finished_by_resume(flows: Workdir) -> None:
    _retry_across_processes(flows, flows.store)


def test_retry_across_processes_on_postgresql(flows: Workdir, pg_store: str) -> None:  # noqa: F811
    _retry_across_processes(flows, pg_store)


def test_retry_of_a_running_run_exits_1_and_changes_nothing(flows: Workdir) -> None:
    (run_id,) = waiting_runs(flows.store, 1, flows.path / "wait.yaml")
    before = _history_kinds(flows.store, run_id)
    refused = invoke("runs", "retry", run_id, "--store", flows.store)
    assert refused.exit_code == 1
    assert f"run {run_id} is running" in refused.stderr
    assert _history_kinds(flows.store, run_id) == before


def test_cli_cancel_compensates_completed_steps_then_ends_cancelled(flows: Workdir) -> None:
    (run_id,) = waiting_runs(flows.store, 1, flows.path / "saga.yaml")
    assert _calls(flows.path) == ["reserve"]

    cancelled = tideflow(flows.path, "runs", "cancel", run_id, "--store", flows.store)
    assert cancelled.returncode == 0, cancelled.stderr
    assert "now compensating" in cancelled.stderr

    resumed = tideflow(flows.path, "runs", "resume", run_id, "--json", "--store", flows.store)
    result = stdout_json(resumed)
    assert result["status"] == "cancelled", resumed.stderr
    assert result["error"]["type"] == "Cancelled"
    assert result["compensation"] == {
        "outcome": "compensated",
        "steps": {"reserve": {"status": "succeeded", "attempts": 1, "error": None}},
    }
    assert _calls(flows.path) == ["reserve", "release:H-X"]

    kinds = _history_kinds(flows.store, run_id)
    again = tideflow(flows.path, "runs", "cancel", run_id, "--store", flows.store)
    assert again.returncode == 1
    assert "already ended (cancelled): nothing to cancel" in again.stderr
    assert "Traceback" not in again.stderr
    assert _history_kinds(flows.store, run_id) == kinds


def test_cli_cancel_of_a_compensating_run_exits_1_and_changes_nothing(flows: Workdir) -> None:
    (run_id,) = waiting_runs(flows.store, 1, flows.path / "saga.yaml")
    assert invoke("runs", "cancel", run_id, "--store", flows.store).exit_code == 0
    kinds = _history_kinds(flows.store, run_id)
    again = invoke("runs", "cancel", run_id, "--store", flows.store)
    assert again.exit_code == 1
    assert f"run {run_id} is compensating: nothing to cancel" in again.stderr
    assert _history_kinds(flows.store, run_id) == kinds
    assert (
        json.loads(invoke("runs", "show", run_id, "--json", "--store", flows.store).stdout)[
            "status"
        ]
        == "compensating"
    )
