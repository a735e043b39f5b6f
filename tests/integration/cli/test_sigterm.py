"""SIGTERM stops `tideflow run` and `tideflow resume` like Ctrl-C: a clean stop, exit
130, a line saying how to continue, and the run resumable afterwards. Ctrl-C (SIGINT)
does the same on either event loop (`tideflow.loop`: uvloop or asyncio's)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import Workdir, stdout_json, tideflow, waiting_runs

ANNOUNCED = """
name: announced
version: "1"
steps:
  - {id: hello, type: python, function: "sigterm_steps:announce"}
  - {id: ask, type: wait, signal: approve, depends_on: [hello]}
output: "{{ steps.ask.output }}"
"""

STEPS = """
import sys

def announce():
    print("step-started", file=sys.stderr, flush=True)
    return None
"""


# As a shell starts a command: SIGINT raises KeyboardInterrupt (whoever runs the suite
# may ignore SIGINT, and an ignored signal stays ignored across exec).
_WITH_CTRL_C = (
    "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "sys.argv[0] = 'tideflow'; runpy.run_module('tideflow.cli.main', run_name='__main__')"
)


def _start(cwd: Path, *args: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _WITH_CTRL_C, *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**{k: v for k, v in os.environ.items() if k != "TIDEFLOW_STORE"}, **env},
    )


def _wait_for_line(proc: subprocess.Popen[str], text: str) -> None:
    """Read stderr until ``text`` appears (the process is then past that point)."""
    assert proc.stderr is not None
    for line in proc.stderr:
        if text in line:
            return
    raise AssertionError(f"the process exited ({proc.wait()}) before printing {text!r}")


def _terminate(proc: subprocess.Popen[str]) -> tuple[int, str]:
    proc.send_signal(signal.SIGTERM)
    _, rest = proc.communicate(timeout=30)
    return proc.returncode, rest


def _finish(workdir: Workdir, run_id: str) -> None:
    """The stopped run goes on: signal it, resume it, it succeeds."""
    signalled = tideflow(
        workdir.path, "runs", "signal", run_id, "approve", "--store", workdir.store
    )
    assert signalled.returncode == 0, signalled.stderr
    done = tideflow(workdir.path, "runs", "resume", run_id, "--json", "--store", workdir.store)
    assert done.returncode == 0, done.stderr
    assert stdout_json(done)["status"] == "succeeded"


def test_sigterm_stops_run_cleanly_and_the_run_resumes(workdir: Workdir) -> None:
    (workdir.path / "sigterm_steps.py").write_text(STEPS, encoding="utf-8")
    (workdir.path / "announced.yaml").write_text(ANNOUNCED, encoding="utf-8")
    proc = _start(workdir.path, "run", "announced.yaml", "--json", "--store", workdir.store)
    _wait_for_line(proc, "step-started")

    code, stderr = _terminate(proc)

    assert code == 130
    assert "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1] == (
        f"interrupted: unfinished runs stay in {workdir.store}; "
        f"continue with `tideflow resume --store {workdir.store}`"
    )
    listed = tideflow(workdir.path, "runs", "list", "--json", "--store", workdir.store)
    (run,) = stdout_json(listed)["runs"]
    assert run["status"] not in ("cancelled", "failed", "succeeded")
    _finish(workdir, run["run_id"])


def test_sigterm_stops_resume_cleanly_and_the_run_resumes(workdir: Workdir) -> None:
    (run_id,) = waiting_runs(workdir.store, 1, workdir.path / "wait.yaml")
    proc = _start(workdir.path, "resume", "--store", workdir.store)
    _wait_for_line(proc, "resuming 1 run(s)")

    code, stderr = _terminate(proc)

    assert code == 130
    assert "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1] == (
        f"interrupted: unfinished runs stay in {workdir.store}; "
        f"continue with `tideflow resume --store {workdir.store}`"
    )
    _finish(workdir, run_id)


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_ctrl_c_stops_run_cleanly_on_either_loop(workdir: Workdir, loop: str) -> None:
    (workdir.path / "sigterm_steps.py").write_text(STEPS, encoding="utf-8")
    (workdir.path / "announced.yaml").write_text(ANNOUNCED, encoding="utf-8")
    proc = _start(
        workdir.path, "run", "announced.yaml", "--store", workdir.store, TIDEFLOW_LOOP=loop
    )
    _wait_for_line(proc, "step-started")

    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=30)

    assert proc.returncode == 130
    assert "Traceback" not in stderr
    assert (
        stderr.strip()
        .splitlines()[-1]
        .startswith(f"interrupted: unfinished runs stay in {workdir.store}; continue with")
    )
    listed = tideflow(workdir.path, "runs", "list", "--json", "--store", workdir.store)
    (run,) = stdout_json(listed)["runs"]
    _finish(workdir, run["run_id"])
