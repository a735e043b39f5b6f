"""`tideflow db status`'s integrity check: is the store's data sound, not just its
schema version?

SQLite: ``PRAGMA integrity_check`` over the whole file (a damaged page in the middle
of a table is found even though the file still opens), then the checks shared with
PostgreSQL: every table the migrations create exists, and the migrations recorded
in ``schema_version`` are exactly the ones this tideflow has.
"""

from __future__ import annotations

import re
import sqlite3
import sys
from typing import Any
from urllib.parse import quote

from tideflow.store import Store
from tideflow.store.sqlfiles import migrations, statements

MAX_PROBLEMS = 20
"""integrity_check stops after this many problems: enough to say what is damaged."""

_TABLE_DDL = re.compile(
    r"CREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?(?P<created>[a-z_][a-z0-9_]*)"
    r"|DROP\s+TABLE\s+(?:IF\s+EXISTS\s+)?(?P<dropped>[a-z_][a-z0-9_]*)"
    r"|ALTER\s+TABLE\s+(?P<renamed>[a-z_][a-z0-9_]*)\s+RENAME\s+TO\s+(?P<to>[a-z_][a-z0-9_]*)",
    re.I,
)
"""What a migration does to its tables, in the order it does it (a table rebuilt is created
under another name, copied, dropped, and the new one renamed)."""
_CREATE_FUNCTION = re.compile(r"CREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION\s+([a-z_][a-z0-9_]*)", re.I)
_SQLITE_TABLES = "SELECT name FROM sqlite_master WHERE type = 'table'"
_POSTGRES_TABLES = (
    "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
)
_POSTGRES_FUNCTIONS = (
    "SELECT routine_name FROM information_schema.routines WHERE routine_schema = current_schema()"
)
_VERSIONS = "SELECT version FROM schema_version ORDER BY version"


def expected_tables(dialect: str) -> frozenset[str]:
    """The tables the dialect's migrations leave behind (plus ``schema_version``)."""
    tables = {"schema_version"}
    for migration in migrations(dialect):
        for statement in statements(migration.sql):
            for ddl in _TABLE_DDL.finditer(statement):
                if ddl["created"]:
                    tables.add(ddl["created"].lower())
                elif ddl["dropped"]:
                    tables.discard(ddl["dropped"].lower())
                else:
                    tables.discard(ddl["renamed"].lower())
                    tables.add(ddl["to"].lower())
    return frozenset(tables)


def expected_functions(dialect: str) -> dict[str, str]:
    """The functions the dialect's migrations create (PostgreSQL's ``tideflow_commit``),
    with the migration that creates each."""
    return {
        name.lower(): migration.name
        for migration in migrations(dialect)
        for name in _CREATE_FUNCTION.findall(migration.sql)
    }


def schema_problems(
    dialect: str, tables: set[str], versions: list[int], functions: set[str] | None = None
) -> list[str]:
    """What is wrong with the tables, functions and recorded migrations of an open store
    (``functions``: None where the dialect has none)."""
    problems = [f"table {name!r} is missing" for name in sorted(expected_tables(dialect) - tables)]
    if functions is not None:
        expected = expected_functions(dialect)
        problems += [
            f"function {name!r} is missing (commits fail without it): restore the store "
            f"from a backup, or create the function again from migration {expected[name]}"
            for name in sorted(set(expected) - functions)
        ]
    known = [m.version for m in migrations(dialect)]
    if versions != known:
        problems.append(f"schema_version records migrations {versions}, this tideflow has {known}")
    return problems


async def store_problems(store: Store, path: str | None) -> list[str]:
    """The problems found in an open store (empty when it is sound); ``path`` is the
    SQLite file of a SQLite store."""
    if path is not None:
        import asyncio

        return await asyncio.to_thread(_sqlite_problems, path)
    postgres = sys.modules.get("tideflow.store.backends.postgres")
    if postgres is not None and isinstance(store, postgres.PostgresStore):
        return await _postgres_problems(store.pool)
    return []  # memory:// keeps nothing that could be damaged


def _sqlite_problems(path: str) -> list[str]:
    conn = sqlite3.connect(f"file:{quote(path)}?mode=ro", uri=True)
    try:
        rows = conn.execute(f"PRAGMA integrity_check({MAX_PROBLEMS})").fetchall()
        damage = [
            line
            for row in rows
            for line in str(row[0]).splitlines()
            if line != "ok" and not line.startswith("*** in database")
        ]
        if damage:
            return damage
        tables = {str(row[0]).lower() for row in conn.execute(_SQLITE_TABLES)}
        versions = [int(row[0]) for row in conn.execute(_VERSIONS)]
        return schema_problems("sqlite", tables, versions)
    except sqlite3.DatabaseError as exc:
        return [str(exc)]
    finally:
        conn.close()


async def _postgres_problems(pool: Any) -> list[str]:
    async with pool.acquire() as conn:
        tables = {str(row[0]).lower() for row in await conn.fetch(_POSTGRES_TABLES)}
        if "schema_version" not in tables:
            return schema_problems("postgres", tables, [])
        versions = [int(row[0]) for row in await conn.fetch(_VERSIONS)]
        functions = {str(row[0]).lower() for row in await conn.fetch(_POSTGRES_FUNCTIONS)}
    return schema_problems("postgres", tables, versions, functions)


__all__ = ["expected_functions", "expected_tables", "schema_problems", "store_problems"]
