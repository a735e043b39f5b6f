"""The PostgreSQL store's engine lease and inbox (store/base.py), apart from the rest of
postgres.py: the inbox's channel is ``LISTEN``/``NOTIFY`` on ``tideflow_inbox:<schema>``,
listened to on a connection of its own that is replaced when it drops."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any

import asyncpg  # type: ignore[import-untyped]

from tideflow.model.events import Event
from tideflow.model.plan import Plan
from tideflow.store import sqlbase as sb
from tideflow.store.base import ENGINE_LEASE, InboxListener, Lease, StoreError
from tideflow.store.sealing import Sealer
from tideflow.store.sqlfiles import queries

Q = queries("postgres")
log = logging.getLogger("tideflow.store.postgres")

DRIVER_ERRORS = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    OSError,
)
"""Everything the driver raises. ``InternalClientError`` covers
``TargetServerAttributeNotMatched`` (every host of a multi-host URL answered, none
accepts writes: a failover under way) and a connection whose protocol a vanished server
left half-way through an exchange."""


class LeaseAndInbox:
    """Mixed into PostgresStore, which provides the connection plumbing."""

    url: str
    where: str
    _pool: Any
    _listener: Any
    """The connection that LISTENs for inbox notifications (not pooled: it holds a LISTEN)."""
    _relistening: asyncio.Task[None] | None
    sealer: Sealer

    if TYPE_CHECKING:

        async def get_plan(self, plan_hash: str) -> Plan: ...

        def _connection(self) -> contextlib.AbstractAsyncContextManager[Any]: ...
        def _settings(self) -> dict[str, str]: ...
        def _translate(self, exc: BaseException) -> StoreError: ...

    # -- the engine lease and the inbox ------------------------------------------------

    async def acquire_lease(
        self, lease: Lease, *, now: float, take_from: str | None = None
    ) -> Lease:
        async with self._connection() as conn, conn.transaction():
            await conn.execute(Q["acquire_lease"], *sb.lease_row(lease), now, take_from)
            held = sb.lease_from_row(await conn.fetchrow(Q["lease_holder"], lease.name))
        assert held is not None  # the row was just written or is held by another
        return held

    async def renew_leases(self, names: Collection[str], owner: str, expires_at: float) -> set[str]:
        async with self._connection() as conn:
            rows = await conn.fetch(Q["renew_leases"], expires_at, list(names), owner)
        return {row["name"] for row in rows}

    async def release_lease(self, name: str, owner: str) -> None:
        async with self._connection() as conn:
            await conn.execute(Q["release_lease"], name, owner)

    async def lease_holder(self, name: str) -> Lease | None:
        async with self._connection() as conn:
            return sb.lease_from_row(await conn.fetchrow(Q["lease_holder"], name))

    async def list_leases(self, prefix: str) -> list[Lease]:
        async with self._connection() as conn:
            rows = await conn.fetch(Q["list_leases"], prefix)
        return sb.leases_from_rows([tuple(row) for row in rows])

    async def add_to_inbox(self, events: Sequence[Event]) -> Lease | None:
        async with self._connection() as conn:
            plans = {
                r: await conn.fetchval(Q["run_plan_hash"], r) for r in {e.run_id for e in events}
            }
        known = {run_id: str(h) for run_id, h in plans.items() if h is not None}
        await sb.learn_plans(self.get_plan, self.sealer, known.values())
        rows = sb.inbox_rows(events, self.sealer, known)
        async with self._connection() as conn, conn.transaction():
            await conn.executemany(Q["insert_inbox"], rows)
            await conn.execute(Q["notify_inbox"])
            return sb.lease_from_row(await conn.fetchrow(Q["lease_holder"], ENGINE_LEASE))

    async def inbox(self, limit: int = 1000) -> list[Event]:
        async with self._connection() as conn:
            rows = await conn.fetch(Q["inbox"], limit)
        return [sb.inbox_event(tuple(row), self.sealer) for row in rows]

    async def remove_from_inbox(self, event_ids: Sequence[str]) -> None:
        async with self._connection() as conn:
            await conn.execute(Q["delete_inbox"], list(event_ids))

    async def listen_inbox(self, listener: InboxListener) -> str | None:
        """LISTEN on the schema's inbox channel, on a connection of its own; a connection
        that drops is replaced (and the listener called: what came meanwhile is applied)."""
        try:
            return await self._listen(listener)
        except DRIVER_ERRORS as exc:
            raise self._translate(exc) from None

    async def _listen(self, listener: InboxListener) -> str:
        conn = await asyncpg.connect(self.url, timeout=10, server_settings=self._settings())
        try:
            channel = str(await conn.fetchval(Q["inbox_channel"]))
            await conn.add_listener(channel, lambda *_: listener())
        except BaseException:
            await conn.close()
            raise
        conn.add_termination_listener(lambda _: self._relisten(listener))
        self._listener = conn
        return f"postgres:{channel}"

    def _relisten(self, listener: InboxListener) -> None:
        if self._pool is None or self._listener is None:
            return  # closing: nothing to replace
        self._listener = None
        self._relistening = asyncio.get_running_loop().create_task(self._reconnect(listener))

    async def _reconnect(self, listener: InboxListener) -> None:
        delay = 0.1
        while self._pool is not None:
            try:
                await self._listen(listener)
            except DRIVER_ERRORS as exc:
                log.warning("inbox LISTEN on %s lost (%s); reconnecting", self.where, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            listener()
            return

    async def stop_listening(self) -> None:
        if self._relistening is not None:
            self._relistening.cancel()
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(*DRIVER_ERRORS):
                await listener.close()
