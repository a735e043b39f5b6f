"""`tideflow server --embedded --http`: the whole of tideflow in one real process on a
SQLite file (engine, in-process bus, workers running a plain Python function) behind the
REST API, with a token made by the real `tideflow tokens create`; it keeps its runs over
a restart and stops on SIGTERM. Every wait is on a condition with a bound."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from harness import TIDEFLOW, Proc, eventually  # noqa: E402

pytestmark = [pytest.mark.timeout(120)]

STEPS = """
def double(n):
    return {"n": n * 2}
"""
FLOW = {
    "name": "embedded-double",
    "version": "1",
    "input": {"type": "object", "required": ["n"]},
    "steps": [
        {"id": "ask", "type": "wait", "signal": "go"},
        {
            "id": "double",
            "type": "python",
            "function": "embedded_steps:double",
            "input": {"n": "{{ inputs.n }}"},
            "depends_on": ["ask"],
        },
    ],
    "output": "{{ steps.double.output.n }}",
}


def spawn(tmp: Path, env: dict[str, str], *args: str) -> Proc:
    log = tmp / f"server-{len(list(tmp.glob('server-*.log')))}.log"
    with log.open("wb") as out:
        popen = subprocess.Popen(
            [TIDEFLOW, "server", *args], env=env, stdout=out, stderr=subprocess.STDOUT, cwd=tmp
        )
    proc = Proc("server", popen, log)
    proc.wait_log("HTTP API listening on")
    return proc


def base_of(proc: Proc) -> str:
    found = re.search(r"HTTP API listening on (http://127\.0\.0\.1:\d+)", proc.text())
    assert found, proc.text()
    return found.group(1)


@pytest.mark.slow
def test_one_process_serves_runs_their_steps_and_keeps_them_over_a_restart(
    tmp_path: Path,
) -> None:
    (tmp_path / "embedded_steps.py").write_text(STEPS, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEFLOW_")}
    env["PYTHONPATH"] = str(tmp_path)
    made = subprocess.run(
        [TIDEFLOW, "tokens", "create", "--name", "ops", "--role", "admin"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    headers = {"authorization": f"Bearer {made.stdout.strip()}"}

    server = spawn(
        tmp_path, env, "--embedded", "--workers", "2", "--http", "127.0.0.1:0",
        "--max-body", "64KiB",
    )  # fmt: skip
    assert "embedded" in server.text() and "2 workers" in server.text()
    assert (tmp_path / ".tideflow" / "tideflow.db").is_file()
    with httpx.Client(base_url=base_of(server), headers=headers, timeout=10) as api:
        too_big = api.post("/events", content=b"x" * (65 * 1024))
        assert too_big.status_code == 413, too_big.text
        assert api.post("/definitions", json=FLOW).status_code == 201
        started = api.post("/runs", json={"workflow": "embedded-double", "input": {"n": 21}})
        assert started.status_code == 201, started.text
        run_id = started.json()["run_id"]

        def step(key: str) -> Any:
            return api.get(f"/runs/{run_id}").json()["steps"].get(key, {}).get("status")

        eventually(lambda: step("ask") == "waiting", "the run waits for go")
    assert server.term() == 0

    again = spawn(tmp_path, env, "--embedded", "--http", "127.0.0.1:0")
    with httpx.Client(base_url=base_of(again), headers=headers, timeout=10) as api:
        sent = api.post(f"/runs/{run_id}/signals", json={"name": "go"})
        assert sent.status_code == 202, sent.text

        def finished() -> Any:
            run = api.get(f"/runs/{run_id}").json()
            return run if run["status"] == "succeeded" else None

        assert eventually(finished, "the run succeeds")["output"] == 42
    assert again.term() == 0


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--embedded", "--bus", "redis://127.0.0.1:6379/0"], "--embedded uses the in-process bus"),
        (["--bus", "redis://127.0.0.1:6379/0", "--workers", "2"], "a cluster's server runs no steps"),
        (["--embedded", "--store", "memory://"], "must outlive it"),
        ([], "--embedded for one process"),
        (["--embedded", "--http", "127.0.0.1:0", "--max-body", "lots"], "--max-body: 'lots' is not a size"),
        (["--embedded", "--max-body", "1MiB"], "--max-body is about the HTTP API"),
    ],
)  # fmt: skip
def test_embedded_and_cluster_options_that_do_not_go_together_exit_2(
    tmp_path: Path, args: list[str], says: str
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEFLOW_")}
    done = subprocess.run(
        [TIDEFLOW, "server", *args],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert says in done.stderr
