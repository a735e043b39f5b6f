"""What a step writes (stdout, stderr, `logging` records) is captured per attempt, masked,
bounded, stored with the attempt's outcome, and shown by `tideflow runs logs`, the API
(`GET /runs/{id}/logs`, which the UI's step panel reads), never on `tideflow run`'s
stdout; on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import asyncpg  # type: ignore[import-untyped]
import pytest

from tideflow.runtime.runtime import Runtime

from .conftest import Workdir, stdout_json, tideflow
from .test_json_agreement import served

SECRET = "tok-5ecret-value-91"
STEPS = """
import logging
import sys

def chatty(token):
    print("hello from stdout")
    print("the token is", token)
    sys.stderr.write("a warning on stderr\\n")
    logging.getLogger("chatty").warning("logged %s", "record")
    return {"ok": True}

async def chatty_async():
    print("async stdout line")
    logging.getLogger("chatty.async").error("async record")
    return 1

def flood():
    for n in range(2000):
        print(f"line {n:05d} " + "x" * 90)
    print("THE END")
    return 2

def quiet():
    return 3
"""
FLOW = """
name: chatter
version: "1"
steps:
  - id: threaded
    type: python
    function: logs_steps:chatty
    input: {token: "{{ secrets.STEP_TOKEN }}"}
  - id: isolated
    type: python
    function: logs_steps:chatty
    isolation: process
    input: {token: "{{ secrets.STEP_TOKEN }}"}
  - {id: on_loop, type: python, function: "logs_steps:chatty_async"}
  - id: shell
    type: shell
    command: [sh, -c, "echo shell out; echo shell err >&2"]
  - {id: flood, type: python, function: "logs_steps:flood"}
  - {id: quiet, type: python, function: "logs_steps:quiet"}
output: "{{ steps.threaded.output }}"
"""


async def _admin(url: str, statement: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, workdir: Workdir) -> Iterator[str]:
    if request.param == "sqlite":
        yield workdir.store
        return
    postgres_url: str = request.getfixturevalue("postgres_url")
    name = f"tideflow_logs_{uuid.uuid4().hex[:12]}"
    asyncio.run(_admin(postgres_url, f'CREATE DATABASE "{name}"'))
    try:
        yield urlsplit(postgres_url)._replace(path=f"/{name}").geturl()
    finally:
        asyncio.run(_admin(postgres_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def _run(workdir: Workdir, store: str) -> str:
    (workdir.path / "logs_steps.py").write_text(STEPS, encoding="utf-8")
    (workdir.path / "chatter.yaml").write_text(FLOW, encoding="utf-8")
    done = tideflow(
        workdir.path,
        *("run", "chatter.yaml", "--json", "--store", store),
        env={"TIDEFLOW_SECRET_STEP_TOKEN": SECRET},
    )
    assert done.returncode == 0, done.stderr
    # stdout is the result alone, as JSON: nothing a step wrote
    result = json.loads(done.stdout)
    assert result["status"] == "succeeded" and result["output"] == {"ok": True}
    assert "hello from stdout" not in done.stdout
    run_id: str = result["run_id"]
    return run_id


def _streams(answer: dict[str, Any], step: str) -> dict[str, Any]:
    (attempt,) = [a for a in answer["attempts"] if a["step_key"] == step]
    streams: dict[str, Any] = attempt["streams"]
    return streams


def _check(answer: dict[str, Any]) -> None:
    for step in ("threaded", "isolated"):
        streams = _streams(answer, step)
        assert streams["stdout"] == {
            "text": "hello from stdout\nthe token is ***\n",
            "truncated": 0,
        }, step
        assert streams["stderr"]["text"] == "a warning on stderr\n", step
        assert streams["log"]["text"] == "WARNING chatty: logged record\n", step
    assert _streams(answer, "on_loop") == {
        "stdout": {"text": "async stdout line\n", "truncated": 0},
        "log": {"text": "ERROR chatty.async: async record\n", "truncated": 0},
    }
    shell = _streams(answer, "shell")
    assert shell["stdout"]["text"] == "shell out\n" and shell["stderr"]["text"] == "shell err\n"
    assert _streams(answer, "quiet") == {}  # wrote nothing, stored nothing
    flood = _streams(answer, "flood")["stdout"]
    assert flood["truncated"] > 0
    assert len(flood["text"].encode()) <= 64 * 1024
    assert flood["text"].endswith("THE END\n")
    written = "".join(f"line {n:05d} " + "x" * 90 + "\n" for n in range(2000)) + "THE END\n"
    assert flood["truncated"] + len(flood["text"].encode()) == len(written.encode())
    assert written.endswith(flood["text"])
    assert SECRET not in json.dumps(answer)


def test_runs_logs_shows_what_each_step_wrote(workdir: Workdir, store_url: str) -> None:
    run_id = _run(workdir, store_url)

    as_json = tideflow(workdir.path, "runs", "logs", run_id, "--json", "--store", store_url)
    assert as_json.returncode == 0, as_json.stderr
    answer = stdout_json(as_json)
    assert answer["run_id"] == run_id and answer["step"] is None
    _check(answer)

    one = tideflow(workdir.path, "runs", "logs", run_id, "threaded", "--store", store_url)
    assert one.returncode == 0, one.stderr
    assert one.stdout.splitlines() == [
        one.stdout.splitlines()[0],
        "-- stdout",
        "hello from stdout",
        "the token is ***",
        "-- stderr",
        "a warning on stderr",
        "-- log",
        "WARNING chatty: logged record",
    ]
    assert one.stdout.startswith("== threaded attempt 1: succeeded at ")
    flood = tideflow(workdir.path, "runs", "logs", run_id, "flood", "--store", store_url)
    assert "-- stdout (truncated: " in flood.stdout and flood.stdout.endswith("THE END\n")

    unknown = tideflow(workdir.path, "runs", "logs", run_id, "nope", "--store", store_url)
    assert unknown.returncode == 2
    assert "no ended attempt of step 'nope'" in unknown.stderr and "threaded" in unknown.stderr


async def test_the_api_answers_the_logs_of_a_run(workdir: Workdir, store_url: str) -> None:
    run_id = await asyncio.to_thread(_run, workdir, store_url)
    async with Runtime(store=store_url, workers=0) as rt, served(rt) as api:
        everything = await api.get(f"/runs/{run_id}/logs")
        assert everything.status_code == 200, everything.text
        _check(everything.json())
        one = (await api.get(f"/runs/{run_id}/logs", params={"step": "shell"})).json()
        assert [a["step_key"] for a in one["attempts"]] == ["shell"]
        assert one["attempts"][0]["outcome"] == "succeeded"
        assert one["attempts"][0]["ended_at"].endswith("Z")
        missing = await api.get(f"/runs/{run_id}/logs", params={"step": "nope"})
        assert missing.status_code == 404
        assert "no step 'nope'" in missing.json()["detail"]
