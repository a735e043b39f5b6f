"""The same commands against the real PostgreSQL server, each test on a database of its own."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit

import asyncpg  # type: ignore[import-untyped]
import pytest

from .conftest import Workdir, invoke, stdout_json, tideflow, waiting_runs


async def _admin(url: str, statement: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


@pytest.fixture
def pg_store(postgres_url: str) -> Iterator[str]:
    name = f"tideflow_cli_{uuid.uuid4().hex[:12]}"
    asyncio.run(_admin(postgres_url, f'CREATE DATABASE "{name}"'))
    try:
        yield urlsplit(postgres_url)._replace(path=f"/{name}").geturl()
    finally:
        asyncio.run(_admin(postgres_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def test_upgrade_run_signal_resume_and_prune_on_postgresql(workdir: Workdir, pg_store: str) -> None:
    upgraded = invoke("db", "upgrade", "--store", pg_store)
    assert upgraded.exit_code == 0, upgraded.stderr
    assert "applied migration(s) 1" in upgraded.stdout
    assert stdout_json(invoke("db", "status", "--json", "--store", pg_store))["up_to_date"] is True

    (run_id,) = waiting_runs(pg_store, 1, workdir.path / "wait.yaml")
    assert (
        invoke("runs", "signal", run_id, "approve", "-p", "7", "--store", pg_store).exit_code == 0
    )
    resumed = tideflow(workdir.path, "resume", "--json", "--store", pg_store)
    assert resumed.returncode == 0, resumed.stderr
    assert [(r["run_id"], r["output"]) for r in stdout_json(resumed)["runs"]] == [
        (run_id, {"echo": 7})
    ]

    # resume exits only once the run's end is committed
    shown = stdout_json(invoke("runs", "show", run_id, "--json", "--store", pg_store))
    assert shown["status"] == "succeeded" and shown["finished_at"] is not None
    history = stdout_json(invoke("runs", "history", run_id, "--json", "--store", pg_store))
    assert [e["kind"] for e in history["events"]][:2] == ["run_started", "signal_received"]

    pruned = invoke(
        "db", "prune", "--older-than", "0s", "--no-archive", "--json", "--store", pg_store
    )
    assert stdout_json(pruned)["pruned"] == 1
    assert stdout_json(invoke("runs", "list", "--json", "--store", pg_store))["runs"] == []


def test_unreachable_postgresql_is_one_line_without_the_password(workdir: Workdir) -> None:
    done = invoke("runs", "list", "--store", "postgresql://kim:s3cret@127.0.0.1:1/tideflow")
    assert done.exit_code == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: cannot open store postgresql://kim:***@127.0.0.1:1/tideflow")
    assert "cannot reach PostgreSQL" in line
    assert "s3cret" not in done.stderr
