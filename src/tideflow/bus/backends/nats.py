"""The NATS JetStream bus: durable pull consumers, ``AckWait`` as the lease.

What it creates on the server, all named after ``prefix`` (default ``tideflow``) so
that several clusters or tests share one server:

- stream ``<prefix>_tasks`` on ``<prefix>.tasks.<queue>.<priority>`` and stream
  ``<prefix>_events`` on ``<prefix>.events.<partition>``, both with *WorkQueue*
  retention: a message is deleted once it is acknowledged, so the stream's message
  count is the depth of the queue (what ``tideflow queues`` shows) and nothing that
  was handled lingers. WorkQueue allows one consumer per subject, which is the shape
  wanted anyway: one durable pull consumer per queue x priority
  (``tasks_<queue>_<priority>``), shared by every worker that serves the queue, and
  one per event partition (``events_<partition>``), read by its one owner;
- stream ``<prefix>_dead`` on ``<prefix>.dead.>`` (Limits retention, kept 7 days):
  what could not be delivered: malformed messages, and tasks past ``max_deliver``;
- KV buckets ``<prefix>_readers`` and ``<prefix>_beats``: who reads which task queue
  now, and the last beat of each reader opened with a worker name (``nats_presence``);
- KV bucket ``<prefix>_partitions``: one key per event partition held by the
  consumer that reads it, renewed while it is open, gone after its TTL if that
  process dies. This is what makes a partition exclusive across processes (a
  JetStream consumer by itself lets any number of clients pull).

The port onto JetStream: ``ack`` is ``+ACK``, ``nack(delay)`` is ``-NAK`` with a
delay, ``extend`` is ``+WPI`` (in progress), a lease is the consumer's ``AckWait``,
and ``deliveries`` is the message's delivery count from its metadata. Each
delivery also keeps its lease locally, so that settling one whose lease ran out
changes nothing (the server would accept the late ack and drop the message that
went back to the queue).

Wire format: the body is orjson of ``command_to_data`` / ``event_to_data``; the
tideflow headers are NATS headers. A message that cannot be decoded is logged with
its subject and sequence, copied with its headers and a ``Tideflow-Dead-Reason``
header to ``<prefix>.dead.<subject after the prefix>``, and acknowledged: it never
stops a consumer. Control messages are core NATS on ``<prefix>.control`` (at most
once, as the port says), and so are run ends on ``<prefix>.ended`` (one message per
batch, ``bus/fanout.py``'s wire form; subscribed at the first ``run_ends`` call, so a
worker or a server receives none; a malformed one is dropped, logged at DEBUG). nats-py
subscribes its subscriptions again when it reconnects. ``run_ends`` returns once the
server has the subscription, proven by a probe (a message with a ``Tideflow-Probe``
header, which every run-end stream ignores) published on the same connection after the
subscription and come back through it: a flush is not enough, as nats-py writes its PING
to the socket ahead of a subscription still in its send buffer, and a run end another
process published just then was lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import uuid
from collections.abc import AsyncGenerator, Collection, Sequence
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import nats
import nats.errors
import nats.js.errors
import orjson
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext, api
from nats.js.kv import KeyValue

from tideflow.bus.backends import nats_presence
from tideflow.bus.backends.nats_pull import Lane, Puller
from tideflow.bus.backends.nats_readers import (
    EventReader,
    TaskReader,
    queue_token,
)
from tideflow.bus.base import (
    DEFAULT_LEASE,
    DEFAULT_PARTITIONS,
    Bus,
    CancelAttempt,
    Control,
    Delivery,
    EventBatch,
    Headers,
    Message,
    QueueStats,
    RunEnded,
    Stream,
    WorkerBeat,
    partition_of,
    wanted_partitions,
)
from tideflow.bus.closing import cancels_asked, raise_dropped_cancel, unstoppable
from tideflow.bus.fanout import FanOut, MalformedEnds, decode_run_ends, encode_run_ends
from tideflow.errors import BusError
from tideflow.model.codec import (
    command_to_data,
    event_to_data,
)
from tideflow.model.commands import DispatchTask
from tideflow.model.events import Event
from tideflow.model.plan import Priority

log = logging.getLogger("tideflow.bus.nats")

DEFAULT_URL = "nats://127.0.0.1:4222"
DEFAULT_PREFIX = "tideflow"
DEFAULT_MAX_DELIVER = 10
PUBLISH_TIMEOUT = 10.0
"""Seconds a publish waits for the stream's acknowledgements (across a reconnect)."""
DEAD_AGE = 7 * 24 * 3600.0
DEAD_REASON = "Tideflow-Dead-Reason"
PROBE = "Tideflow-Probe"
"""Header of a message that proves a subscription (see the module docstring)."""
PROBE_TIMEOUT = 10.0
"""Seconds a subscription's probe may take to come back (nats-py's flush timeout)."""
_NAME = re.compile(r"[A-Za-z0-9_-]+")
_OPTIONS = ("prefix", "partitions", "lease", "max_deliver")


