"""The Bus port: moves task messages to workers, events to the engine, cancels to workers.

At-least-once, shaped like a broker (dramatiq's Broker / Consumer / MessageProxy):

- a **producer** publishes task messages (by queue and priority), events (into
  the partition of their run) and control messages (cancel an attempt);
- a **consumer** receives *deliveries*. A delivery holds a lease: it is gone only
  after ``ack()``; ``nack(delay)`` hands it back to be delivered again after
  ``delay`` seconds; ``extend()`` renews the lease (the heartbeat of a long task);
  one that is neither acknowledged nor extended within its lease is delivered
  again. ``prefetch`` bounds the unacknowledged task deliveries a consumer holds.

Task queues are named; within the queues a consumer reads, ``high`` goes before
``normal`` before ``low`` with a fixed weighting (``PRIORITY_CYCLE``: 6 high, 3
normal, 1 low in every 10 deliveries while all three wait), so high is never
starved behind low and low still progresses under a steady high load.

Events are partitioned by run id (``partition_of``): a partition is consumed by
one consumer at a time, in publication order, so one engine applies a run's events
and applies them in order. A redelivered event may come after newer ones of its
run; the engine tolerates that (event ids and the core's staleness checks).

Control messages are fanned out to every control consumer, at most once: a lost
cancel only lets an attempt run to its end, whose result the engine then ignores.

Run ends (``RunEnded``: a run reached a terminal state) are fanned out the same way on a
channel of their own, which only clients subscribe to (workers never receive them): the
engine announces the runs a committed batch ended, and a cluster client's ``wait`` wakes
on them instead of polling the store. At most once as well: a waiter also reads the
store every few seconds, so a lost one costs latency, not a result.

How the methods map onto real brokers (the next backends):

============================  ===================================  ==================================
port                          Redis Streams                        NATS JetStream
============================  ===================================  ==================================
``publish_tasks``             ``XADD tasks:<queue>:<priority>``     publish ``tasks.<queue>.<priority>``
``consume_tasks``             ``XREADGROUP COUNT <free prefetch>``  pull consumer ``fetch(free)``
``Delivery.ack``              ``XACK``                              ``msg.ack()``
``ack_tasks``                 one script: ``XACK`` + ``XDEL`` each  ``msg.ack()`` each, one flush
``Delivery.nack(delay)``      ``XACK`` + delayed re-``XADD``        ``msg.nak(delay)``
``Delivery.extend``           ``XCLAIM … JUSTID`` (idle reset)      ``msg.in_progress()``
lease expiry                  ``XAUTOCLAIM min-idle=<lease>``       ``AckWait=<lease>``
``publish_events``            ``XADD events:<partition>``           publish ``events.<partition>``
``consume_events``            one group, the owned partitions       a consumer per owned partition
``publish_control``           ``PUBLISH control``                   core NATS subject ``control``
``publish_run_ends``          ``PUBLISH ended``                     core NATS subject ``ended``
``worker_beats``              sorted set + hash ``beats``           KV bucket ``<prefix>_beats``
============================  ===================================  ==================================

A ``consume_tasks`` reader opened with a ``worker`` name (a worker's ``host/pid``, what
its ``task_started`` events carry) beats while it is open: each renewal of its presence
(what ``queue_stats`` counts as a consumer) records the time, in a record that outlives
the reader by ``BEATS_KEPT`` seconds when its process dies and is deleted when it closes.
``worker_beats`` lists them: a worker whose reader is no longer live stopped at its last
beat (`tideflow runs why` says so of the attempt it held).
"""

from __future__ import annotations

import zlib
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from tideflow.errors import BusError
from tideflow.model.commands import DispatchTask
from tideflow.model.events import Event
from tideflow.model.plan import Priority

Headers = Mapping[str, str]
"""Message headers (W3C ``traceparent`` / ``tracestate`` travel here)."""

NO_HEADERS: Headers = {}
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
"""The W3C trace-context headers (tideflow.observability.tracing puts them on messages)."""

