"""Store backends for the contract suite: one fresh, empty store per test.

``backend`` is parametrised over every Store implementation (memory, sqlite on a
temporary file, postgres in a schema of its own, dropped afterwards);
``sql_backend`` over the SQL ones only, with ``raw`` to reach under the store
and damage what it wrote.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from tideflow.dsl import compile_definition
from tideflow.model.plan import Plan
from tideflow.store.backends.memory import MemoryStore
from tideflow.store.backends.postgres import PostgresStore, quote_ident
from tideflow.store.backends.sqlite import SqliteStore
from tideflow.store.base import Store, StoreError
from tideflow.store.sqlfiles import migrations


def compile_stored(source: Any) -> Plan:
    return compile_definition(source)


UNDO_SCHEMA_11 = ["DROP INDEX runs_pending", "ALTER TABLE runs DROP COLUMN priority"]
"""What migration 11 (the admission queue) did, undone: every older schema lacks it."""


@dataclass
class Backend:
    name: str
    make: Callable[..., Store]
    """A new, not yet opened store on this backend's database (keyword options pass on)."""
    raw: Callable[[str], Any] | None = None
    """SQL backends: run one literal statement on the database, return the rows."""
    opened: list[Store] = field(default_factory=list)

    async def open(self, **options: Any) -> Store:
        store = self.make(**options)
        await store.open()
        self.opened.append(store)
        return store

    async def upgraded_from(self, version: int, undo: Sequence[str]) -> Store:
        """Make the store as a tideflow at schema ``version`` left it (``undo``: what the
        later migrations did, undone), check that it is refused without auto-upgrade,
        and open it upgraded to the newest schema."""
        assert self.raw is not None, "a SQL backend"
        for statement in [*UNDO_SCHEMA_11, *undo] if version < 11 else undo:
            await self.raw(statement)
        await self.raw(f"DELETE FROM schema_version WHERE version > {version}")
        with pytest.raises(StoreError, match=rf"is at schema {version}, .*tideflow db upgrade"):
            await self.open(auto_upgrade=False)
        upgraded = await self.open()
        assert await upgraded.schema_version() == migrations(self.name)[-1].version
        return upgraded

    async def close_all(self) -> None:
        for store in self.opened:
            await store.close()
        self.opened.clear()


def sqlite_backend(tmp_path: Path) -> Backend:
    path = tmp_path / "store.db"

    def make(**options: Any) -> Store:
        return SqliteStore(f"sqlite:///{path}", compile_plan=compile_stored, **options)

    async def raw(sql: str) -> list[Any]:
        conn = sqlite3.connect(path)
        try:
            rows = conn.execute(sql).fetchall()
            conn.commit()
            return rows
        finally:
            conn.close()

    return Backend("sqlite", make, raw)


def postgres_backend(url: str, schema: str) -> Backend:
    def make(**options: Any) -> Store:
        options.setdefault("max_size", 4)
        return PostgresStore(url, schema=schema, compile_plan=compile_stored, **options)

    async def raw(sql: str) -> list[Any]:
        conn = await asyncpg.connect(url, server_settings={"search_path": quote_ident(schema)})
        try:
            return list(await conn.fetch(sql))
        finally:
            await conn.close()

    return Backend("postgres", make, raw)


async def drop_schema(url: str, schema: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(f"DROP SCHEMA IF EXISTS {quote_ident(schema)} CASCADE")
    finally:
        await conn.close()


async def _backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    name = request.param
    if name == "memory":
        backend = Backend("memory", lambda **options: MemoryStore())
    elif name == "sqlite":
        backend = sqlite_backend(tmp_path)
    else:
        url = request.getfixturevalue("postgres_url")
        schema = f"contract_{uuid.uuid4().hex[:16]}"
        backend = postgres_backend(url, schema)
    try:
        yield backend
    finally:
        await backend.close_all()
        if name == "postgres":
            await drop_schema(url, schema)


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    async for value in _backend(request, tmp_path):
        yield value


@pytest.fixture(params=["sqlite", "postgres"])
async def sql_backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    async for value in _backend(request, tmp_path):
        yield value


@pytest.fixture
async def store(backend: Backend) -> Store:
    return await backend.open()
