"""`tideflow db status` counts only the effects really waiting to be relayed: next to an
engine that runs and is quiet, on SQLite and on PostgreSQL, none once its runs ended
(the row of a run's end, relayed, used to stay until the engine's next commit: "1
effect waits to be relayed" for as long as the store stayed quiet)."""

from __future__ import annotations

import asyncio
import time

import pytest

from tideflow.cli.db import _status
from tideflow.runtime.runtime import Runtime

from .conftest import Workdir, stdout_json, tideflow
from .test_postgres import pg_store  # noqa: F401  (a fixture: a database of its own)

DEADLINE = 20.0


async def pending_effects(url: str) -> int:
    """What `db status` counts, read as it reads it (its own connection to the store)."""
    _, problems, pending, _ = await _status(url)
    assert problems == []
    return pending


@pytest.fixture(params=["sqlite", "postgresql"])
def url(workdir: Workdir, request: pytest.FixtureRequest) -> str:
    return workdir.store if request.param == "sqlite" else str(request.getfixturevalue("pg_store"))


async def test_a_quiet_engine_leaves_no_effect_counted_as_waiting(
    workdir: Workdir, url: str
) -> None:
    async with Runtime(store=url, workers=1) as rt:  # the store's engine, up all along
        result = await rt.run(workdir.path / "quick.yaml", {"n": 1})
        assert result.status == "succeeded"
        deadline = time.monotonic() + DEADLINE
        for _ in iter(int, 1):  # polled until the deadline (a reader in another process)
            pending = await pending_effects(url)
            if not pending or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        assert pending == 0, "the run's relayed end is still counted as waiting"
        shown = await asyncio.to_thread(
            tideflow, workdir.path, "db", "status", "--json", "--store", url
        )
        assert shown.returncode == 0, shown.stderr
        assert stdout_json(shown)["pending_effects"] == 0
        text = await asyncio.to_thread(tideflow, workdir.path, "db", "status", "--store", url)
        assert "wait to be relayed" not in text.stdout
