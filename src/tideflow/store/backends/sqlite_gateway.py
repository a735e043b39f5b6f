"""The SQLite store's record of the event gateway (store/base.py ``keep_event`` and the
rest; runtime/intake.py), apart from the rest of sqlite.py."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from tideflow.store import sqlbase as sb
from tideflow.store.base import GatewayEvent
from tideflow.store.sqlfiles import queries

Q = queries("sqlite")
T = TypeVar("T")


class GatewayRecords:
    """Mixed into SqliteStore, which provides the connection plumbing."""

    if TYPE_CHECKING:

        @property
        def conn(self) -> sqlite3.Connection: ...

        async def _run(self, fn: Callable[..., T], *args: Any) -> T: ...
        def _transaction(self, fn: Callable[[sqlite3.Connection], T]) -> T: ...

    async def keep_event(
        self, event: GatewayEvent, wait_rows: Sequence[str] = ()
    ) -> GatewayEvent | None:
        row = sb.gateway_event_row(event)
        rows = [(wait_row, event.key) for wait_row in dict.fromkeys(wait_rows)]

        def keep(conn: sqlite3.Connection) -> Any:
            if conn.execute(Q["insert_gateway_event"], row).rowcount:
                conn.executemany(Q["insert_gateway_event_row"], rows)
                return None
            return conn.execute(Q["get_gateway_event"], (event.key,)).fetchone()

        return sb.gateway_event_from_row(await self._run(self._transaction, keep))

    async def gateway_event(self, key: str) -> GatewayEvent | None:
        row = await self._run(lambda: self.conn.execute(Q["get_gateway_event"], (key,)).fetchone())
        return sb.gateway_event_from_row(row)

    async def settle_event(self, event: GatewayEvent, was: str) -> bool:
        params = sb.settle_params(event, was)
        return await self._run(
            self._transaction, lambda c: bool(c.execute(Q["settle_gateway_event"], params).rowcount)
        )

    async def buffered_events(self, wait_row: str, now: float) -> list[GatewayEvent]:
        params = (wait_row, now)
        rows = await self._run(
            lambda: self.conn.execute(Q["buffered_gateway_events"], params).fetchall()
        )
        return sb.gateway_events_from_rows(rows)

    async def count_buffered(self, now: float, wait_row: str | None = None) -> int:
        query, params = (
            ("count_buffered_events", (now,))
            if wait_row is None
            else ("count_buffered_under", (wait_row, now))
        )
        row = await self._run(lambda: self.conn.execute(Q[query], params).fetchone())
        return int(row[0])

    async def unmatched_events(
        self, now: float, *, limit: int = 100, after: str | None = None
    ) -> list[GatewayEvent]:
        params = (now, after, after, limit)
        rows = await self._run(
            lambda: self.conn.execute(Q["unmatched_gateway_events"], params).fetchall()
        )
        return sb.gateway_events_from_rows(rows)

    async def prune_events(self, before: float) -> int:
        def prune(conn: sqlite3.Connection) -> int:
            conn.execute(Q["prune_gateway_event_rows"], (before,))
            return int(conn.execute(Q["prune_gateway_events"], (before,)).rowcount)

        return await self._run(self._transaction, prune)

    async def buffered_for_waits(
        self, now: float, limit: int = 1000
    ) -> list[tuple[str, str, GatewayEvent]]:
        rows = await self._run(
            lambda: self.conn.execute(Q["buffered_for_waits"], (now, limit)).fetchall()
        )
        return sb.buffered_for_waits(rows)
