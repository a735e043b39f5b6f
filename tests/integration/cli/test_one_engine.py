"""One engine per store, with real processes: a second `tideflow run` or `resume` on a
store another engine runs on is refused (no step runs twice), and `tideflow runs
signal` / `runs cancel` from another process reach the live `tideflow run`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import Workdir, stdout_json, tideflow, waiting_runs
from .test_postgres import pg_store  # noqa: F401  (the fixture)

STEPS = """
import sys
import time
from pathlib import Path


def _log(name):
    with open("executions.log", "a", encoding="utf-8") as log:
        log.write(name + "\\n")


def first():
    _log("first")
    print("first-ran", file=sys.stderr, flush=True)


def second(value):
    _log("second")
    return {"got": value}


def charge():
    _log("charge")
    if not Path("payments-up").exists():
        raise ConnectionError("payment service unavailable")
    return {"charged": True}


def gated(value):
    # Runs once `go` exists: the test starts a second engine while this one runs.
    print("gated-started", file=sys.stderr, flush=True)
    deadline = time.monotonic() + 60
    while not Path("go").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    _log("gated")
    return value
"""

LOGGED = """
name: logged
version: "1"
steps:
  - {id: first, type: python, function: "engine_steps:first"}
  - {id: ask, type: wait, signal: approve, depends_on: [first]}
  - id: second
    type: python
    function: "engine_steps:second"
    depends_on: [ask]
    input: {value: "{{ steps.ask.output }}"}
output: "{{ steps.second.output }}"
"""

GATED = """
name: gated
version: "1"
steps:
  - {id: first, type: python, function: "engine_steps:first"}
  - {id: ask, type: wait, signal: approve, depends_on: [first]}
  - {id: gated, type: python, function: "engine_steps:gated", depends_on: [ask], input: {value: 1}}
"""

FLAKY = """
name: flaky
version: "1"
steps:
  - {id: charge, type: python, function: "engine_steps:charge"}
output: "{{ steps.charge.output }}"
"""

OTHER = """
name: other
version: "1"
steps:
  - {id: other, type: python, function: "engine_steps:second", input: {value: 1}}