Body = TypeVar("Body", DispatchTask, Event)
Item = TypeVar("Item", covariant=True)


class Stream(Protocol[Item]):
    """What a consumer returns: an async iterator that can be closed (an async generator
    fits). Closing it hands back what it holds and ends its claims."""

    def __aiter__(self) -> AsyncIterator[Item]: ...

    def __anext__(self) -> Awaitable[Item]: ...

    def aclose(self) -> Awaitable[None]: ...


DEFAULT_LEASE = 30.0
"""Seconds a delivery stays with its consumer without ``ack``, ``nack`` or ``extend``."""

DEFAULT_PARTITIONS = 16

PRIORITY_CYCLE: tuple[Priority, ...] = (
    Priority.HIGH,
    Priority.NORMAL,
    Priority.HIGH,
    Priority.HIGH,
    Priority.NORMAL,
    Priority.HIGH,
    Priority.LOW,
    Priority.HIGH,
    Priority.NORMAL,
    Priority.HIGH,
)
"""The priority preferred for each of ten deliveries in turn; when the preferred one
has nothing waiting, the highest priority that has something goes instead."""


@dataclass(frozen=True, slots=True)
class Message(Generic[Body]):
    """A body with headers, as a producer hands it over (a bare body has no headers)."""

    body: Body
    headers: Headers = field(default_factory=dict)


def with_headers(events: Sequence[Event], headers: Headers) -> Sequence[Event | Message[Event]]:
    """``events`` to publish, each with ``headers`` (as they are when there are none)."""
    return [Message(event, headers) for event in events] if headers else events


@dataclass(frozen=True, slots=True, kw_only=True)
class CancelAttempt:
    """Stop this attempt wherever it runs (``CancelTask``); drop it if it is still queued.

    An attempt is named by its run, step instance, ``round`` (the run's operator retries
    before it: ``DispatchTask.round``) and number, since a retry numbers attempts from 1
    again: a cancel remembered for round 0's attempt 1 leaves round 1's alone, whichever
    of the cancel and the task reaches a worker first. ``compensation`` tells an attempt
    of the step's compensation from the action's attempt of the same number."""

    run_id: str
    step_key: str
    attempt: int
    round: int = 0
    compensation: bool = False


Control = CancelAttempt
"""What the control channel carries."""


@dataclass(frozen=True, slots=True)
class RunEnded:
    """A run reached a terminal state (``RUN_TERMINAL``): what the run-end channel carries.
    ``status`` is the state it ended in (``succeeded``, ``failed``, …)."""

    run_id: str
    status: str


def partition_of(run_id: str, partitions: int) -> int:
    """The event partition of a run: stable across processes and backends."""
    return zlib.crc32(run_id.encode()) % partitions if partitions > 1 else 0


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueStats:
    """One queue at one priority, as ``Bus.queue_stats`` sees it at one moment."""

    queue: str
    priority: Priority
    depth: int
    """Tasks waiting: published (or handed back) and not delivered."""
    held: int
    """Tasks delivered and not settled yet (a lease runs for each)."""
    oldest_age: float | None
    """Seconds since the oldest waiting task was put on the queue; None when none waits."""
    consumers: int
    """Open ``consume_tasks`` streams reading this queue (every priority of a queue has
    the same count); what a backend can see of them is in its ``queue_stats``."""


PRESENCE = (1.0, 10.0)
"""Seconds at least and at most a task reader's presence outlives its last renewal (a
killed reader counts as a consumer that long): ``presence_ttl``."""


def presence_ttl(lease: float) -> float:
    """How long a reader's presence outlives its last renewal on a bus with this delivery
    lease: the lease (a dead worker is seen gone about when its task comes again), within
    ``PRESENCE`` (renewed every third of it, so never more often than every 1/3 s).
    Default lease: 10 s."""
    low, high = PRESENCE
    return min(max(lease, low), high)


