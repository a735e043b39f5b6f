"""The store port and its backends, chosen by URL.

``memory://`` (nothing survives the process), ``sqlite:///path/to/file.db``
(``sqlite:///:memory:`` for a private in-memory database), and
``postgresql://user@host:port/db``.
"""

from __future__ import annotations

from tideflow.store.base import ConcurrencyConflict, Store, StoreError

DEFAULT_URL = "sqlite:///.tideflow/tideflow.db"
"""Where `tideflow run` keeps state unless told otherwise: under the working directory."""

__all__ = ["DEFAULT_URL", "ConcurrencyConflict", "Store", "StoreError", "open_store"]


def open_store(url: str, *, auto_upgrade: bool = True) -> Store:
    """A store for ``url`` (not yet opened: ``await store.open()``)."""
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
        return PostgresStore(url, auto_upgrade=auto_upgrade)
    raise StoreError(
        f"unknown store URL {url!r}: use memory://, sqlite:///path/to/file.db or postgresql://user@host/db"
    )
