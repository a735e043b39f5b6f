"""Events from other processes: the inbox beside the store, and how its engine hears of it.

A client in another process (`tideflow runs signal|cancel|retry`, a start) writes its
event durably to the store's inbox first, then pokes the live engine through the
notification channel whose address the engine put in its lease row:

- SQLite (and any backend without a channel of its own): a UDP datagram to the
  engine's socket on 127.0.0.1 (``udp://127.0.0.1:PORT``);
- PostgreSQL: ``NOTIFY`` in the transaction that wrote the events, which the engine
  ``LISTEN``s for (``postgres:<channel>``);
- memory: an in-process callback.

The engine applies what the inbox holds when poked, and once on start (what was
written while no engine was live, or sent to one that died before applying it); an
event is removed only after it was applied, and applying one twice changes nothing
(signals are deduplicated by id, a second cancel or retry finds nothing to do). In
steady state nothing polls: a lost datagram leaves its event for the next poke or
the next start.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from tideflow.bus.closing import cancel_and_wait
from tideflow.model.events import Event
from tideflow.store.base import Lease, Store

log = logging.getLogger("tideflow.inbox")

BATCH = 500
"""Inbox events applied per batch."""
UDP = "udp://"


class _Poked(asyncio.DatagramProtocol):
    def __init__(self, poke: Callable[[], None]) -> None:
        self._poke = poke

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self._poke()


class Inbox:
    """The engine's side: listen for pokes and apply the inbox when poked."""

    def __init__(self, store: Store, apply: Callable[[list[Event]], Awaitable[object]]) -> None:
        self._store = store
        self._apply = apply
        self._transport: asyncio.DatagramTransport | None = None
        self._task: asyncio.Task[None] | None = None
        self._open = False
        self._again = False
        self._retry_delay = 0.05
        self._retry: asyncio.TimerHandle | None = None

    async def listen(self) -> str:
        """Start listening; the address clients notify."""
        address = await self._store.listen_inbox(self.poke)
        if address is not None:
            return address
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(
            lambda: _Poked(self.poke), local_addr=("127.0.0.1", 0)
        )
        self._transport = transport
        host, port = transport.get_extra_info("sockname")[:2]
        return f"{UDP}{host}:{port}"

    def start(self) -> None:
        """Apply what the inbox holds now, and from then on whatever a poke announces."""
        self._open = True
        self.poke()

    def poke(self) -> None:
        if not self._open:
            return
        self._again = True
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._drain(), name="tideflow-inbox"
            )

    async def _drain(self) -> None:
        while self._again:
            self._again = False
            try:
                await self._apply_all()
            except Exception as exc:  # the store is down: try again later, never drop
                log.warning("inbox not applied (%s: %s); trying again", type(exc).__name__, exc)
                self._retry = asyncio.get_running_loop().call_later(self._retry_delay, self.poke)
                self._retry_delay = min(self._retry_delay * 2, 5.0)
                return
            self._retry_delay = 0.05

    async def _apply_all(self) -> None:
        while True:
            events = await self._store.inbox(BATCH)
            if not events:
                return
            await self._apply(events)
            await self._store.remove_from_inbox([event.event_id for event in events])
            if len(events) < BATCH:
                return

    async def close(self) -> None:
        self._open = False
        if self._retry is not None:
            self._retry.cancel()
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
        if self._transport is not None:
            self._transport.close()
            self._transport = None


async def post(store: Store, events: Sequence[Event]) -> Lease | None:
    """Record events for the engine and notify the engine that holds the store's lease,
    if any; return that lease (it may be stale: the events then wait for the next engine)."""
    holder = await store.add_to_inbox(events)
    if holder is not None and holder.address and holder.address.startswith(UDP):
        notify(holder.address)
    return holder


def notify(address: str) -> None:
    """One datagram to ``udp://HOST:PORT``; a lost one costs only latency (see module doc)."""
    host, _, port = address[len(UDP) :].rpartition(":")
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.sendto(b"inbox", (host, int(port)))
    except (OSError, ValueError) as exc:
        log.warning("could not notify the engine at %s: %s", address, exc)


__all__ = ["Inbox", "notify", "post"]