class NatsBus(Bus):
    """The JetStream bus (``await bus.open()`` connects and creates what is missing).

    ``ack_tasks`` is the default (each ``msg.ack()`` in turn): an ack is a publish that
    waits for no reply, and the client's flusher sends those of one turn together."""

    batching_pays = True

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        prefix: str = DEFAULT_PREFIX,
        partitions: int = DEFAULT_PARTITIONS,
        lease: float = DEFAULT_LEASE,
        max_deliver: int = DEFAULT_MAX_DELIVER,
    ) -> None:
        if not _NAME.fullmatch(prefix):
            raise BusError(
                f"prefix {prefix!r}: use letters, digits, '-' and '_' only "
                "(it names subjects, streams and consumers)"
            )
        if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
            raise BusError(f"partitions must be a whole number of at least 1, got {partitions!r}")
        if not isinstance(lease, int | float) or not math.isfinite(lease) or lease <= 0:
            raise BusError(f"lease must be a positive number of seconds, got {lease!r}")
        if isinstance(max_deliver, bool) or not isinstance(max_deliver, int) or max_deliver < -1:
            raise BusError(
                f"max_deliver must be a whole number (-1: no limit), got {max_deliver!r}"
            )
        if max_deliver in (0, 1):
            raise BusError("max_deliver must be at least 2 (a nack must be able to come again)")
        self.url = url
        self.prefix = prefix
        self.partitions = partitions
        self.lease = float(lease)
        self.max_deliver = max_deliver
        self.tasks_stream = f"{prefix}_tasks"
        self.events_stream = f"{prefix}_events"
        self.dead_stream = f"{prefix}_dead"
        self.lock_bucket = f"{prefix}_partitions"
        self.owner = uuid.uuid4().hex
        self._nc: Client | None = None
        self._js: JetStreamContext | None = None
        self._kv: KeyValue | None = None
        self._lock_ttl = min(self.lease, 10.0)
        self._controls: FanOut[Control] = FanOut()
        self._ends: FanOut[RunEnded] = FanOut()
        self._ends_sub: Subscription | None = None
        self._probes: dict[str, asyncio.Future[None]] = {}
        self._ends_lock = asyncio.Lock()
        self._subs: list[Subscription] = []
        self._known: set[str] = set()
        """Consumers created or updated by this bus (each is made once per connection:
        a broker that crashed may have lost one made shortly before)."""
        self._pullers: set[Puller] = set()
        self._announced: set[str] = set()
        """Queues this connection has published tasks to and announced (``queues_subject``)."""
        """The open readers' pullers, told when the link comes back."""

    # -- connection -------------------------------------------------------------

    @property
    def nc(self) -> Client:
        if self._nc is None:
            raise BusError(f"the NATS bus {self.url} is not open: await bus.open() first")
        return self._nc

    @property
    def js(self) -> JetStreamContext:
        if self._js is None:
            raise BusError(f"the NATS bus {self.url} is not open: await bus.open() first")
        return self._js

    async def open(self) -> None:
        if self._nc is not None:
            return
        self._nc = await self._connect()
        self._js = self._nc.jetstream()
        try:
            await self._ensure_stream(self.tasks_stream, f"{self.prefix}.tasks.>")
            await self._ensure_stream(self.events_stream, f"{self.prefix}.events.*")
            await self._ensure_stream(
                self.dead_stream, f"{self.prefix}.dead.>", api.RetentionPolicy.LIMITS
            )
            self._kv = await self._lock_bucket()
            self._subs = [
                await self.nc.subscribe(f"{self.prefix}.control", cb=self._on_control),
                await self.nc.subscribe(
                    f"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{self.tasks_stream}.*",
                    queue=f"{self.prefix}-dead",
                    cb=self._on_max_deliveries,
                ),
            ]
        except BusError:
            await self.close()
            raise
        except nats.errors.Error as exc:
            await self.close()
            raise BusError(f"NATS bus {self.url}: setting up JetStream failed: {exc}") from None

    async def close(self) -> None:
        nc, self._nc, self._js, self._kv = self._nc, None, None, None
        self._ends_sub = None
        if nc is None:
            return
        with contextlib.suppress(Exception):
            await nc.flush(timeout=2)
        await nc.close()

    async def _connect(self) -> Client:
        async def on_error(exc: Exception) -> None:
            log.warning("NATS bus %s: %s", self.url, exc)

        async def on_disconnect() -> None:
            if self._nc is None:
                return  # closed on purpose
            log.warning("NATS bus %s: disconnected; reconnecting with backoff", self.url)

        async def on_reconnect() -> None:
            log.warning("NATS bus %s: reconnected", self.url)
            self._known.clear()
            self._announced.clear()  # an announcement may have been lost: again
            for puller in list(self._pullers):
                puller.reconnected()

        try:
            # Two tries on the first connect, so that a wrong URL fails fast; once
            # connected, reconnect for ever (a broker restart must not end a process).
            nc = await nats.connect(
                servers=server_urls(self.url),
                name=f"tideflow-{self.prefix}",
                connect_timeout=5,
                max_reconnect_attempts=1,
                reconnect_time_wait=0.2,
                error_cb=on_error,
                disconnected_cb=on_disconnect,
                reconnected_cb=on_reconnect,
            )
        except (nats.errors.Error, OSError) as exc:
            raise BusError(
                f"cannot connect to NATS at {self.url}: {exc or type(exc).__name__} "
                "(is nats-server running with JetStream, `nats-server -js`?)"
            ) from None
        nc.options["max_reconnect_attempts"] = -1
        nc.options["reconnect_time_wait"] = 2.0
        return nc

    async def _ensure_stream(
        self,
        name: str,
        subject: str,
        retention: api.RetentionPolicy = api.RetentionPolicy.WORK_QUEUE,
    ) -> None:
        try:
            await self.js.stream_info(name)
            return
        except nats.js.errors.NotFoundError:
            pass
        except nats.js.errors.ServiceUnavailableError:
            raise BusError(
                f"NATS at {self.url} has no JetStream: start the server with `nats-server -js`"
            ) from None
        max_age = DEAD_AGE if retention is api.RetentionPolicy.LIMITS else None
        with contextlib.suppress(nats.js.errors.BadRequestError):  # made by another at once
            await self.js.add_stream(
                name=name, subjects=[subject], retention=retention, max_age=max_age
            )

    async def _lock_bucket(self) -> KeyValue:
        try:
            kv = await self.js.key_value(self.lock_bucket)
        except nats.js.errors.BucketNotFoundError:
            kv = await self.js.create_key_value(bucket=self.lock_bucket, ttl=self._lock_ttl)
        ttl = (await kv.status()).ttl
        if ttl:
            self._lock_ttl = ttl
        return kv

    def puller(self, *, tasks: bool) -> Puller:
        """A puller for a reader of tasks or events, told of reconnects until ``forget``."""

        async def ensure(lane: Lane) -> None:
            await self.ensure_consumer(lane.stream, lane.consumer, lane.subject, tasks=tasks)

        puller = Puller(self.nc, ensure)
        self._pullers.add(puller)
        return puller

    def forget(self, puller: Puller) -> None:
        self._pullers.discard(puller)

    async def ensure_consumer(self, stream: str, name: str, subject: str, *, tasks: bool) -> None:
        if name in self._known:
            return
        config = api.ConsumerConfig(
            durable_name=name,
            filter_subject=subject,
            ack_policy=api.AckPolicy.EXPLICIT,
            deliver_policy=api.DeliverPolicy.ALL,
            ack_wait=self.lease,
            max_deliver=self.max_deliver if tasks else -1,
            max_ack_pending=-1,
        )
        try:
            await self.js.add_consumer(stream, config)
        except nats.errors.Error as exc:
            raise BusError(
                f"NATS bus {self.url}: cannot create or update consumer {name} on {stream}: "
                f"{exc} (a consumer made with other settings: delete it with "
                f"`nats consumer rm {stream} {name}`)"
            ) from None
        self._known.add(name)

    # -- producer ---------------------------------------------------------------

    async def publish_tasks(self, tasks: Sequence[DispatchTask | Message[DispatchTask]]) -> None:
        await self._publish(
            (self.task_subject(body.queue, body.priority), command_to_data(body), headers)
            for body, headers in map(_split, tasks)
        )
        for body, _ in map(_split, tasks):
            if body.queue not in self._announced:
                await self._announce(body.queue)

    @property
    def queues_subject(self) -> str:
        """Where a queue is announced the first time a connection publishes to it, for the
        workers that serve every queue (a hint: they also look for new queues every
        ``LINGER`` seconds, so an announcement lost loses no task)."""
        return f"{self.prefix}.queues"

    async def _announce(self, queue: str) -> None:
        try:
            await self.nc.publish(self.queues_subject, queue.encode())
        except nats.errors.Error as exc:
            log.debug("NATS bus %s: announcing queue %r failed: %s", self.url, queue, exc)
            return
        self._announced.add(queue)

    async def publish_events(self, events: Sequence[Event | Message[Event]]) -> None:
        count = self.partitions
        await self._publish(
            (
                f"{self.prefix}.events.{partition_of(body.run_id, count)}",
                event_to_data(body),
                headers,
            )
            for body, headers in map(_split, events)
        )

    async def publish_control(self, message: Control) -> None:
        data = {
            "type": "cancel",
            "run_id": message.run_id,
            "step_key": message.step_key,
            "attempt": message.attempt,
            "round": message.round,
            "compensation": message.compensation,
        }
        try:
            await self.nc.publish(f"{self.prefix}.control", orjson.dumps(data))
        except nats.errors.Error as exc:
            raise BusError(
                f"NATS bus {self.url}: publishing a control message failed: {exc}"
            ) from None

    async def publish_run_ends(self, ends: Sequence[RunEnded]) -> None:
        if not ends:
            return
        try:
            await self.nc.publish(f"{self.prefix}.ended", encode_run_ends(ends))
        except nats.errors.Error as exc:
            raise BusError(
                f"NATS bus {self.url}: publishing {len(ends)} run end(s) failed: {exc}"
            ) from None

    def task_subject(self, queue: str, priority: Priority) -> str:
        return f"{self.prefix}.tasks.{queue_token(queue)}.{priority.value}"

    async def _publish(self, items: Any) -> None:
        """Publish in order (one connection keeps it) and wait for every stream ack."""
        js = self.js
        acks = []
        try:
            for subject, data, headers in items:
                try:
                    payload = orjson.dumps(data)
                except TypeError as exc:
                    raise BusError(f"a message for {subject} cannot be encoded: {exc}") from None
                acks.append(await js.publish_async(subject, payload, headers=dict(headers) or None))
            async with asyncio.timeout(PUBLISH_TIMEOUT):
                await asyncio.gather(*acks)
        except (nats.errors.Error, TimeoutError) as exc:
            for ack in acks:
                ack.cancel()
            raise BusError(f"NATS bus {self.url}: publishing failed: {exc!r}") from None

    # -- consumer ---------------------------------------------------------------

    async def consume_tasks(
        self, queues: Collection[str] | None = None, *, prefetch: int, worker: str | None = None
    ) -> AsyncGenerator[Delivery[DispatchTask], None]:
        check_count("prefetch", prefetch)
        wanted = None if queues is None else list(queues)
        reader = TaskReader(self, wanted, prefetch)
        presence = nats_presence.Presence(self, wanted, worker)
        asked = cancels_asked()
        await reader.start()
        try:
            await presence.start()
            raise_dropped_cancel(asked)  # one nats-py dropped as the reader started
            while True:
                yield await reader.next()
        finally:
            await unstoppable(presence.stop, reader.close)

    async def consume_events(
        self, partitions: Collection[int] | None = None, *, max_batch: int
    ) -> AsyncGenerator[EventBatch, None]:
        check_count("max_batch", max_batch)
        reader = EventReader(self, self._wanted(partitions), max_batch)
        asked = cancels_asked()
        await reader.start()
        try:
            raise_dropped_cancel(asked)  # one nats-py dropped during the claim or the setup
            while True:
                yield await reader.next()
        finally:
            await unstoppable(reader.close)

    def consume_control(self) -> Stream[Control]:
        if self._nc is None:  # the bus's own subscription feeds every control stream
            raise BusError(f"the NATS bus {self.url} is not open: await bus.open() first")
        return self._controls.stream()

    async def run_ends(self) -> Stream[RunEnded]:
        async with self._ends_lock:
            if self._ends_sub is None:
                subject = f"{self.prefix}.ended"
                sub = None
                try:
                    sub = await self.nc.subscribe(subject, cb=self._on_ends)
                    await self._proven(subject)  # the server has it: nothing is missed
                except (nats.errors.Error, TimeoutError) as exc:
                    if sub is not None:  # not proven: the next call subscribes afresh
                        with contextlib.suppress(nats.errors.Error):
                            await sub.unsubscribe()
                    raise BusError(
                        f"NATS bus {self.url}: subscribing to run ends failed: {exc!r}"
                    ) from None
                self._ends_sub = sub
            return self._ends.stream()

    async def queue_stats(self) -> list[QueueStats]:
        """Over the queues with tasks in the stream, a consumer, or a reader: ``depth`` is
        the queue x priority consumer's ``num_pending`` (the subject's message count
        before any consumer exists), ``held`` its ``num_ack_pending`` (a nacked task, or
        one whose lease ran out, stays held until the server delivers it again),
        ``oldest_age`` from the server's timestamp of the first undelivered message, and
        ``consumers`` the open readers of the queue by their presence keys
        (``nats_presence``: a killed one counts for up to ``presence_ttl``, the lease
        and at most 10 s)."""
        return await nats_presence.queue_stats(self)

    async def worker_beats(self) -> list[WorkerBeat]:
        """From the KV bucket ``<prefix>_beats`` (the time of each renewal by the reader's
        host clock); ``live`` by the reader's presence keys, as ``queue_stats`` counts it
        (``nats_presence``)."""
        return await nats_presence.worker_beats(self)

    def _wanted(self, partitions: Collection[int] | None) -> list[int]:
        return wanted_partitions(partitions, self.partitions)

    # -- partition locks --------------------------------------------------------

    @property
    def lock_ttl(self) -> float:
        return self._lock_ttl

    async def claim(self, partitions: list[int]) -> dict[int, int]:
        """Hold the lock of each partition (all or none); their revisions."""
        kv = self._kv
        assert kv is not None
        held: dict[int, int] = {}
        for index in partitions:
            try:
                held[index] = await kv.create(f"p{index}", self.owner.encode())
            except nats.js.errors.KeyWrongLastSequenceError:
                await self.release(held)
                raise BusError(
                    f"partition {index} is consumed by another consumer already: "
                    "close it first, or consume other partitions"
                ) from None
        return held

    async def renew(self, held: dict[int, int]) -> None:
        kv = self._kv
        assert kv is not None
        for index, revision in list(held.items()):
            try:
                held[index] = await kv.update(f"p{index}", self.owner.encode(), last=revision)
            except nats.js.errors.KeyWrongLastSequenceError:
                held[index] = await self._take_back(kv, index)

    async def _take_back(self, kv: KeyValue, index: int) -> int:
        """The lock's revision moved without this consumer: it expired while the link was
        down, or a broker that crashed lost its last renewal. Still ours, or nobody's: hold
        it again (nobody read the partition meanwhile); someone else's: it is lost."""
        key, me = f"p{index}", self.owner.encode()
        try:
            entry = await kv.get(key)
        except nats.js.errors.KeyNotFoundError:
            entry = None
        try:
            if entry is not None and entry.value == me and entry.revision is not None:
                return await kv.update(key, me, last=entry.revision)
            if entry is None or not entry.value:
                return await kv.create(key, me)
        except nats.js.errors.KeyWrongLastSequenceError:
            pass
        raise BusError(
            f"partition {index} was lost (its lock expired and another consumer "
            "took it): this consumer stops reading it"
        ) from None

    async def release(self, held: dict[int, int]) -> None:
        kv = self._kv
        if kv is None:
            return
        for index, revision in held.items():
            with contextlib.suppress(nats.errors.Error):
                await kv.delete(f"p{index}", last=revision)
        held.clear()

    # -- control and dead letters -----------------------------------------------

    async def _on_control(self, msg: Msg) -> None:
        try:
            message = _control_from(orjson.loads(msg.data))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            await self.dead_letter(msg, f"malformed control message: {exc}")
            return
        if message is not None:
            self._controls.put((message,))

    async def _proven(self, subject: str) -> None:
        """Return once the server has this connection's subscription to ``subject``: a
        probe published after it on the same connection came back through it."""
        token = uuid.uuid4().hex
        probe = self._probes[token] = asyncio.get_running_loop().create_future()
        try:
            await self.nc.publish(subject, b"", headers={PROBE: token})
            async with asyncio.timeout(PROBE_TIMEOUT):
                await probe
        finally:
            del self._probes[token]

    def _probed(self, msg: Msg) -> bool:
        """Whether ``msg`` is a probe (`_proven`): this bus's own is answered, any other
        (another process's) ignored."""
        token = msg.headers.get(PROBE) if msg.headers else None
        if token is None:
            return False
        probe = self._probes.get(token)
        if probe is not None and not probe.done():
            probe.set_result(None)
        return True

    async def _on_ends(self, msg: Msg) -> None:
        if self._probed(msg):
            return
        try:
            ends = decode_run_ends(msg.data)
        except MalformedEnds as exc:
            log.debug(
                "NATS bus %s: dropped a run-end message %r: %s", self.url, msg.data[:200], exc
            )
            return
        self._ends.put(ends)

    async def dead_letter(self, msg: Msg | api.RawStreamMsg, reason: str) -> None:
        """Log a message that cannot be delivered and keep it in the dead stream."""
        subject = msg.subject or ""
        where = subject.removeprefix(f"{self.prefix}.")
        seq = getattr(msg, "seq", None) or _stream_seq(msg)
        log.error("NATS bus %s: %s (subject %s, stream seq %s)", self.url, reason, subject, seq)
        headers = {k: v for k, v in (msg.headers or {}).items() if not k.startswith("Nats-")}
        headers[DEAD_REASON] = reason
        headers["Tideflow-Dead-Subject"] = subject
        try:
            await self.js.publish(f"{self.prefix}.dead.{where}", msg.data or b"", headers=headers)
        except nats.errors.Error as exc:
            log.error("NATS bus %s: could not keep the dead message: %s", self.url, exc)

    async def _on_max_deliveries(self, msg: Msg) -> None:
        """A task past ``max_deliver``: the server stops delivering it (and says so
        here); move it from the queue to the dead stream for an operator."""
        try:
            advisory = orjson.loads(msg.data)
            stream, seq = advisory["stream"], int(advisory["stream_seq"])
            raw = await self.js.get_msg(stream, seq)
            await self.dead_letter(
                raw, f"delivered {advisory.get('deliveries')} times without an ack (max_deliver)"
            )
            await self.js.delete_msg(stream, seq)
        except (nats.errors.Error, KeyError, ValueError, orjson.JSONDecodeError) as exc:
            log.error("NATS bus %s: a max-deliveries advisory failed: %s", self.url, exc)


