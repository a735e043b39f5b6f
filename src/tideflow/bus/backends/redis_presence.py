"""Who reads which task queue on the Redis bus, and ``queue_stats`` over it.

A consumer group cannot say which consumers are reading now: before Redis 7.2 an
``XREADGROUP`` that finds nothing does not reset a consumer's idle time, and a
killed consumer stays in ``XINFO CONSUMERS`` for good. So each ``consume_tasks``
reader says so itself: members of the sorted set ``<prefix>:readers``
(``<reader>:<queue>`` per queue it reads, ``<reader>*`` for a reader of every queue),
scored with the server time at which they lapse, renewed every ``TTL / 3`` seconds,
removed when it closes, and lapsed after ``TTL`` seconds when its process dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from typing import TYPE_CHECKING

from tideflow.bus.backends.redis_consumers import FAILED, RANKS, TASK_GROUP, text
from tideflow.bus.base import QueueStats
from tideflow.errors import BusError

if TYPE_CHECKING:
    from tideflow.bus.backends.redis import RedisBus

log = logging.getLogger("tideflow.bus.redis")

TTL = 10.0
"""Seconds a reader's member outlives its last renewal (a killed reader counts that long)."""
_ID = 32


class Presence:
    """The members of one reader, renewed while it is open."""

    def __init__(self, bus: RedisBus, queues: list[str] | None) -> None:
        me = uuid.uuid4().hex
        self.bus = bus
        self.members = [f"{me}*"] if queues is None else [f"{me}:{q}" for q in sorted(set(queues))]
        self._renewer: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self._announce()
        self._renewer = asyncio.create_task(self._renew(), name="tideflow-redis-presence")

    async def stop(self) -> None:
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewer
            self._renewer = None
        with contextlib.suppress(BusError, *FAILED):  # closing: a lapsed member is harmless
            await self.bus.client.zrem(self.bus.key("readers"), *self.members)

    async def _announce(self) -> None:
        """Add the members; a failure is logged (the reader reads on, uncounted for now)."""
        try:
            ttl_ms = round(TTL * 1000)
            await self.bus.script("announce", [self.bus.key("readers")], ttl_ms, *self.members)
        except FAILED as exc:
            log.warning("redis bus %s: announcing a task reader failed: %s", self.bus.shown, exc)

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(TTL / 3)  # the members' heartbeat, not a wait on a condition
            await self._announce()


async def queue_stats(bus: RedisBus) -> list[QueueStats]:
    try:
        names = {text(n) for n in await bus.client.smembers(bus.key("queues"))}
        now_ms, members, streams = await bus.script(
            "queue_stats",
            [bus.key("readers")] + [bus.task_stream(n, r) for n in sorted(names) for r in RANKS],
            TASK_GROUP,
        )
    except FAILED as exc:
        raise bus.failure("reading the queue stats", exc) from exc
    every, readers = _readers([text(m) for m in members])
    queues = sorted(names)
    rows = []
    for i, name in enumerate(queues):
        reading = len(every) + len(readers.get(name, ()))
        for rank, (depth, held, oldest) in zip(RANKS, streams[3 * i : 3 * i + 3], strict=True):
            first = text(oldest)
            rows.append(
                QueueStats(
                    queue=name,
                    priority=rank,
                    depth=int(depth),
                    held=int(held),
                    oldest_age=max(0, now_ms - int(first.split("-")[0])) / 1000 if first else None,
                    consumers=reading,
                )
            )
    return rows


def _readers(members: list[str]) -> tuple[set[str], dict[str, set[str]]]:
    """The readers of every queue, and the readers of each named queue."""
    every: set[str] = set()
    readers: dict[str, set[str]] = {}
    for member in members:
        me, rest = member[:_ID], member[_ID:]
        if rest == "*":
            every.add(me)
        elif rest.startswith(":"):
            readers.setdefault(rest[1:], set()).add(me)
    return every, readers


__all__ = ["TTL", "Presence", "queue_stats"]
