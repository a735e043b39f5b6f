"""The store port and its backends, chosen by URL.

``memory://`` (nothing survives the process), ``sqlite:///path/to/file.db``
(``sqlite:///:memory:`` for a private in-memory database), and
``postgresql://user@host:port/db`` (``?schema=NAME`` keeps the tables in a schema of
their own, created when missing: several clusters, or test runs, in one database).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tideflow.store.base import ConcurrencyConflict, Store, StoreError

DEFAULT_URL = "sqlite:///.tideflow/tideflow.db"
"""Where `tideflow run` keeps state unless told otherwise: under the working directory."""

__all__ = ["DEFAULT_URL", "ConcurrencyConflict", "Store", "StoreError", "open_store"]


def open_store(url: str, *, auto_upgrade: bool = True) -> Store:
    """A store for ``url`` (not yet opened: ``await store.open()``)."""
    from tideflow.store.base import StoreError

    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme == "memory":
        from tideflow.store.backends.memory import MemoryStore

        return MemoryStore()
    if scheme == "sqlite":
        from tideflow.store.backends.sqlite import SqliteStore

        return SqliteStore(url, auto_upgrade=auto_upgrade)
    if scheme in ("postgresql", "postgres"):
        try:
            from tideflow.store.backends.postgres import PostgresStore
        except ImportError as exc:  # pragma: no cover - depends on the installation
            raise StoreError(
                f"the PostgreSQL store needs asyncpg ({exc}); install it with: pip install 'tideflow[postgres]'"
            ) from None
        url, schema = _postgres_schema(url)
        return PostgresStore(url, auto_upgrade=auto_upgrade, schema=schema)
    raise StoreError(
        f"unknown store URL {url!r}: use memory://, sqlite:///path/to/file.db or postgresql://user@host/db"
    )


def __getattr__(name: str) -> Any:
    """The port's names, imported on first use: the `tideflow` command reads
    ``DEFAULT_URL`` without importing the model (docs/operations.md, "A fast CLI")."""
    if name in ("ConcurrencyConflict", "Store", "StoreError"):
        from tideflow.store import base

        return getattr(base, name)
    raise AttributeError(f"module 'tideflow.store' has no attribute {name!r}")


def _postgres_schema(url: str) -> tuple[str, str | None]:
    """The URL without its ``schema`` option (asyncpg would send it to the server as a
    setting), and the schema it names."""
    from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

    from tideflow.store.base import StoreError

    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    schemas = [value for key, value in query if key == "schema"]
    if not schemas:
        return url, None
    if len(schemas) > 1 or not schemas[0].strip():
        raise StoreError(
            "a PostgreSQL store URL takes one non-empty schema option: "
            "postgresql://user@host/db?schema=NAME"
        )
    rest = urlencode([(key, value) for key, value in query if key != "schema"])
    return urlunsplit(parts._replace(query=rest)), schemas[0]