def _split(item: Any) -> tuple[Any, Headers]:
    if isinstance(item, Message):
        return item.body, item.headers
    return item, {}


def _stream_seq(msg: Any) -> int | None:
    try:
        return int(msg.metadata.sequence.stream)
    except Exception:
        return None


def _control_from(data: dict[str, Any]) -> Control | None:
    """A control message; None for a ``forget``, which versions before rounds sent when a
    run was retried (rounds do its job now); a cancel without ``round`` is round 0, one
    without ``compensation`` names an action's attempt."""
    if data["type"] == "cancel":
        return CancelAttempt(
            run_id=str(data["run_id"]),
            step_key=str(data["step_key"]),
            attempt=int(data["attempt"]),
            round=int(data.get("round", 0)),
            compensation=bool(data.get("compensation", False)),
        )
    if data["type"] == "forget":
        return None
    raise ValueError(f"unknown control type {data['type']!r}")


def check_count(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BusError(f"{name} must be a whole number of at least 1, got {value!r}")


# -- control -------------------------------------------------------------------


# -- URLs ----------------------------------------------------------------------


def server_urls(url: str) -> list[str]:
    """``nats://a:4222,b:4222?…`` -> the servers nats-py connects to (no query)."""
    parts = urlsplit(url)
    userinfo, _, hosts = parts.netloc.rpartition("@")
    auth = f"{userinfo}@" if userinfo else ""
    return [f"{parts.scheme}://{auth}{host}" for host in hosts.split(",") if host] or [
        f"{parts.scheme}://127.0.0.1:4222"
    ]


def from_url(url: str) -> NatsBus:
    """``nats://host:port?prefix=…&partitions=…&lease=…&max_deliver=…`` (or ``tls://``)."""
    parts = urlsplit(url)
    if parts.path not in ("", "/"):
        raise BusError(f"bus URL {url!r}: a NATS URL has no path; options go in the ?query")
    try:
        _ = parts.port
    except ValueError:
        raise BusError(f"bus URL {url!r}: the port is not a number") from None
    options: dict[str, Any] = {}
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key not in _OPTIONS:
            raise BusError(
                f"bus URL {url!r}: unknown option {key!r}; the options are {', '.join(_OPTIONS)}"
            )
        try:
            options[key] = (
                value if key == "prefix" else float(value) if key == "lease" else int(value)
            )
        except ValueError:
            raise BusError(f"bus URL {url!r}: {key}={value!r} is not a number") from None
    return NatsBus(url.split("?", 1)[0], **options)
