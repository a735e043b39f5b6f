"""The PostgreSQL store's record of the event gateway (store/base.py ``keep_event`` and
the rest; runtime/intake.py), apart from the rest of postgres.py."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tideflow.store import sqlbase as sb
from tideflow.store.base import GatewayEvent
from tideflow.store.sqlfiles import queries

Q = queries("postgres")


class GatewayRecords:
    """Mixed into PostgresStore, which provides the connection plumbing."""

    if TYPE_CHECKING:

        def _connection(self) -> contextlib.AbstractAsyncContextManager[Any]: ...

    async def keep_event(
        self, event: GatewayEvent, wait_rows: Sequence[str] = ()
    ) -> GatewayEvent | None:
        rows = list(dict.fromkeys(wait_rows))
        async with self._connection() as conn, conn.transaction():
            if await conn.fetchval(Q["insert_gateway_event"], *sb.gateway_event_row(event)):
                if rows:
                    await conn.execute(Q["insert_gateway_event_rows"], rows, event.key)
                return None
            row = await conn.fetchrow(Q["get_gateway_event"], event.key)
        return sb.gateway_event_from_row(None if row is None else tuple(row))

    async def gateway_event(self, key: str) -> GatewayEvent | None:
        async with self._connection() as conn:
            row = await conn.fetchrow(Q["get_gateway_event"], key)
        return sb.gateway_event_from_row(None if row is None else tuple(row))

    async def settle_event(self, event: GatewayEvent, was: str) -> bool:
        async with self._connection() as conn:
            found = await conn.fetchval(Q["settle_gateway_event"], *sb.settle_params(event, was))
        return found is not None

    async def buffered_events(self, wait_row: str, now: float) -> list[GatewayEvent]:
        async with self._connection() as conn:
            rows = await conn.fetch(Q["buffered_gateway_events"], wait_row, now)
        return sb.gateway_events_from_rows([tuple(row) for row in rows])

    async def count_buffered(self, now: float, wait_row: str | None = None) -> int:
        async with self._connection() as conn:
            if wait_row is None:
                return int(await conn.fetchval(Q["count_buffered_events"], now))
            return int(await conn.fetchval(Q["count_buffered_under"], wait_row, now))

    async def unmatched_events(
        self, now: float, *, limit: int = 100, after: str | None = None
    ) -> list[GatewayEvent]:
        async with self._connection() as conn:
            rows = await conn.fetch(Q["unmatched_gateway_events"], now, after, limit)
        return sb.gateway_events_from_rows([tuple(row) for row in rows])

    async def prune_events(self, before: float) -> int:
        async with self._connection() as conn, conn.transaction():
            await conn.execute(Q["prune_gateway_event_rows"], before)
            return len(await conn.fetch(Q["prune_gateway_events"] + " RETURNING event_key", before))

    async def buffered_for_waits(
        self, now: float, limit: int = 1000
    ) -> list[tuple[str, str, GatewayEvent]]:
        async with self._connection() as conn:
            rows = await conn.fetch(Q["buffered_for_waits"], now, limit)
        return sb.buffered_for_waits([tuple(row) for row in rows])
