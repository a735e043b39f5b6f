"""SQL kept in ``.sql`` files: versioned migrations and named queries, one set per dialect."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

_NAME = re.compile(r"^--\s*name:\s*([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)
_MIGRATION = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str


def _files(dialect: str) -> resources.abc.Traversable:
    return resources.files("tideflow.store.sql").joinpath(dialect)


@cache
def migrations(dialect: str) -> tuple[Migration, ...]:
    """Every migration of a dialect, in version order. SQLite and PostgreSQL share one
    version sequence: migration N exists for both."""
    found = []
    for entry in _files(dialect).iterdir():
        match = _MIGRATION.match(entry.name)
        if match:
            found.append(
                Migration(int(match.group(1)), entry.name, entry.read_text(encoding="utf-8"))
            )
    return tuple(sorted(found, key=lambda m: m.version))


def latest_version(dialect: str) -> int:
    return migrations(dialect)[-1].version


@cache
def queries(dialect: str) -> dict[str, str]:
    """Named queries of ``queries.sql``: blocks that start with ``-- name: <name>``."""
    text = _files(dialect).joinpath("queries.sql").read_text(encoding="utf-8")
    parts = _NAME.split(text)
    return {
        name: body.strip().rstrip(";").strip()
        for name, body in zip(parts[1::2], parts[2::2], strict=True)
    }


def statements(sql: str) -> list[str]:
    """Split a migration into statements (no semicolons inside our DDL literals)."""
    lines = [line for line in sql.splitlines() if not line.strip().startswith("--")]
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]
