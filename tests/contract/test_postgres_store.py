"""What only the PostgreSQL store has: its own schema, and driver errors translated
into messages that say what to check."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from urllib.parse import urlsplit

import asyncpg
import pytest
from asyncpg.connection import Connection

from tideflow.store import open_store
from tideflow.store.backends.postgres import PostgresStore, redacted
from tideflow.store.base import AppliedEvent, StoreError, StoreUnavailable

from .conftest import compile_stored, drop_schema
from .scenarios import Driver, loaded_state, order_plan, order_script, same_state


def with_netloc(url: str, netloc: str | None = None, path: str | None = None) -> str:
    parts = urlsplit(url)
    return parts._replace(netloc=netloc or parts.netloc, path=path or parts.path).geturl()


async def schema_exists(url: str, schema: str) -> bool:
    conn = await asyncpg.connect(url)
    try:
        return bool(await conn.fetchval("SELECT 1 FROM pg_namespace WHERE nspname = $1", schema))
    finally:
        await conn.close()


async def test_schema_is_created_and_dropped_on_close_when_asked(postgres_url: str) -> None:
    schema = f"contract_{uuid.uuid4().hex[:16]}"
    store = PostgresStore(
        postgres_url, schema=schema, drop_schema_on_close=True, compile_plan=compile_stored
    )
    try:
        await store.open()
        assert await schema_exists(postgres_url, schema)
        assert await store.list_definitions() == []
        await store.close()
        assert not await schema_exists(postgres_url, schema)
    finally:
        await drop_schema(postgres_url, schema)


async def test_schema_is_kept_by_default(postgres_url: str) -> None:
    schema = f"contract_{uuid.uuid4().hex[:16]}"
    store = PostgresStore(postgres_url, schema=schema)
    try:
        await store.open()
        await store.close()
        assert await schema_exists(postgres_url, schema)
        assert await store.upgrade() == []  # opens the pool again by itself
        await store.close()
    finally:
        await drop_schema(postgres_url, schema)


def test_open_store_routes_postgres_urls(postgres_url: str) -> None:
    store = open_store(postgres_url, auto_upgrade=False)
    assert isinstance(store, PostgresStore)
    assert store.auto_upgrade is False


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"netloc": "root@127.0.0.1:1"}, r"cannot reach PostgreSQL at 127\.0\.0\.1:1 .*running"),
        ({"path": "/no_such_database"}, r"no database 'no_such_database'.*createdb"),
        ({"netloc": "nobody_here@{host}"}, r"refused user 'nobody_here'.*pg_hba\.conf"),
    ],
    ids=["refused", "unknown-database", "unknown-user"],
)
async def test_connection_problems_are_store_errors(
    postgres_url: str, change: dict[str, str], expected: str
) -> None:
    host = urlsplit(postgres_url).netloc.rpartition("@")[2]
    url = with_netloc(postgres_url, **{k: v.format(host=host) for k, v in change.items()})
    store = PostgresStore(url)
    with pytest.raises(StoreError, match=expected) as caught:
        await store.open()
    assert caught.value.__cause__ is None
    assert caught.value.__suppress_context__
    assert "asyncpg" not in str(caught.value)
    await store.close()


async def test_using_a_closed_store_says_so(postgres_url: str) -> None:
    with pytest.raises(StoreError, match="not open"):
        await PostgresStore(postgres_url).list_definitions()


def test_a_multi_host_url_names_every_host_in_its_order() -> None:
    store = PostgresStore(
        "postgresql://ann:secret@h1:5433,[::1],h3/orders?target_session_attrs=read-write"
    )
    assert store.server == "h1:5433,[::1]:5432,h3:5432"
    assert (store.database, store.user) == ("orders", "ann")
    assert store.where == "h1:5433,[::1]:5432,h3:5432/orders"


async def test_a_connection_the_driver_left_broken_is_never_handed_out_again(
    postgres_url: str,
) -> None:
    """asyncpg can leave a connection half-way through an exchange when its server goes
    away (a failover): its next use fails with "another operation is in progress". The
    store drops such a connection instead of giving it back to the pool, and says the
    store is unavailable (the engine tries again), not a driver error (a failed run)."""
    store = PostgresStore(postgres_url, max_size=1)
    await store.open()
    try:
        held: list[Connection] = []

        async def break_it() -> None:
            async with store._connection() as conn:
                held.append(conn._con)
                raise asyncpg.InternalClientError(
                    "cannot switch to state 12; another operation (2) is in progress"
                )

        with pytest.raises(StoreUnavailable, match="connection broke"):
            await break_it()
        raw = held[0]
        assert raw.is_closed()
        async with store._connection() as conn:
            assert conn._con is not raw
            assert await conn.fetchval("SELECT 1") == 1
    finally:
        await store.close()


def test_messages_never_show_the_password() -> None:
    assert redacted("postgresql://app:s3cret@db:5432/prod") == "postgresql://app:***@db:5432/prod"
    assert redacted("postgresql://app@db/prod") == "postgresql://app@db/prod"


async def test_a_commit_is_one_statement_whatever_the_batch(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Runs advanced, history, snapshots, outbox rows added and relayed ones deleted,
    timer, task and wait rows, ended runs: each commit is one round trip."""
    schema = f"contract_{uuid.uuid4().hex[:16]}"
    store = PostgresStore(postgres_url, schema=schema, compile_plan=compile_stored)
    sent: list[str] = []
    committing = False

    def counted(name: str) -> None:
        original = getattr(Connection, name)

        async def call(self: Connection, query: str, *args: object, **kwargs: object) -> object:
            if committing:
                sent.append(query)
            return await original(self, query, *args, **kwargs)

        monkeypatch.setattr(Connection, name, call)

    for name in ("execute", "executemany", "fetch", "fetchrow", "fetchval"):
        counted(name)
    commit = store.commit
    commits = 0

    async def counting_commit(batch: Sequence[AppliedEvent], relayed: Sequence[str] = ()) -> None:
        nonlocal committing, commits
        committing, commits = True, commits + 1
        try:
            await commit(batch, relayed)
        finally:
            committing = False

    monkeypatch.setattr(store, "commit", counting_commit)
    try:
        await store.open()
        plan = order_plan()
        driver = Driver(store, batch_size=3, snapshot_every=4)
        first, second = await driver.new_run(plan, "first"), await driver.new_run(plan, "second")
        scripts = order_script(first), order_script(second)
        await driver.play(*(script[:5] for script in scripts))
        relayed = driver.relayed = [item.id for item in await store.pending_outbox()]
        assert relayed
        await driver.play(*(script[5:] for script in scripts))
        assert commits >= 6
        assert len(sent) == commits
        for run_id, h in (("first", first), ("second", second)):
            assert same_state(await loaded_state(store, plan, run_id), h.state)
        assert not set(relayed) & {item.id for item in await store.pending_outbox()}
    finally:
        await store.close()
        await drop_schema(postgres_url, schema)
