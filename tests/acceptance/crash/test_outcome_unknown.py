"""`idempotent: false`: a step whose attempt was started when its process was SIGKILLed is
not run again blindly on resume — it fails with StepOutcomeUnknown — while an attempt that
was only dispatched when the process died runs on resume, once (real `tideflow` processes).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

STEPS = """
import json
import os
import sys
import time


def charge(order, block):
    fd = os.open(os.environ["CHARGE_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, (json.dumps({"order": order, "pid": os.getpid()}) + "\\n").encode())
    os.fsync(fd)
    os.close(fd)
    if block:
        print("charging", flush=True)  # the test kills the process now
        time.sleep(60)
    return {"charged": order}
"""

FLOW = """
name: pay
version: "1"
steps:
  - id: charge
    type: python
    function: "pay_steps:charge"
    input: {order: "{{ inputs.order }}", block: "{{ inputs.block }}"}
    idempotent: false
    retry: {max_attempts: 3, backoff: 10ms}
output: "{{ steps.charge.output }}"
"""

pytestmark = pytest.mark.slow  # process kills

TIMEOUT = 60.0


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "pay_steps.py").write_text(STEPS, encoding="utf-8")
    (tmp_path / "pay.yaml").write_text(FLOW, encoding="utf-8")
    return tmp_path


async def tideflow(
    cwd: Path, *args: str, env: dict[str, str] | None = None
) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tideflow.cli.main",
        *args,
        cwd=cwd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "CHARGE_LOG": str(cwd / "charges.jsonl"), **(env or {})},
    )


async def finished(proc: asyncio.subprocess.Process) -> tuple[int, str, str]:
    out, err = await asyncio.wait_for(proc.communicate(), TIMEOUT)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def charges(workdir: Path) -> list[dict[str, Any]]:
    path = workdir / "charges.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def resume(workdir: Path, store: str) -> dict[str, Any]:
    code, out, err = await finished(await tideflow(workdir, "resume", "--json", "--store", store))
    (run,) = json.loads(out)["runs"]
    assert code == (0 if run["status"] == "succeeded" else 1), err
    return dict(run)


async def test_a_started_non_idempotent_step_killed_mid_step_fails_with_outcome_unknown(
    workdir: Path,
) -> None:
    store = f"sqlite:///{workdir / 'runs.db'}"
    run = await tideflow(
        workdir, "run", "pay.yaml", "-i", '{"order": "A1", "block": true}', "--store", store
    )
    assert run.stderr is not None
    # what a step prints goes to the command's stderr (its stdout is the result's alone),
    # among the log lines: inside the function, its start is committed
    async with asyncio.timeout(TIMEOUT):
        while (line := await run.stderr.readline()).strip() != b"charging":
            assert line, "the command ended before the step printed"
    run.kill()
    await run.wait()

    result = await resume(workdir, store)
    assert result["status"] == "failed"
    assert result["error"]["type"] == "StepOutcomeUnknown"
    assert result["steps"]["charge"]["attempts"] == 1  # retries do not repeat it blindly
    assert [c["order"] for c in charges(workdir)] == ["A1"]  # ran exactly once

    code, out, err = await finished(
        await tideflow(workdir, "runs", "history", result["run_id"], "--json", "--store", store)
    )
    assert code == 0, err
    kinds = [e["kind"] for e in json.loads(out)["events"]]
    assert kinds == ["run_started", "task_started", "task_lost"]


async def test_a_non_idempotent_step_only_dispatched_when_killed_runs_once_on_resume(
    workdir: Path,
) -> None:
    store = f"sqlite:///{workdir / 'runs.db'}"
    # the first batch (the run's start) dispatches `charge`; the process dies right after
    # handing the task to its workers, before any of them could start it
    code, _, _ = await finished(
        await tideflow(
            workdir,
            "run",
            "pay.yaml",
            "-i",
            '{"order": "B2", "block": false}',
            "--store",
            store,
            env={"TIDEFLOW_FAULT": "after_relay:1"},
        )
    )
    assert code == -9
    assert charges(workdir) == []

    result = await resume(workdir, store)
    assert (result["status"], result["output"]) == ("succeeded", {"charged": "B2"})
    assert [c["order"] for c in charges(workdir)] == ["B2"]
