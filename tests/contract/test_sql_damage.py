"""Damaged or foreign content under the SQL stores: a clear error naming what is
wrong, and the rest of the store still usable."""

from __future__ import annotations

from pathlib import Path

import pytest

from tideflow.errors import TideflowError
from tideflow.model.codec import StateFormatError
from tideflow.store.backends import postgres as postgres_backend
from tideflow.store.backends import sqlite as sqlite_backend
from tideflow.store.base import StoreError
from tideflow.store.sqlfiles import Migration, migrations

from .conftest import Backend
from .conftest import sqlite_backend as make_sqlite_backend
from .scenarios import (
    UNDO_SCHEMA_6,
    UNDO_SCHEMA_8,
    Driver,
    loaded_state,
    order_plan,
    order_script,
    same_state,
    short_plan,
)

MODULES = {"sqlite": sqlite_backend, "postgres": postgres_backend}


async def test_unknown_event_kind_names_the_run_and_spares_the_others(
    sql_backend: Backend,
) -> None:
    store = await sql_backend.open()
    plan = order_plan()
    driver = Driver(store, batch_size=2)
    bad = await driver.new_run(plan, "bad-run")
    good = await driver.new_run(plan, "good-run")
    await driver.play(order_script(bad)[:4], order_script(good)[:4])
    await sql_backend.raw(
        """UPDATE history SET data = '{"kind": "made_up", "event_id": "x", "time": 1}' """
        "WHERE run_id = 'bad-run' AND seq = 2"
    )
    with pytest.raises(StateFormatError, match="bad-run") as caught:
        await store.load_run("bad-run")
    assert "made_up" in str(caught.value)
    assert same_state(await loaded_state(store, plan, "good-run"), good.state)
    assert len(await store.history("bad-run")) == driver.seqs["bad-run"]


async def test_damaged_snapshot_names_the_run(sql_backend: Backend) -> None:
    store = await sql_backend.open()
    driver = Driver(store)
    await driver.new_run(short_plan(), "broken")
    await driver.new_run(short_plan(), "fine")
    await sql_backend.raw("UPDATE runs SET snapshot = '{\"format\": 1' WHERE run_id = 'broken'")
    with pytest.raises(StateFormatError, match="broken"):
        await store.load_run("broken")
    assert (await store.load_run("fine")).snapshot.run_id == "fine"


async def test_definition_that_no_longer_compiles(sql_backend: Backend) -> None:
    store = await sql_backend.open()
    plan, other = order_plan(), short_plan()
    await store.save_definition(plan)
    await store.save_definition(other)
    await sql_backend.raw(
        f"""UPDATE plans SET source = '{{"name": "x"}}' WHERE hash = '{plan.hash}'"""
    )
    fresh = await sql_backend.open()  # nothing cached
    with pytest.raises(TideflowError, match=r"definition order 1 .*no longer compiles"):
        await fresh.get_plan(plan.hash)
    with pytest.raises(TideflowError, match=r"definition order 1 .*no longer compiles"):
        await fresh.get_definition("order")
    assert (await fresh.get_plan(other.hash)).hash == other.hash
    assert (await fresh.get_definition("short")).hash == other.hash


async def test_newer_schema_is_refused(sql_backend: Backend) -> None:
    store = await sql_backend.open()
    await store.close()
    await sql_backend.raw("INSERT INTO schema_version (version, applied_at) VALUES (99, 0)")
    with pytest.raises(StoreError, match="newer") as caught:
        await sql_backend.open()
    assert "99" in str(caught.value)
    with pytest.raises(StoreError, match="newer"):
        await sql_backend.open(auto_upgrade=True)