BEATS_KEPT = 86_400.0
"""Seconds the last beat of a reader that stopped without closing is kept (a day)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerBeat:
    """One ``consume_tasks`` reader opened with a ``worker`` name, as ``Bus.worker_beats``
    sees it at one moment."""

    worker: str
    """The name it was opened with (a worker's ``host/pid``)."""
    queues: tuple[str, ...] | None
    """The queues it reads, sorted (None: every queue)."""
    last_beat: float
    """Epoch seconds of its last heartbeat (the last renewal of its presence)."""
    live: bool
    """Whether its presence has not lapsed: it counts among ``queue_stats``' consumers. A
    reader that is not live stopped without closing (its process died, or lost the bus)."""


def beat_of(record: bytes | str, *, live: bool, at: float | None = None) -> WorkerBeat | None:
    """A beat from the JSON record a broker keeps of it (``{"worker", "queues"}``, and
    ``"at"``, epoch seconds, unless the broker's own score gives ``at``); None for a record
    that is not one (damaged, or written by another version): it is left out, not fatal."""
    import orjson

    try:
        data = orjson.loads(record)
        queues = data.get("queues")
        return WorkerBeat(
            worker=str(data["worker"]),
            queues=None if queues is None else tuple(str(q) for q in queues),
            last_beat=float(data["at"] if at is None else at),
            live=live,
        )
    except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError):
        return None


def unserved(rows: Sequence[QueueStats]) -> list[str]:
    """The queues with tasks waiting and no consumer."""
    return sorted({r.queue for r in rows if r.depth and not r.consumers})


class Delivery(ABC, Generic[Body]):
    """One delivered message, held under a lease until it is settled."""

    __slots__ = ()

    body: Body
    headers: Headers
    deliveries: int
    """How many times this message has been delivered (1 the first time)."""

    @abstractmethod
    async def ack(self) -> None:
        """Done with it: the message is gone."""

    @abstractmethod
    async def nack(self, delay: float = 0.0) -> None:
        """Not done: deliver it again after ``delay`` seconds."""

    @abstractmethod
    async def extend(self) -> None:
        """Still working on it: the lease starts over."""


class EventBatch(ABC):
    """Events delivered together (in order within each run), settled together: the
    engine acknowledges a batch after it committed it, and may hand back the events of
    some runs (``nack(delay, runs)``) first."""

    __slots__ = ()

    events: list[Event]

    @abstractmethod
    def headers(self, index: int) -> Headers:
        """The headers of ``events[index]``."""

    @abstractmethod
    async def ack(self) -> None:
        """Acknowledge every event of the batch not handed back."""

    @abstractmethod
    async def nack(self, delay: float = 0.0, runs: Collection[str] | None = None) -> None:
        """Deliver the events of ``runs`` (all when None) again after ``delay`` seconds."""

    @abstractmethod
    async def extend(self) -> None:
        """The lease of the batch starts over."""


class Producer(ABC):
    @abstractmethod
    async def publish_tasks(self, tasks: Sequence[DispatchTask | Message[DispatchTask]]) -> None:
        """Queue task messages for workers, each on its ``queue`` at its ``priority``."""

    @abstractmethod
    async def publish_events(self, events: Sequence[Event | Message[Event]]) -> None:
        """Publish events, each into the partition of its run."""

    @abstractmethod
    async def publish_control(self, message: Control) -> None:
        """Tell every worker (``CancelAttempt``)."""

    @abstractmethod
    async def publish_run_ends(self, ends: Sequence[RunEnded]) -> None:
        """Tell every open ``run_ends`` stream, of any process, that these runs ended (one
        message for them all on a broker; at most once)."""

    @property
    def run_ends_heard(self) -> bool:
        """Whether a run end published now may reach a ``run_ends`` stream: a broker cannot
        know who subscribed in other processes (True); the in-process bus knows whether a
        stream is open (so an embedded engine with no cluster client pays nothing)."""
        return True


