"""Who reads which task queue on the NATS bus, and ``queue_stats`` over it.

JetStream cannot say which clients read a queue: the durable consumer of a queue x
priority is shared by every reader, and a reader holds a pull request standing on
the server only while it is idle with room (``num_waiting`` is 0 for a busy worker,
or for one waiting on a doorbell subscription). So each ``consume_tasks`` reader
says so itself: a key in the KV bucket ``<prefix>_readers`` per queue it reads
(``q.<queue token>.<reader>``, or ``all.<reader>`` for a reader of every queue), put
again every third of the TTL (``presence_ttl``: the bus's lease, at most 10 s), purged
when it closes, and gone after the TTL (the bucket's max age, set by the process that
makes the bucket: the processes of a cluster share the bus URL) when its process dies.

A reader opened with a ``worker`` name also beats: each renewal puts its key
``<reader>`` in the KV bucket ``<prefix>_beats`` (max age ``BEATS_KEPT``, a day) with
its worker, queues and the time (this host's clock); purged when it closes, kept for a
day after its process dies. Whether it is live is read from its presence keys.

The keys are listed from the subjects of the bucket's stream (``bucket_keys``), not with
nats-py's ``KeyValue.keys()``: its watcher waits for the entry that has nothing after it,
and when a key's max age ends while it lists, that entry never comes and it waits for
ever (``tideflow workers`` and ``GET /workers`` hung so). Closing purges a key's messages
(``withdraw``) instead of deleting it: a delete leaves a marker on the key's subject,
which the listing would count as a key until its max age ends.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import time
import uuid
from typing import TYPE_CHECKING

import nats.errors
import nats.js.errors
import orjson
from nats.js.kv import KeyValue

from tideflow.bus import presence
from tideflow.bus.backends.nats_readers import PRIORITIES, queue_of_token, queue_token
from tideflow.bus.base import BEATS_KEPT, QueueStats, WorkerBeat, beat_of, presence_ttl
from tideflow.errors import BusError

if TYPE_CHECKING:
    from tideflow.bus.backends.nats import NatsBus

log = logging.getLogger("tideflow.bus.nats")


def bucket_name(bus: NatsBus) -> str:
    return f"{bus.prefix}_readers"


def beats_bucket_name(bus: NatsBus) -> str:
    return f"{bus.prefix}_beats"


async def readers_bucket(bus: NatsBus) -> KeyValue:
    return await _bucket(bus, bucket_name(bus), presence_ttl(bus.lease))


async def beats_bucket(bus: NatsBus) -> KeyValue:
    return await _bucket(bus, beats_bucket_name(bus), BEATS_KEPT)


async def _bucket(bus: NatsBus, name: str, ttl: float) -> KeyValue:
    try:
        return await bus.js.key_value(name)
    except nats.js.errors.BucketNotFoundError:
        with contextlib.suppress(nats.js.errors.BadRequestError):  # made by another at once
            return await bus.js.create_key_value(bucket=name, ttl=ttl)
        return await bus.js.key_value(name)


class Presence(presence.Presence):
    """The keys of one reader, renewed while it is open."""

    renewer_name = "tideflow-nats-presence"

    def __init__(self, bus: NatsBus, queues: list[str] | None, worker: str | None) -> None:
        super().__init__(bus.lease)
        me = uuid.uuid4().hex
        wanted = None if queues is None else sorted(set(queues))
        self.bus = bus
        self.me = me
        if wanted is None:
            self.keys = [f"all.{me}"]
        else:
            self.keys = [f"q.{queue_token(q)}.{me}" for q in wanted]
        self.beat = None if worker is None else {"worker": worker, "queues": wanted}
        self._kv: KeyValue | None = None
        self._beats: KeyValue | None = None

    async def withdraw(self) -> None:
        kv, self._kv = self._kv, None
        beats, self._beats = self._beats, None
        if beats is not None:
            await _purge(self.bus, beats_bucket_name(self.bus), [self.me])
        if kv is not None:
            await _purge(self.bus, bucket_name(self.bus), self.keys)

    async def announce(self) -> None:
        """Put the keys (and the beat); a failure is logged (the reader reads on,
        uncounted for now)."""
        try:
            if self._kv is None:
                self._kv = await readers_bucket(self.bus)
                made = (await self._kv.status()).ttl  # made by a process with a shorter lease?
                self.ttl = min(self.ttl, made or self.ttl)
            for key in self.keys:
                await self._kv.put(key, b"")
            if self.beat is not None:
                if self._beats is None:
                    self._beats = await beats_bucket(self.bus)
                await self._beats.put(self.me, orjson.dumps(self.beat | {"at": time.time()}))
        except nats.errors.Error as exc:
            log.warning("NATS bus %s: announcing a task reader failed: %s", self.bus.url, exc)


def _subject(bucket: str, key: str = "") -> str:
    return f"$KV.{bucket}.{key}"


async def _purge(bus: NatsBus, bucket: str, keys: list[str]) -> None:
    """Take ``keys`` out of ``bucket`` with no marker left (failures ignored: a key left
    behind lapses at its max age)."""
    for key in keys:
        with contextlib.suppress(nats.errors.Error):
            await bus.js.purge_stream(f"KV_{bucket}", subject=_subject(bucket, key))


async def bucket_keys(bus: NatsBus, bucket: str) -> list[str]:
    """The keys of ``bucket`` that have a message now, in one request. A key another
    version of tideflow deleted (a marker) is listed until its max age ends."""
    prefix = _subject(bucket)
    info = await bus.js.stream_info(f"KV_{bucket}", subjects_filter=f"{prefix}>")
    return sorted(subject[len(prefix) :] for subject in info.state.subjects or {})


async def queue_stats(bus: NatsBus) -> list[QueueStats]:
    try:
        return await _queue_stats(bus)
    except nats.errors.Error as exc:
        raise BusError(f"NATS bus {bus.url}: reading the queue stats failed: {exc}") from None


async def _queue_stats(bus: NatsBus) -> list[QueueStats]:
    js, stream = bus.js, bus.tasks_stream
    info = await js.stream_info(stream, subjects_filter=f"{bus.prefix}.tasks.>")
    counts = info.state.subjects or {}
    consumers = {c.name: c for c in await js.consumers_info(stream)}
    tokens = {s.split(".")[-2] for s in counts}
    tokens |= {
        subject.split(".")[-2]
        for c in consumers.values()
        if (subject := c.config.filter_subject or "").startswith(f"{bus.prefix}.tasks.")
    }
    readers = await _readers(bus)
    tokens |= {token for token in readers if token != "*"}
    rows = []
    for queue, token in sorted((q, t) for t in tokens if (q := queue_of_token(t)) is not None):
        reading = len(readers.get(token, ())) + len(readers.get("*", ()))
        for priority in PRIORITIES:
            subject = bus.task_subject(queue, priority)
            consumer = consumers.get(f"tasks_{token}_{priority.value}")
            if consumer is None:
                depth, held, after = counts.get(subject, 0), 0, 0
            else:
                depth, held = consumer.num_pending or 0, consumer.num_ack_pending or 0
                after = consumer.delivered.stream_seq if consumer.delivered else 0
            age = await _oldest_age(bus, subject, after) if depth else None
            rows.append(
                QueueStats(
                    queue=queue,
                    priority=priority,
                    depth=depth,
                    held=held,
                    oldest_age=age,
                    consumers=reading,
                )
            )
    return rows


async def worker_beats(bus: NatsBus) -> list[WorkerBeat]:
    try:
        return await _worker_beats(bus)
    except nats.errors.Error as exc:
        raise BusError(f"NATS bus {bus.url}: reading the worker beats failed: {exc}") from None


async def _worker_beats(bus: NatsBus) -> list[WorkerBeat]:
    kv = await beats_bucket(bus)
    keys = await bucket_keys(bus, beats_bucket_name(bus))
    if not keys:
        return []
    live = set().union(*(await _readers(bus)).values())
    beats: list[WorkerBeat] = []
    for key in keys:
        try:
            entry = await kv.get(key)
        except nats.js.errors.KeyNotFoundError:
            continue  # closed since the keys were listed
        beat = beat_of(entry.value, live=key in live) if entry.value else None
        if beat is not None:  # (a damaged record, or another version's, is left out)
            beats.append(beat)
    return sorted(beats, key=lambda b: (b.worker, b.last_beat))


async def _readers(bus: NatsBus) -> dict[str, set[str]]:
    """Queue token ('*': every queue) -> the readers that say they read it."""
    await readers_bucket(bus)  # made if missing
    keys = await bucket_keys(bus, bucket_name(bus))
    readers: dict[str, set[str]] = {}
    for key in keys:
        kind, _, rest = key.partition(".")
        token, _, me = rest.rpartition(".") if kind == "q" else ("*", "", rest)
        if kind in ("q", "all") and me:
            readers.setdefault(token, set()).add(me)
    return readers


async def _oldest_age(bus: NatsBus, subject: str, after: int) -> float | None:
    """Seconds since the first message on ``subject`` past stream sequence ``after`` was
    stored (the server's timestamp against this host's clock)."""
    try:
        msg = await bus.js.get_msg(bus.tasks_stream, seq=after + 1, subject=subject, next=True)
    except nats.js.errors.NotFoundError:
        return None
    if msg.time is None:
        return None
    stored = msg.time.replace(tzinfo=msg.time.tzinfo or datetime.UTC).timestamp()
    return max(0.0, time.time() - stored)


__all__ = [
    "Presence",
    "beats_bucket",
    "beats_bucket_name",
    "bucket_keys",
    "bucket_name",
    "queue_stats",
    "readers_bucket",
    "worker_beats",
]
