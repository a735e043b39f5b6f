"""What only the PostgreSQL store has: its own schema, and driver errors translated
into messages that say what to check."""

from __future__ import annotations

import uuid
from urllib.parse import urlsplit

import asyncpg
import pytest

from tideflow.store import open_store
from tideflow.store.backends.postgres import PostgresStore, redacted
from tideflow.store.base import StoreError

from .conftest import compile_stored, drop_schema


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


def test_messages_never_show_the_password() -> None:
    assert redacted("postgresql://app:s3cret@db:5432/prod") == "postgresql://app:***@db:5432/prod"
    assert redacted("postgresql://app@db/prod") == "postgresql://app@db/prod"
