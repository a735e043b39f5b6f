"""Who reads which task queue on the Redis bus, and ``queue_stats`` over it.

A consumer group cannot say which consumers are reading now: before Redis 7.2 an
``XREADGROUP`` that finds nothing does not reset a consumer's idle time, and a
killed consumer stays in ``XINFO CONSUMERS`` for good. So each ``consume_tasks``
reader says so itself: members of the sorted set ``<prefix>:readers``
(``<reader>:<queue>`` per queue it reads, ``<reader>*`` for a reader of every queue),
scored with the server time at which they lapse, renewed every third of their TTL
(``presence_ttl``: the bus's lease, at most 10 s), removed when it closes, and lapsed
after the TTL when its process dies.

A reader opened with a ``worker`` name also beats: each renewal scores it with the server
time in the sorted set ``<prefix>:beats`` (its record, worker and queues, in the hash
``<prefix>:beat_records``), in the same script; both are deleted when it closes, and a
beat older than ``BEATS_KEPT`` is trimmed by the next renewal of any reader.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from typing import TYPE_CHECKING, Any

import orjson

from tideflow.bus import presence
from tideflow.bus.backends.redis_consumers import FAILED, RANKS, TASK_GROUP, text
from tideflow.bus.base import BEATS_KEPT, QueueStats, WorkerBeat, beat_of
from tideflow.errors import BusError

if TYPE_CHECKING:
    from tideflow.bus.backends.redis import RedisBus

log = logging.getLogger("tideflow.bus.redis")

_ID = 32


class Presence(presence.Presence):
    """The members of one reader, renewed while it is open."""

    renewer_name = "tideflow-redis-presence"

    def __init__(self, bus: RedisBus, queues: list[str] | None, worker: str | None) -> None:
        super().__init__(bus.lease)
        me = uuid.uuid4().hex
        wanted = None if queues is None else sorted(set(queues))
        self.bus = bus
        self.members = [f"{me}*"] if wanted is None else [f"{me}:{q}" for q in wanted]
        self.reader = "" if worker is None else me
        self.record = b"" if worker is None else orjson.dumps({"worker": worker, "queues": wanted})

    async def withdraw(self) -> None:
        bus = self.bus
        commands: list[tuple[Any, ...]] = [("ZREM", bus.key("readers"), *self.members)]
        if self.reader:
            commands += [("ZREM", bus.key("beats"), self.reader)]
            commands += [("HDEL", bus.key("beat_records"), self.reader)]
        with contextlib.suppress(BusError, *FAILED):  # closing: a lapsed member is harmless
            await bus.run(*commands)

    async def announce(self) -> None:
        """Add the members (and the beat); a failure is logged (the reader reads on,
        uncounted for now)."""
        try:
            await self.bus.script(
                "announce",
                _keys(self.bus),
                round(self.ttl * 1000),
                round(BEATS_KEPT * 1000),
                self.reader,
                self.record,
                *self.members,
            )
        except FAILED as exc:
            log.warning("redis bus %s: announcing a task reader failed: %s", self.bus.shown, exc)


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


async def worker_beats(bus: RedisBus) -> list[WorkerBeat]:
    try:
        members, rows = await bus.script("beats", _keys(bus))
    except FAILED as exc:
        raise bus.failure("reading the worker beats", exc) from exc
    every, readers = _readers([text(m) for m in members])
    live = every.union(*readers.values())
    beats = [
        beat
        for reader, score, record in rows
        if (beat := beat_of(text(record), live=text(reader) in live, at=float(score) / 1000))
    ]  # a record trimmed between the two reads of a renewal, or damaged, is left out
    return sorted(beats, key=lambda b: (b.worker, b.last_beat))


def _keys(bus: RedisBus) -> list[str]:
    return [bus.key("readers"), bus.key("beats"), bus.key("beat_records")]


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


__all__ = ["Presence", "queue_stats", "worker_beats"]
