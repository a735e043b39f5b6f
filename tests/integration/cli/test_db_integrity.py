"""`tideflow db status` checks the store's data, not only its schema version: a SQLite
file damaged in the middle (it still opens) and a PostgreSQL schema missing a table
are reported with what is wrong and exit 2."""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit

import asyncpg  # type: ignore[import-untyped]
import pytest

from tideflow.runtime.runtime import Runtime
from tideflow.store.sqlfiles import migrations

from .conftest import Workdir, invoke, stdout_json, tideflow

FILLER = """
name: filler
version: "1"
steps: [{id: a, type: noop}]
"""


def _fill(store: str, runs: int) -> None:
    """Enough ended runs (each with a 2 KB input) for the history table to span many pages."""

    async def fill() -> None:
        async with Runtime(store=store) as rt:
            plan = await rt.register(FILLER)
            for n in range(runs):
                await rt.wait(await rt.start_run(plan, {"n": n, "pad": "x" * 2048}), 10)

    asyncio.run(fill())


def _damage_a_middle_page(path: str) -> int:
    """Overwrite one page in the middle of the file (not the schema page); its number."""
    with sqlite3.connect(path) as conn:
        page_size, pages = (
            conn.execute(f"PRAGMA {p}").fetchone()[0] for p in ("page_size", "page_count")
        )
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    page = pages // 2
    with open(path, "r+b") as file:
        file.seek((page - 1) * page_size + 8)
        file.write(b"\xa5" * (page_size - 16))
    return page


def test_status_reports_a_page_damaged_in_the_middle_of_the_file(workdir: Workdir) -> None:
    _fill(workdir.store, 120)
    assert invoke("db", "status", "--store", workdir.store).exit_code == 0
    _damage_a_middle_page(str(workdir.db))
    assert invoke("runs", "list", "--limit", "1", "--store", workdir.store).exit_code == 0

    done = tideflow(workdir.path, "db", "status", "--store", workdir.store)

    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    first, *details = done.stderr.strip().splitlines()
    assert first.startswith(f"error: {workdir.store} is damaged (")
    assert "restore it from a backup" in first
    assert details and all(line.startswith("  ") for line in details)
    assert "integrity check passed" not in done.stdout

    as_json = tideflow(workdir.path, "db", "status", "--json", "--store", workdir.store)
    assert as_json.returncode == 2
    report = stdout_json(as_json)
    assert report["up_to_date"] is True and report["problems"]
    assert [f"  {p}" for p in report["problems"]] == details


def test_status_of_a_sound_store_says_the_check_passed(workdir: Workdir) -> None:
    _fill(workdir.store, 2)

    done = invoke("db", "status", "--store", workdir.store)

    assert done.exit_code == 0
    assert "integrity check passed" in done.stdout
    assert stdout_json(invoke("db", "status", "--json", "--store", workdir.store))["problems"] == []


def test_status_reports_a_missing_table_and_unknown_migrations(workdir: Workdir) -> None:
    _fill(workdir.store, 1)
    with sqlite3.connect(workdir.db) as conn:
        conn.execute("DROP TABLE outbox")
        conn.execute("INSERT INTO schema_version (version, applied_at) VALUES (0, 0)")
    conn.close()

    done = invoke("db", "status", "--json", "--store", workdir.store)

    assert done.exit_code == 2
    problems = stdout_json(done)["problems"]
    assert "table 'outbox' is missing" in problems
    known = [m.version for m in migrations("sqlite")]
    assert f"schema_version records migrations {[0, *known]}, this tideflow has {known}" in problems


async def _admin(url: str, statement: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


@pytest.fixture
def pg_store(postgres_url: str) -> Iterator[str]:
    name = f"tideflow_integrity_{uuid.uuid4().hex[:12]}"
    asyncio.run(_admin(postgres_url, f'CREATE DATABASE "{name}"'))
    try:
        yield urlsplit(postgres_url)._replace(path=f"/{name}").geturl()
    finally:
        asyncio.run(_admin(postgres_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def test_status_on_postgresql_checks_the_tables(pg_store: str) -> None:
    assert invoke("db", "upgrade", "--store", pg_store).exit_code == 0
    sound = invoke("db", "status", "--json", "--store", pg_store)
    assert sound.exit_code == 0, sound.stderr
    assert stdout_json(sound)["problems"] == []

    asyncio.run(_admin(pg_store, "DROP TABLE outbox"))
    done = invoke("db", "status", "--json", "--store", pg_store)

    assert done.exit_code == 2
    assert stdout_json(done)["problems"] == ["table 'outbox' is missing"]


def test_status_on_postgresql_checks_the_commit_function(pg_store: str) -> None:
    assert invoke("db", "upgrade", "--store", pg_store).exit_code == 0
    asyncio.run(_admin(pg_store, "DROP FUNCTION tideflow_commit"))

    done = invoke("db", "status", "--json", "--store", pg_store)

    assert done.exit_code == 2
    [problem] = stdout_json(done)["problems"]
    assert problem.startswith("function 'tideflow_commit' is missing (commits fail without it)")
    assert "0013_commit_set_based.sql" in problem  # the newest migration that makes it