async def test_older_schema_upgrades_only_when_allowed(
    sql_backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await sql_backend.open()
    driver = Driver(store)
    h = await driver.new_run(short_plan(), "kept")
    await driver.play([lambda: h.start()])
    await store.close()

    module = MODULES[sql_backend.name]
    known = migrations(sql_backend.name)
    extra = Migration(
        known[-1].version + 1, "9999_test.sql", "CREATE TABLE upgrade_probe (x INTEGER)"
    )
    monkeypatch.setattr(module, "migrations", lambda dialect: (*known, extra))
    monkeypatch.setattr(module, "latest_version", lambda dialect: extra.version)

    with pytest.raises(StoreError, match=r"tideflow db upgrade --store") as caught:
        await sql_backend.open(auto_upgrade=False)
    assert f"schema {known[-1].version}" in str(caught.value)
    upgraded = await sql_backend.open(auto_upgrade=True)
    assert await upgraded.schema_version() == extra.version
    assert await upgraded.upgrade() == []
    assert (await sql_backend.raw("SELECT count(*) FROM upgrade_probe"))[0][0] == 0
    assert (await upgraded.load_run("kept")).last_seq == 2  # run_started, task_started


AFTER_SCHEMA_3 = {
    "sqlite": [*UNDO_SCHEMA_8["sqlite"], *UNDO_SCHEMA_6, "DROP TABLE api_tokens"],
    "postgres": [
        *UNDO_SCHEMA_8["postgres"],
        *UNDO_SCHEMA_6,
        "DROP FUNCTION tideflow_commit",
        "DROP TABLE api_tokens",
    ],
}
"""What migrations 4 to 8 did, undone, per dialect (migration 4 on SQLite: nothing)."""


async def test_a_store_written_at_schema_3_upgrades_mid_run(sql_backend: Backend) -> None:
    """Migration 4 (PostgreSQL's one-statement commit) on a store an older tideflow left
    with a run half done: refused without auto-upgrade, then the run goes on."""
    store = await sql_backend.open()
    plan = order_plan()
    driver = Driver(store, batch_size=3)
    h = await driver.new_run(plan, "old")
    script = order_script(h)
    await driver.play(script[:4])
    await store.close()
    upgraded = await sql_backend.upgraded_from(3, AFTER_SCHEMA_3[sql_backend.name])
    driver.store = upgraded
    await driver.play(script[4:])
    assert same_state(await loaded_state(upgraded, plan, "old"), h.state)
    assert (await upgraded.get_run("old")).status == "succeeded"
    assert len(await upgraded.history("old")) == driver.seqs["old"]


async def test_a_fresh_database_is_created_even_without_auto_upgrade(sql_backend: Backend) -> None:
    store = await sql_backend.open(auto_upgrade=False)
    assert await store.schema_version() == migrations(sql_backend.name)[-1].version
    assert await store.list_definitions() == []


# -- SQLite files --------------------------------------------------------------------


@pytest.mark.parametrize(
    "content",
    [b"", b"garbage" * 1000, b"SQLite format 3\x00" + b"\xff" * 84],
    ids=["empty-page", "garbage", "bad-header"],
)
async def test_sqlite_garbage_file_is_refused_naming_it(tmp_path: Path, content: bytes) -> None:
    backend = make_sqlite_backend(tmp_path)
    path = tmp_path / "store.db"
    path.write_bytes(content or b"\x00" * 4096)
    with pytest.raises(StoreError, match=str(path)):
        await backend.open()


@pytest.mark.parametrize("keep", [0.1, 0.5, 0.95])
async def test_sqlite_truncated_file_is_refused_naming_it(tmp_path: Path, keep: float) -> None:
    backend = make_sqlite_backend(tmp_path)
    store = await backend.open()
    plan = order_plan()
    await store.save_definition(plan)
    driver = Driver(store, batch_size=8)
    runs = [await driver.new_run(plan, f"run-{i}") for i in range(20)]
    await driver.play(*(order_script(h) for h in runs))
    await backend.close_all()
    path = tmp_path / "store.db"
    data = path.read_bytes()
    assert len(data) > 16 * 4096
    path.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(StoreError, match=f"{path}.*damaged"):
        await backend.open()