class Consumer(ABC):
    @abstractmethod
    def consume_tasks(
        self, queues: Collection[str] | None = None, *, prefetch: int, worker: str | None = None
    ) -> Stream[Delivery[DispatchTask]]:
        """Task deliveries from ``queues`` (None: every queue), by priority; at most
        ``prefetch`` unsettled at a time. Closing the iterator hands back what it holds.
        A reader named by ``worker`` beats while it is open (``Bus.worker_beats``)."""

    async def ack_tasks(self, deliveries: Sequence[Delivery[DispatchTask]]) -> None:
        """Acknowledge task deliveries together, each as its ``ack`` would (one settled
        already is left alone); they may come from several ``consume_tasks`` streams of
        this bus. A broker does it in one round trip (``Bus.batching_pays``); this default
        acknowledges each in turn."""
        for delivery in deliveries:
            await delivery.ack()

    @abstractmethod
    def consume_events(
        self, partitions: Collection[int] | None = None, *, max_batch: int
    ) -> Stream[EventBatch]:
        """Batches of at most ``max_batch`` events from ``partitions`` (None: all), which
        no other consumer holds while this one is open."""

    @abstractmethod
    def consume_control(self) -> Stream[Control]:
        """Every control message published from this call on, until it is closed."""

    @abstractmethod
    async def run_ends(self) -> Stream[RunEnded]:
        """Every run end published from the moment this returns on, until the stream is
        closed. A broker subscribes at the first call (so that a process that never asks,
        a worker or a server, receives none) and returns once the broker has confirmed
        it; what is published while the link is down is lost (at most once). A message
        that cannot be read is dropped (logged at DEBUG), never the stream."""


class Bus(Producer, Consumer):
    """A producer and a consumer on one broker connection."""

    partitions: int = DEFAULT_PARTITIONS
    lease: float = DEFAULT_LEASE
    batching_pays: bool = False
    """Whether one call that publishes, or acknowledges, many messages costs less than a
    call for each: true of a broker over the network (one round trip for all). The worker
    gathers the outcomes and acknowledgements of the attempts that end in one turn of the
    event loop only on such a bus; in process, gathering them costs more than it saves."""

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    @abstractmethod
    async def queue_stats(self) -> list[QueueStats]:
        """Every task queue this bus knows (published to, or read), at each priority
        (high, normal, low), sorted by queue name."""

    @abstractmethod
    async def worker_beats(self) -> list[WorkerBeat]:
        """The readers opened with a ``worker`` name that are open, or stopped without
        closing in the last ``BEATS_KEPT`` seconds, sorted by worker then last beat."""


def wanted_partitions(partitions: Collection[int] | None, count: int) -> list[int]:
    """The partitions a ``consume_events(partitions)`` call asks for, checked against the
    bus's ``count`` (None: all of them), sorted and without repeats."""
    wanted = range(count) if partitions is None else sorted(set(partitions))
    if not wanted:
        raise BusError("consume_events needs at least one partition")
    for index in wanted:
        if isinstance(index, bool) or not isinstance(index, int):
            raise BusError(f"a partition is a whole number, got {index!r}")
        if not 0 <= index < count:
            raise BusError(
                f"partition {index} does not exist: this bus has partitions 0 to {count - 1}"
            )
    return list(wanted)


__all__ = [
    "BEATS_KEPT",
    "DEFAULT_LEASE",
    "DEFAULT_PARTITIONS",
    "NO_HEADERS",
    "PRESENCE",
    "PRIORITY_CYCLE",
    "TRACEPARENT",
    "TRACESTATE",
    "Bus",
    "CancelAttempt",
    "Consumer",
    "Control",
    "Delivery",
    "EventBatch",
    "Headers",
    "Message",
    "Producer",
    "QueueStats",
    "RunEnded",
    "Stream",
    "WorkerBeat",
    "beat_of",
    "partition_of",
    "presence_ttl",
    "wanted_partitions",
    "with_headers",
]
