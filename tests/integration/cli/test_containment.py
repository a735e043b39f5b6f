"""`tideflow` as a real process facing hostile step code and values: it ends, it says why,
and the store stays usable."""

from __future__ import annotations

import json
import sqlite3
import textwrap

from tideflow.cli.common import json_bytes

from .conftest import Workdir, stdout_json, tideflow, waiting_runs

STEPS = """
import sys
import threading

def hang():
    threading.Event().wait()

def leave():
    sys.exit(3)

def text(n):
    return "x" * n
"""

FLOWS = {
    "hang.yaml": """
        name: hang
        version: "1"
        steps:
          - {id: h, type: python, function: "contained_steps:hang", timeout: 1s}
        """,
    "leave.yaml": """
        name: leave
        version: "1"
        steps:
          - {id: l, type: python, function: "contained_steps:leave"}
        """,
    "account.yaml": """
        name: account
        version: "1"
        steps:
          - {id: a, type: set, values: {n: "{{ int(inputs.account) }}"}}
        output: "{{ steps.a.output }}"
        """,
    "text.yaml": """
        name: text
        version: "1"
        steps:
          - {id: t, type: python, function: "contained_steps:text", input: {n: "{{ inputs.n }}"}}
        """,
}


def setup(workdir: Workdir) -> None:
    (workdir.path / "contained_steps.py").write_text(textwrap.dedent(STEPS), encoding="utf-8")
    for name, text in FLOWS.items():
        (workdir.path / name).write_text(textwrap.dedent(text), encoding="utf-8")


def test_a_hung_thread_step_times_out_and_the_process_still_exits(workdir: Workdir) -> None:
    setup(workdir)
    done = tideflow(workdir.path, "run", "hang.yaml", "--store", workdir.store, "--json")
    assert done.returncode == 1  # the helper fails the test if the process does not end
    result = stdout_json(done)
    assert result["steps"]["h"]["error"]["type"] == "TimeoutError"
    warning = next(line for line in done.stderr.splitlines() if "abandoned" in line)
    assert f"run {result['run_id']} step h" in warning
    assert "'contained_steps:hang'" in warning
    assert "tideflow-python_" in warning


def test_sys_exit_in_a_step_fails_the_step_not_the_engine(workdir: Workdir) -> None:
    setup(workdir)
    done = tideflow(workdir.path, "run", "leave.yaml", "--store", workdir.store, "--json")
    assert done.returncode == 1
    error = stdout_json(done)["steps"]["l"]["error"]
    assert (error["type"], error["message"]) == ("SystemExit", "3")
    again = tideflow(workdir.path, "run", "quick.yaml", "--store", workdir.store, "--json")
    assert again.returncode == 0, again.stderr
    resumed = tideflow(workdir.path, "resume", "--store", workdir.store)
    assert resumed.returncode == 0, resumed.stderr


def test_a_value_beyond_64_bits_fails_its_step_and_json_output_holds(workdir: Workdir) -> None:
    setup(workdir)
    for store in ("memory://", workdir.store):
        done = tideflow(
            workdir.path,
            "run",
            "account.yaml",
            "--input",
            '{"account": "1234567890123456789012"}',
            "--store",
            store,
            "--json",
        )
        assert done.returncode == 1, done.stderr
        error = stdout_json(done)["steps"]["a"]["error"]
        assert error["type"] == "OutputNotSerializable"
        assert "64-bit" in error["message"]
    again = tideflow(workdir.path, "run", "quick.yaml", "--store", workdir.store, "--json")
    assert again.returncode == 0, again.stderr


def test_limits_come_from_flags_and_environment(workdir: Workdir) -> None:
    setup(workdir)
    big = tideflow(
        workdir.path,
        *("run", "text.yaml", "--input", '{"n": 100}', "--store", "memory://", "--json"),
        "--max-step-output",
        "50",
    )
    assert big.returncode == 1
    error = stdout_json(big)["steps"]["t"]["error"]
    assert error["type"] == "OutputTooLarge"
    assert "over the limit of 50 bytes" in error["message"]
    refused = tideflow(
        workdir.path,
        *("run", "text.yaml", "--input", '{"n": 100}', "--store", workdir.store),
        env={"TIDEFLOW_MAX_RUN_INPUT": "5"},
    )
    assert refused.returncode == 2
    assert "the run input is 9 bytes as JSON, over the limit of 5 bytes" in refused.stderr
    bad = tideflow(workdir.path, "run", "text.yaml", "--max-step-output", "lots")
    assert bad.returncode == 2
    assert "'lots' is not a size" in bad.stderr


def test_json_output_never_fails_on_a_value() -> None:
    value = {"big": 10**30, 1: float("nan"), "inf": [float("inf")], "obj": object()}
    data = json.loads(json_bytes(value))
    assert data["big"] == 10**30
    assert data["1"] == "nan"
    assert data["inf"] == ["inf"]
    assert data["obj"].startswith("<object")


def test_resume_skips_a_run_whose_history_cannot_be_replayed(workdir: Workdir) -> None:
    damaged, other = waiting_runs(workdir.store, 2, workdir.path / "wait.yaml")
    event = {"kind": "task_completed", "event_id": "x", "run_id": damaged, "time": 1.0}
    row = json.dumps({**event, "step_key": ["ask"], "attempt": 1})
    with sqlite3.connect(workdir.db) as conn:
        conn.execute("UPDATE history SET data = ? WHERE run_id = ?", (row, damaged))
    done = tideflow(workdir.path, "resume", "--store", workdir.store, "--timeout", "1", "--json")
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert f"skipped run {damaged}: run '{damaged}': its history cannot be replayed" in done.stderr
    assert [r["run_id"] for r in stdout_json(done)["runs"]] == [other]
