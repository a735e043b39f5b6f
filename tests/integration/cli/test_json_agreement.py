"""The API and the CLI write one JSON: times as ISO 8601 strings in UTC (the same text
for the same time), one name per field (a history's `events`), the same attempts; the
API's old forms stay for a release (docs/api.md): `Tideflow-Times: epoch` gives epoch
seconds, a history also as `entries`, a time query parameter in either form."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

from tideflow.api.changes import RunChanges
from tideflow.api.serving import address_of, http_api, listen
from tideflow.lifecycle import Stop
from tideflow.runtime.runtime import Runtime

from .conftest import Workdir, stdout_json, tideflow

SAGA = """
name: saga
version: "1"
on_failure: compensate
steps:
  - id: reserve
    type: python
    function: agree_steps:reserve
    compensate: {type: python, function: agree_steps:release}
  - {id: ship, type: python, function: "agree_steps:ship", depends_on: [reserve]}
"""
STEPS = """
def reserve():
    return {"hold": "H1"}

def release():
    return None

def ship():
    raise ValueError("refused")
"""
TIMES = ("created_at", "updated_at", "finished_at")


@contextlib.asynccontextmanager
async def served(rt: Runtime) -> AsyncIterator[httpx.AsyncClient]:
    sock = listen("127.0.0.1", 0)
    async with (
        http_api(rt.client, Stop(), sock, auth=False, changes=RunChanges()),
        httpx.AsyncClient(base_url=address_of(sock), timeout=20) as api,
    ):
        yield api


async def cli(cwd: Path, *args: str) -> Any:
    done = await asyncio.to_thread(tideflow, cwd, *args)
    assert done.returncode == 0, done.stderr
    return stdout_json(done)


async def test_the_api_and_the_cli_write_the_same_json(workdir: Workdir) -> None:
    (workdir.path / "agree_steps.py").write_text(STEPS, encoding="utf-8")
    (workdir.path / "saga.yaml").write_text(SAGA, encoding="utf-8")
    async with Runtime(store=workdir.store, workers=1) as rt, served(rt) as api:
        result = await rt.run(workdir.path / "saga.yaml")
        assert result.status == "compensated"
        run_id = result.run_id
        run = (await api.get(f"/runs/{run_id}")).json()
        history = (await api.get(f"/runs/{run_id}/history")).json()
        attempts = (await api.get(f"/runs/{run_id}/attempts")).json()["attempts"]
        state = (await api.get(f"/runs/{run_id}/state")).json()
        epoch = (await api.get(f"/runs/{run_id}", headers={"Tideflow-Times": "epoch"})).json()
        old_history = await api.get(f"/runs/{run_id}/history", headers={"Tideflow-Times": "epoch"})
        listed = {
            "iso": await api.get("/runs", params={"created_after": run["created_at"]}),
            "epoch": await api.get("/runs", params={"created_after": epoch["created_at"] - 1}),
            "bad": await api.get("/runs", params={"created_after": "yesterday"}),
            "inf": await api.get("/runs", params={"created_after": "inf"}),
        }
        shown = await cli(workdir.path, "runs", "show", run_id, "--json", "--store", workdir.store)
        cli_history = await cli(
            workdir.path, "runs", "history", run_id, "--json", "--store", workdir.store
        )
        why = (await api.get(f"/runs/{run_id}/why")).json()
        cli_why = await cli(workdir.path, "runs", "why", run_id, "--json", "--store", workdir.store)

    for name in TIMES:  # one encoding: the same text for the same time
        assert isinstance(run[name], str) and run[name].endswith("Z"), (name, run[name])
        assert run[name] == shown[name], name
        assert state[name] == run[name], name
    assert history["events"] == cli_history["events"]  # one name, the same rows
    assert history["events"][0]["time"].endswith("Z")
    assert all(t["time"].endswith("Z") for e in history["events"] for t in e["transitions"])
    assert attempts == shown["attempts"]
    for diagnosis in (why, cli_why):  # computed apart: the same form, not the same moment
        assert diagnosis["checked_at"].endswith("Z")
        moments = [r[k] for r in diagnosis["reasons"] for k in ("since", "at") if r[k]]
        assert all(m.endswith("Z") for m in moments), moments
    assert [a["outcome"] for a in attempts] == ["succeeded", "failed", "succeeded"]

    # the old forms, for a release
    assert history["entries"] == history["events"]
    assert all(isinstance(epoch[name], float) for name in ("created_at", "updated_at"))
    assert abs(epoch["created_at"] - time.time()) < 3600
    old = old_history.json()
    assert isinstance(old["entries"][0]["time"], float)
    assert isinstance(old["events"][0]["event"]["time"], float)
    assert [r["run_id"] for r in listed["iso"].json()["runs"]] == [run_id]
    assert [r["run_id"] for r in listed["epoch"].json()["runs"]] == [run_id]
    assert listed["bad"].status_code == 422 and listed["inf"].status_code == 422