"""


@pytest.fixture
def flows(workdir: Workdir) -> Workdir:
    (workdir.path / "engine_steps.py").write_text(STEPS, encoding="utf-8")
    (workdir.path / "logged.yaml").write_text(LOGGED, encoding="utf-8")
    (workdir.path / "other.yaml").write_text(OTHER, encoding="utf-8")
    (workdir.path / "gated.yaml").write_text(GATED, encoding="utf-8")
    (workdir.path / "flaky.yaml").write_text(FLAKY, encoding="utf-8")
    return workdir


def executions(workdir: Workdir) -> list[str]:
    log = workdir.path / "executions.log"
    return log.read_text(encoding="utf-8").split() if log.exists() else []


def start(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tideflow.cli.main", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**{k: v for k, v in os.environ.items() if k != "TIDEFLOW_STORE"}, **(env or {})},
    )


def wait_for_line(proc: subprocess.Popen[str], text: str) -> None:
    """Read stderr until ``text`` appears (the process is then past that point)."""
    assert proc.stderr is not None
    for line in proc.stderr:
        if text in line:
            return
    raise AssertionError(f"the process exited ({proc.wait()}) before printing {text!r}")


def live_run(
    workdir: Workdir, store: str, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[str], str]:
    """A `tideflow run` that has run its first step and waits for `approve`; its run id."""
    proc = start(workdir.path, "run", "logged.yaml", "--json", "--store", store, env=env)
    wait_for_line(proc, "first-ran")
    listed = tideflow(workdir.path, "runs", "list", "--json", "--store", store)
    assert listed.returncode == 0, listed.stderr
    newest = stdout_json(listed)["runs"][0]
    return proc, newest["run_id"]


def finished(proc: subprocess.Popen[str]) -> tuple[int, dict[str, object], str]:
    out, err = proc.communicate(timeout=60)
    return proc.returncode, stdout_json(subprocess.CompletedProcess([], 0, out, err)), err


def _signal_reaches_a_live_run(workdir: Workdir, store: str) -> None:
    proc, run_id = live_run(workdir, store)
    try:
        sent = tideflow(
            workdir.path, "runs", "signal", run_id, "approve", "-p", '"yes"', "--store", store
        )
        assert sent.returncode == 0, sent.stderr
        assert f"pid {proc.pid}" in sent.stderr and "applies it now" in sent.stderr
        code, result, err = finished(proc)  # the live run finishes: no Ctrl-C, no resume
    finally:
        proc.kill()
    assert code == 0, err
    assert result["status"] == "succeeded" and result["output"] == {"got": "yes"}
    assert executions(workdir) == ["first", "second"]


def test_a_signal_from_another_process_reaches_a_live_run(flows: Workdir) -> None:
    _signal_reaches_a_live_run(flows, flows.store)


def test_a_signal_reaches_a_live_run_on_postgresql(flows: Workdir, pg_store: str) -> None:  # noqa: F811
    _signal_reaches_a_live_run(flows, pg_store)


def test_a_cancel_from_another_process_stops_a_live_run(flows: Workdir) -> None:
    proc, run_id = live_run(flows, flows.store)
    try:
        sent = tideflow(flows.path, "runs", "cancel", run_id, "--store", flows.store)
        assert sent.returncode == 0, sent.stderr
        assert "applies it now" in sent.stderr
        code, result, err = finished(proc)
    finally:
        proc.kill()
    assert code == 1, err
    assert result["status"] == "cancelled"
    assert executions(flows) == ["first"]


def status_of(workdir: Workdir, store: str, run_id: str) -> str:
    shown = tideflow(workdir.path, "runs", "show", run_id, "--json", "--store", store)
    assert shown.returncode == 0, shown.stderr
    return str(stdout_json(shown)["status"])


def test_a_retry_from_another_process_is_run_by_the_live_engine(flows: Workdir) -> None:
    failed = tideflow(flows.path, "run", "flaky.yaml", "--json", "--store", flows.store)
    assert failed.returncode == 1, failed.stderr
    failed_id = stdout_json(failed)["run_id"]
    proc, waiting_id = live_run(flows, flows.store)
    try:
        (flows.path / "payments-up").touch()
        sent = tideflow(flows.path, "runs", "retry", failed_id, "--store", flows.store)
        assert sent.returncode == 0, sent.stderr
        assert "applies it now" in sent.stderr
        status = ""
        for _ in range(100):  # each `runs show` is a process of its own: bounded, no sleeps
            status = status_of(flows, flows.store, failed_id)
            if status == "succeeded":
                break
        assert status == "succeeded"
        signalled = tideflow(
            flows.path, "runs", "signal", waiting_id, "approve", "--store", flows.store
        )
        assert signalled.returncode == 0, signalled.stderr
        code, _, err = finished(proc)
    finally:
        proc.kill()
    assert code == 0, err
    assert executions(flows).count("charge") == 2  # failed once, ran again once by the retry


def test_a_second_engine_on_the_store_is_refused_and_runs_nothing(flows: Workdir) -> None:
    proc, run_id = live_run(flows, flows.store)
    try:
        for args in (
            ("run", "other.yaml"),
            ("resume",),
            ("runs", "resume", run_id),
        ):
            refused = tideflow(flows.path, *args, "--store", flows.store)
            assert refused.returncode == 2, (args, refused.stderr)
            assert "another engine is running on this store" in refused.stderr
            assert f"pid {proc.pid}" in refused.stderr
            assert "Traceback" not in refused.stderr
        sent = tideflow(flows.path, "runs", "signal", run_id, "approve", "--store", flows.store)
        assert sent.returncode == 0, sent.stderr
        code, _, err = finished(proc)
    finally:
        proc.kill()
    assert code == 0, err
    assert executions(flows) == ["first", "second"]  # each step once, `other` never


def test_a_resume_while_another_runs_steps_is_refused_and_each_step_runs_once(
    flows: Workdir,
) -> None:
    sys.path.insert(0, str(flows.path))  # the steps, for the runtime in this process
    runs = waiting_runs(flows.store, 3, flows.path / "gated.yaml")
    for run_id in runs:
        sent = tideflow(flows.path, "runs", "signal", run_id, "approve", "--store", flows.store)
        assert sent.returncode == 0 and "recorded" in sent.stderr, sent.stderr
    assert executions(flows) == ["first"] * 3  # recorded: nothing ran `gated` yet

    first = start(flows.path, "resume", "--json", "--store", flows.store)
    try:
        wait_for_line(first, "gated-started")  # it runs steps now
        second = start(flows.path, "resume", "--json", "--store", flows.store)
        try:
            _, refused = second.communicate(timeout=60)
            (flows.path / "go").touch()
            out, err = first.communicate(timeout=60)
        finally:
            second.kill()
    finally:
        first.kill()
    assert second.returncode == 2, refused
    assert "another engine is running on this store" in refused
    assert "Traceback" not in refused
    assert first.returncode == 0, err
    assert sorted(executions(flows)) == ["first"] * 3 + ["gated"] * 3
    assert {
        r["status"] for r in stdout_json(subprocess.CompletedProcess([], 0, out, err))["runs"]
    } == {"succeeded"}


def test_the_lease_of_a_killed_engine_is_taken_over_by_the_next(flows: Workdir) -> None:
    long_lease = {"TIDEFLOW_ENGINE_LEASE_TTL": "600"}  # taken over because the pid is gone
    proc, run_id = live_run(flows, flows.store, env=long_lease)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)

    resumed = start(flows.path, "runs", "resume", run_id, "--json", "--store", flows.store)
    try:
        # To the new engine if it holds the lease already, else recorded for it: either way
        # the dead engine's lease (600 s to go) keeps neither from going ahead.
        sent = tideflow(
            flows.path, "runs", "signal", run_id, "approve", "-p", "2", "--store", flows.store
        )
        assert sent.returncode == 0, sent.stderr
        code, result, err = finished(resumed)
    finally:
        resumed.kill()
    assert code == 0, err
    assert "another engine" not in err
    assert result["output"] == {"got": 2}
    assert executions(flows) == ["first", "second"]
