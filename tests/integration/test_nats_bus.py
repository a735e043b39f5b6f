"""What the NATS JetStream bus does beyond the bus contract: its URL, its errors, and
the dead-letter stream (malformed messages, tasks past ``max_deliver``), against the
real server (``nats_url``). Each test has its own prefix and deletes what it made."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
import pytest
from tests.contract.test_bus_contract import stop

from tideflow.bus import open_bus
from tideflow.bus.base import Message, partition_of
from tideflow.bus.closing import cancel_and_wait
from tideflow.errors import BusError
from tideflow.model.codec import command_to_data
from tideflow.model.commands import DispatchTask
from tideflow.model.events import SignalReceived
from tideflow.model.plan import Priority

nats_bus = pytest.importorskip("tideflow.bus.backends.nats")
nats_pull = pytest.importorskip("tideflow.bus.backends.nats_pull")
NatsBus = nats_bus.NatsBus
delete_prefix = pytest.importorskip("tideflow.testing.nats").delete_prefix
WITHIN = 5.0


def task(n: int, queue: str = "default") -> DispatchTask:
    return DispatchTask(
        run_id=f"run-{n}",
        step_key=f"s{n}",
        step_id=f"s{n}",
        type="noop",
        config={},
        input={"n": n},
        attempt=1,
        idempotency_key=f"run-{n}:s{n}:1",
        timeout=None,
        queue=queue,
    )


@pytest.fixture
async def make_bus(nats_url: str) -> AsyncIterator[Callable[..., Awaitable[Any]]]:
    prefix = f"it-{uuid.uuid4().hex[:12]}"
    opened: list[Any] = []

    async def make(**options: Any) -> Any:
        bus = NatsBus(nats_url, prefix=prefix, **options)
        await bus.open()
        opened.append(bus)
        return bus

    yield make
    try:
        if opened:
            await delete_prefix(opened[0])
    finally:
        for bus in opened:
            await bus.close()


async def take(sub: Any, count: int) -> list[Any]:
    """The next ``count`` messages of a core subscription (then it is dropped)."""
    try:
        return [await sub.next_msg(timeout=WITHIN) for _ in range(count)]
    finally:
        await sub.unsubscribe()


async def emptied(bus: Any, stream: str) -> None:
    """Wait (bounded) until ``stream`` holds no message: an ack, or the delete after a
    dead letter is kept, reaches the stream a moment after the client sent it."""
    deadline = asyncio.get_running_loop().time() + WITHIN
    while (count := (await bus.js.stream_info(stream)).state.messages) != 0:
        assert asyncio.get_running_loop().time() < deadline, f"{stream} still holds {count}"
        await asyncio.sleep(0.01)


# -- URLs ----------------------------------------------------------------------


def test_open_bus_builds_the_nats_bus_with_its_options() -> None:
    bus = open_bus("nats://127.0.0.1:4222?prefix=blue&partitions=8&lease=2.5&max_deliver=5")
    assert isinstance(bus, NatsBus)
    assert (bus.prefix, bus.partitions, bus.lease, bus.max_deliver) == ("blue", 8, 2.5, 5)
    assert (bus.tasks_stream, bus.events_stream, bus.dead_stream) == (
        "blue_tasks",
        "blue_events",
        "blue_dead",
    )
    assert isinstance(open_bus("tls://nats.example:4222"), NatsBus)
    assert nats_bus.server_urls("nats://u:p@a:1,b:2?prefix=x") == [
        "nats://u:p@a:1",
        "nats://u:p@b:2",
    ]
    assert nats_bus.server_urls("nats://") == ["nats://127.0.0.1:4222"]


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("nats://h:4222?partition=3", r"unknown option 'partition'; the options are prefix"),
        ("nats://h:4222?lease=soon", "lease='soon' is not a number"),
        ("nats://h:4222?partitions=two", "partitions='two' is not a number"),
        ("nats://h:4222?lease=0", "lease must be a positive number"),
        ("nats://h:4222?partitions=0", "partitions must be a whole number"),
        ("nats://h:4222?max_deliver=1", "max_deliver must be at least 2"),
        ("nats://h:4222?prefix=a.b", "prefix 'a.b': use letters, digits"),
        ("nats://h:4222/x", "a NATS URL has no path"),
        ("nats://h:port", "the port is not a number"),
    ],
)
def test_open_bus_refuses_a_bad_nats_url(url: str, message: str) -> None:
    with pytest.raises(BusError, match=message):
        open_bus(url)


def test_without_nats_py_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [
        m
        for m in sys.modules
        if m == "nats" or m.startswith(("nats.", "tideflow.bus.backends.nats"))
    ]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "nats", None)  # `import nats` fails as if not installed
    with pytest.raises(BusError, match=r"needs nats-py: pip install 'tideflow\[nats\]'"):
        open_bus("nats://127.0.0.1:4222")


async def test_a_server_that_does_not_answer_is_a_bus_error() -> None:
    bus = NatsBus("nats://127.0.0.1:1")
    with pytest.raises(BusError, match=r"cannot connect to NATS at nats://127.0.0.1:1"):
        await bus.open()
    with pytest.raises(BusError, match="is not open"):
        await bus.publish_tasks([task(1)])


# -- queues ------------------------------------------------------------------


async def test_a_worker_for_every_queue_finds_a_queue_made_while_it_waits(
    make_bus: Callable[..., Awaitable[Any]],
) -> None:
    bus = await make_bus()
    await bus.publish_tasks([task(1)])
    async with contextlib.aclosing(bus.consume_tasks(prefetch=1)) as tasks:
        await (await asyncio.wait_for(anext(tasks), WITHIN)).ack()
        waiting = asyncio.ensure_future(anext(tasks))  # nothing queued: it waits
        other = bus.__class__(bus.url, prefix=bus.prefix)
        await other.open()
        try:
            await other.publish_tasks([task(2, queue="gpu.big one"), task(3, queue="io")])
        finally:
            await other.close()
        first = await asyncio.wait_for(waiting, WITHIN)
        await first.ack()
        second = await asyncio.wait_for(anext(tasks), WITHIN)
        await second.ack()
    assert {first.body.queue, second.body.queue} == {"gpu.big one", "io"}
    assert f"{bus.prefix}.tasks.=6770752e626967206f6e65.normal" == bus.task_subject(
        "gpu.big one", Priority.NORMAL
    )


async def test_a_queue_announced_while_the_reader_asks_is_not_left_for_the_next_look(
    make_bus: Callable[..., Awaitable[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The announcement's wake goes to the round trip the reader is in; the reader must
    still see the queue before it waits (seen in CI: it waited for the next look)."""
    readers = pytest.importorskip("tideflow.bus.backends.nats_readers")
    monkeypatch.setattr(readers, "LINGER", 60.0)  # the next look is far past WITHIN
    bus = await make_bus()
    other = await make_bus()
    await bus.publish_tasks([task(1)])
    announced = asyncio.Event()
    armed = asyncio.Event()
    on_news, pick = readers.TaskReader._on_news, readers.TaskReader._pick

    async def heard(self: Any, msg: Any) -> None:
        await on_news(self, msg)
        announced.set()

    async def asked(self: Any, free: int) -> bool:
        if armed.is_set():  # the announcement comes while this pick is on its way
            armed.clear()
            await other.publish_tasks([task(2, queue="io")])
            await asyncio.wait_for(announced.wait(), WITHIN)
        return bool(await pick(self, free))

    monkeypatch.setattr(readers.TaskReader, "_on_news", heard)
    monkeypatch.setattr(readers.TaskReader, "_pick", asked)
    async with contextlib.aclosing(bus.consume_tasks(prefetch=1)) as tasks:
        await (await asyncio.wait_for(anext(tasks), WITHIN)).ack()
        armed.set()
        delivered = await asyncio.wait_for(anext(tasks), WITHIN)
        await delivered.ack()
    assert delivered.body == task(2, queue="io")


async def test_a_queue_whose_announcement_was_lost_is_found_by_the_next_look(
    make_bus: Callable[..., Awaitable[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    readers = pytest.importorskip("tideflow.bus.backends.nats_readers")
    monkeypatch.setattr(readers, "LINGER", 0.5)
    bus = await make_bus()
    await bus.publish_tasks([task(1)])
    async with contextlib.aclosing(bus.consume_tasks(prefetch=1)) as tasks:
        await (await asyncio.wait_for(anext(tasks), WITHIN)).ack()
        waiting = asyncio.ensure_future(anext(tasks))
        other = await make_bus()

        async def lost(queue: str) -> None:
            return None  # the announcement never reaches anyone

        monkeypatch.setattr(other, "_announce", lost)
        await other.publish_tasks([task(2, queue="io")])
        delivered = await asyncio.wait_for(waiting, WITHIN)
        await delivered.ack()
    assert delivered.body == task(2, queue="io")


async def test_a_backlog_is_taken_in_a_few_pull_requests_shared_out_by_priority(
    make_bus: Callable[..., Awaitable[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A consumer with room for many tasks asks for them together: not one pull request
    (a round trip each) per task."""
    bus = await make_bus()
    high = [dataclasses.replace(task(n), priority=Priority.HIGH) for n in range(20)]
    await bus.publish_tasks([task(n) for n in range(100, 140)] + high)
    requests: list[int] = []
    request = nats_pull.Puller.request

    async def counted(self: Any, lane: Any, batch: int, *, linger: float | None = None) -> None:
        requests.append(batch)
        await request(self, lane, batch, linger=linger)

    monkeypatch.setattr(nats_pull.Puller, "request", counted)
    seen: list[Priority] = []
    async with contextlib.aclosing(bus.consume_tasks(prefetch=60)) as tasks:
        held = [await asyncio.wait_for(anext(tasks), WITHIN) for _ in range(60)]
        seen = [d.body.priority for d in held]
        for delivery in held:
            await delivery.ack()
    assert len(requests) <= 6, requests
    assert seen.count(Priority.HIGH) == 20 and seen.count(Priority.NORMAL) == 40


# -- dead letters --------------------------------------------------------------


async def test_a_malformed_task_goes_to_the_dead_subject_and_the_next_one_comes(
    make_bus: Callable[..., Awaitable[Any]],
) -> None:
    bus = await make_bus()
    dead = await bus.nc.subscribe(f"{bus.prefix}.dead.>")
    subject = bus.task_subject("default", Priority.NORMAL)
    await bus.js.publish(subject, b"{not json", headers={"traceparent": "00-ab-cd-01"})
    wrong = {**command_to_data(task(2)), "command": "NoSuchCommand"}
    await bus.js.publish(subject, orjson.dumps(wrong))
    await bus.publish_tasks([task(3)])
    async with contextlib.aclosing(bus.consume_tasks(prefetch=5)) as tasks:
        delivery = await asyncio.wait_for(anext(tasks), WITHIN)
        assert delivery.body == task(3)
        await delivery.ack()
    first, second = await take(dead, 2)
    assert first.subject == f"{bus.prefix}.dead.tasks.default.normal"
    assert first.data == b"{not json"
    assert first.headers["traceparent"] == "00-ab-cd-01"
    assert first.headers["Tideflow-Dead-Reason"].startswith("malformed task message")
    assert first.headers["Tideflow-Dead-Subject"] == subject
    assert "NoSuchCommand" in second.headers["Tideflow-Dead-Reason"]
    # the malformed ones were acknowledged: the queue empties, the dead stream keeps them
    await emptied(bus, bus.tasks_stream)
    assert (await bus.js.stream_info(bus.dead_stream)).state.messages == 2


async def test_a_malformed_event_goes_to_the_dead_subject(
    make_bus: Callable[..., Awaitable[Any]],
) -> None:
    bus = await make_bus(partitions=1)
    dead = await bus.nc.subscribe(f"{bus.prefix}.dead.>")
    await bus.js.publish(f"{bus.prefix}.events.0", orjson.dumps({"kind": "nope"}))
    good = SignalReceived(event_id="e1", run_id="r", time=0.0, name="go", payload=1)
    await bus.publish_events([Message(good, {"traceparent": "t"})])
    async with contextlib.aclosing(bus.consume_events(max_batch=10)) as batches:
        batch = await asyncio.wait_for(anext(batches), WITHIN)
        assert batch.events == [good]
        await batch.ack()
    [message] = await take(dead, 1)
    assert message.subject == f"{bus.prefix}.dead.events.0"
    assert "unknown type 'nope'" in message.headers["Tideflow-Dead-Reason"]


async def test_a_task_past_max_deliver_moves_to_the_dead_stream(
    make_bus: Callable[..., Awaitable[Any]],
) -> None:
    bus = await make_bus(max_deliver=2)
    dead = await bus.nc.subscribe(f"{bus.prefix}.dead.>")
    await bus.publish_tasks([Message(task(1), {"traceparent": "t1"})])
    async with contextlib.aclosing(bus.consume_tasks(prefetch=1)) as tasks:
        for expected in (1, 2):
            delivery = await asyncio.wait_for(anext(tasks), WITHIN)
            assert delivery.deliveries == expected
            await delivery.nack()
        waiting = asyncio.ensure_future(anext(tasks))  # its request meets the advisory
        [message] = await take(dead, 1)
        assert not waiting.done()
        await stop(waiting)
    assert message.subject == f"{bus.prefix}.dead.tasks.default.normal"
    assert message.headers["traceparent"] == "t1"
    assert "max_deliver" in message.headers["Tideflow-Dead-Reason"]
    assert orjson.loads(message.data)["run_id"] == "run-1"
    await emptied(bus, bus.tasks_stream)  # moved, not left behind in the queue


# -- partitions across processes ---------------------------------------------


async def test_a_partition_held_by_another_connection_is_refused_until_it_closes(
    make_bus: Callable[..., Awaitable[Any]],
) -> None:
    one, two = await make_bus(partitions=2), await make_bus(partitions=2)
    run = next(f"r{n}" for n in range(100) if partition_of(f"r{n}", 2) == 0)
    event = SignalReceived(event_id="e", run_id=run, time=0.0, name="go", payload=1)
    await one.publish_events([event])
    async with contextlib.aclosing(one.consume_events([0], max_batch=10)) as first:
        assert (await asyncio.wait_for(anext(first), WITHIN)).events == [event]  # it holds 0
        with pytest.raises(BusError, match="partition 0 is consumed by another consumer"):
            await anext(two.consume_events([1, 0], max_batch=10))
    # partition 1 was not kept by the refused claim, and 0 is free once the first closed
    async with contextlib.aclosing(two.consume_events([0, 1], max_batch=10)) as second:
        batch = await asyncio.wait_for(anext(second), WITHIN)
        assert batch.events == [event]  # handed back unacknowledged by the first
        await batch.ack()


@pytest.mark.parametrize("when", ["waiting", "asking"])
async def test_a_partition_lock_taken_by_another_ends_the_consumer_at_once(
    make_bus: Callable[..., Awaitable[Any]], monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    """The renewal that finds another owner on a partition's lock ends ``consume_events``
    with a BusError, whether the reader waits for events then or is asking for them (its
    wake then goes to that round trip: the reader must not wait out the linger)."""
    readers = pytest.importorskip("tideflow.bus.backends.nats_readers")
    monkeypatch.setattr(readers, "LINGER", 60.0)
    bus = await make_bus(partitions=1, lease=1.5)  # renewed every 0.5 s
    renewed = asyncio.Event()
    renew = bus.renew

    async def renewing(held: dict[int, int]) -> None:
        try:
            await renew(held)
        finally:
            renewed.set()

    async def taken() -> None:
        kv = await bus.js.key_value(bus.lock_bucket)
        await kv.put("p0", b"someone else")
        renewed.clear()
        await asyncio.wait_for(renewed.wait(), WITHIN)

    monkeypatch.setattr(bus, "renew", renewing)
    top_up = readers.EventReader._top_up

    async def asking(self: Any) -> None:
        if when == "asking":
            await taken()
        await top_up(self)

    monkeypatch.setattr(readers.EventReader, "_top_up", asking)
    async with contextlib.aclosing(bus.consume_events([0], max_batch=10)) as batches:
        waiting = asyncio.ensure_future(anext(batches))
        if when == "waiting":
            await taken()
        with pytest.raises(BusError, match="partition 0"):
            await asyncio.wait_for(waiting, WITHIN)


async def test_a_reader_renews_at_the_pace_of_the_presence_bucket_it_found(
    make_bus: Callable[..., Awaitable[Any]],
) -> None:
    """The readers bucket keeps a key for the TTL of the process that made it. A reader
    on a bus with a longer lease renews every third of that TTL, not of its own, or its
    key lapses between renewals and its queue looks unread (it renewed at its own pace
    before, although it had read the bucket's TTL)."""
    presence = pytest.importorskip("tideflow.bus.backends.nats_presence")
    short = await make_bus(lease=2.0)  # makes the bucket: keys kept 2 s
    kv = await presence.readers_bucket(short)
    assert (await kv.status()).ttl == 2.0
    long = await make_bus(lease=10.0)  # its own presence would last 10 s, renewed every 3.3
    reader = long.consume_tasks(["default"], prefetch=1)
    waiting = asyncio.ensure_future(anext(reader))
    loop = asyncio.get_running_loop()
    try:
        deadline = loop.time() + WITHIN
        while not (keys := await presence.bucket_keys(short, presence.bucket_name(short))):
            assert loop.time() < deadline, "the reader was never announced"
            await asyncio.sleep(0.02)
        (key,) = keys
        first = (await kv.get(key)).revision
        # two renewals: about 1.3 s at a third of the bucket's TTL, 6.7 s at its own
        deadline = loop.time() + 4.0
        while (await kv.get(key)).revision < first + 2:
            assert loop.time() < deadline, "the reader renews at its own pace"
            await asyncio.sleep(0.05)
    finally:
        await stop(waiting)
        await reader.aclose()


async def test_a_run_end_published_just_after_run_ends_returned_is_heard(
    make_bus: Callable[..., Awaitable[Any]],
) -> None:
    """``run_ends`` returns once the server has its subscription. nats-py writes a flush's
    PING straight to the socket while the SUB waits in its send buffer for the flusher
    task, so under load (the flusher's turn comes late) a flush came back before the
    server had the SUB, and a run end another process published then was lost (CI saw
    it in test_broker_restart). Here what the client's flusher writes goes out 200 ms
    late, always, in order; the PING does not wait."""
    engine, client = await make_bus(), await make_bus()
    transport = client.nc._transport
    write = transport.writelines
    loop = asyncio.get_running_loop()

    def late(data: Any) -> None:
        loop.call_later(0.2, write, list(data))

    transport.writelines = late
    try:
        ends = await client.run_ends()
    finally:
        transport.writelines = write
    try:
        await engine.publish_run_ends([nats_bus.RunEnded("r1", "succeeded")])
        assert await asyncio.wait_for(anext(ends), WITHIN) == nats_bus.RunEnded("r1", "succeeded")
    finally:
        await ends.aclose()


async def test_a_subscription_its_probe_never_proved_is_dropped(
    make_bus: Callable[..., Awaitable[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A probe that does not come back fails ``run_ends`` and leaves no subscription: the
    next call subscribes afresh, and a run end then comes once, not once per try."""
    engine, client = await make_bus(), await make_bus()
    subscriptions = len(client.nc._subs)
    monkeypatch.setattr(nats_bus, "PROBE_TIMEOUT", 0.2)
    for _ in range(2):
        with monkeypatch.context() as lost:
            lost.setattr(client, "_probed", lambda msg: msg.headers is not None)  # no answer
            with pytest.raises(BusError, match="subscribing to run ends failed"):
                await client.run_ends()
        assert len(client.nc._subs) == subscriptions
    ends = await client.run_ends()
    try:
        await engine.publish_run_ends([nats_bus.RunEnded("r3", "succeeded")])
        await engine.publish_run_ends([nats_bus.RunEnded("r4", "succeeded")])
        assert await asyncio.wait_for(anext(ends), WITHIN) == nats_bus.RunEnded("r3", "succeeded")
        assert await asyncio.wait_for(anext(ends), WITHIN) == nats_bus.RunEnded("r4", "succeeded")
    finally:
        await ends.aclose()


async def test_a_probe_of_another_process_reaches_no_run_end_stream(
    make_bus: Callable[..., Awaitable[Any]],
) -> None:
    """Each process proves its own subscription with a probe on the run-end subject: the
    streams already open elsewhere ignore it."""
    first, second = await make_bus(), await make_bus()
    ends = await first.run_ends()
    try:
        await second.run_ends()  # its probe reaches the first bus too
        await second.publish_run_ends([nats_bus.RunEnded("r2", "failed")])
        assert await asyncio.wait_for(anext(ends), WITHIN) == nats_bus.RunEnded("r2", "failed")
    finally:
        await ends.aclose()


async def test_workers_and_readers_are_listed_without_a_key_watcher(
    make_bus: Callable[..., Awaitable[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """nats-py's ``KeyValue.keys()`` lists through a watcher that waits for the entry with
    nothing after it; when a key's max age ends while it lists, that entry never comes and
    it waits for ever (about 1 call in 8,600 while keys lapse; a CI worker hung in
    test_the_beat_of_a_reader_that_stopped_long_ago_is_trimmed). The listings read the
    buckets' streams instead; a key closed is gone from them at once, and a key another
    version deleted (a marker) is not listed as a worker."""
    from nats.js.kv import KeyValue

    presence = pytest.importorskip("tideflow.bus.backends.nats_presence")

    async def watch(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a KV watcher: it can wait for ever")

    monkeypatch.setattr(KeyValue, "watch", watch)
    bus = await make_bus()
    assert await bus.worker_beats() == []
    reader = bus.consume_tasks(["default"], prefetch=1, worker="host-a/1")
    waiting = asyncio.ensure_future(anext(reader))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WITHIN
    while not (beats := await bus.worker_beats()):
        assert loop.time() < deadline, "the reader never beat"
        await asyncio.sleep(0.02)
    assert [(b.worker, b.live) for b in beats] == [("host-a/1", True)]
    assert {s.consumers for s in await bus.queue_stats() if s.queue == "default"} == {1}
    beats_kv = await presence.beats_bucket(bus)
    await beats_kv.put("old-version", orjson.dumps({"worker": "w", "queues": None, "at": 1}))
    await beats_kv.delete("old-version")  # what an older version did on closing
    await stop(waiting)
    await reader.aclose()
    assert await bus.worker_beats() == []
    assert {s.consumers for s in await bus.queue_stats() if s.queue == "default"} == {0}
    readers = await presence.bucket_keys(bus, presence.bucket_name(bus))
    assert readers == []  # purged, not marked deleted


# -- a cancel nats-py drops ----------------------------------------------------------


class SameTurnCancel:
    """Cancels a task in the loop turn in which the answer comes to a request of that task
    on a subject holding given text. nats-py waits for each answer under
    ``asyncio.wait_for``, which on Python 3.11 then returns the answer as if no cancel had
    come (the cancel is dropped, though still counted by the task): what CI can meet now
    and then under load (a reader's ``anext``, cancelled once, runs on and the test that
    awaits it hangs), here every time."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from nats.aio.client import Client

        self.armed: dict[asyncio.Future[Any], str] = {}
        self.fired: list[str] = []
        publish = Client.publish

        async def publishing(
            client: Client,
            subject: str,
            payload: bytes = b"",
            reply: str = "",
            headers: dict[str, str] | None = None,
        ) -> None:
            task = asyncio.current_task()
            what = self.armed.get(task) if task is not None else None
            inboxes = client._resp_sub_prefix
            if task is not None and what is not None and what in subject and inboxes:
                # a request: its answer resolves the future its wait_for waits on
                answer = client._resp_map.get(reply.removeprefix(inboxes.decode()))
                if answer is not None:
                    del self.armed[task]
                    answer.add_done_callback(self._cancelling(task, what))
            await publish(client, subject, payload, reply, headers)

        monkeypatch.setattr(Client, "publish", publishing)

    def _cancelling(self, task: asyncio.Task[Any], what: str) -> Callable[[Any], None]:
        def answered(answer: asyncio.Future[Any]) -> None:
            if not answer.cancelled():
                self.fired.append(what)
                task.cancel()  # the answer is there: wait_for returns it this turn

        return answered

    def cancel(self, task: asyncio.Future[Any], when_answered: str) -> None:
        self.armed[task] = when_answered


@pytest.fixture
def same_turn(monkeypatch: pytest.MonkeyPatch) -> SameTurnCancel:
    return SameTurnCancel(monkeypatch)


async def _ended(read: asyncio.Future[Any]) -> bool:
    """Whether ``read``, cancelled once, is over within WITHIN seconds (it is cancelled
    again until it is, so that the test goes on either way)."""
    await asyncio.wait((read,), timeout=WITHIN)
    if read.done():
        return True
    await cancel_and_wait(read)
    return False


@pytest.mark.parametrize(
    ("queues", "request_on", "published"),
    [
        # as it starts: looking for queues, making a queue's consumers, announcing itself
        # (its presence, its beat); with nothing queued the read waits on, with a task
        # queued it returns it
        (None, "STREAM.INFO.{prefix}_tasks", False),
        (None, "STREAM.INFO.{prefix}_tasks", True),
        (["default"], "CONSUMER.DURABLE.CREATE.{prefix}_tasks.tasks_default_", False),
        (["default"], "CONSUMER.DURABLE.CREATE.{prefix}_tasks.tasks_default_", True),
        (["default"], "$KV.{prefix}_readers.", False),
        (["default"], "$KV.{prefix}_readers.", True),
        (["default"], "$KV.{prefix}_beats.", True),
        # as it reads: a malformed task kept as a dead letter, a task taken behind it
        (["default"], "{prefix}.dead.", "malformed"),
        # as it waits: a new queue's consumers made (published once the reader waits)
        (None, "CONSUMER.DURABLE.CREATE.{prefix}_tasks.tasks_io_", "late"),
    ],
)
async def test_a_task_read_cancelled_as_nats_py_gets_an_answer_ends(
    make_bus: Callable[..., Awaitable[Any]],
    same_turn: SameTurnCancel,
    queues: list[str] | None,
    request_on: str,
    published: bool | str,
) -> None:
    bus = await make_bus(lease=30.0)  # a hand-back, not a lease that ran out
    request_on = request_on.format(prefix=bus.prefix)
    queue = "io" if published == "late" else "default"
    if published == "malformed":
        await bus.js.publish(bus.task_subject(queue, Priority.NORMAL), b"{not json")
    if published in (True, "malformed"):
        await bus.publish_tasks([task(1, queue)])
    async with contextlib.aclosing(bus.consume_tasks(queues, prefetch=5, worker="h/41")) as reader:
        waiting = asyncio.ensure_future(anext(reader))
        same_turn.cancel(waiting, request_on)
        if published == "late":
            deadline = asyncio.get_running_loop().time() + WITHIN
            while not await bus.worker_beats():
                assert asyncio.get_running_loop().time() < deadline, "the reader never beat"
                await asyncio.sleep(0.02)
            await bus.publish_tasks([task(1, queue)])
        ended = await _ended(waiting)
        assert same_turn.fired == [request_on]
        assert ended, f"a task read cancelled as {request_on} was answered ran on for {WITHIN}s"
        assert waiting.cancelled(), f"a cancelled read returned {waiting.result()!r}"
        assert await bus.worker_beats() == []  # its cleanup ran: the presence is withdrawn
    if published:  # what it took was handed back by that cleanup (the lease is 30 s)
        async with contextlib.aclosing(bus.consume_tasks(queues, prefetch=1)) as again:
            delivery = await asyncio.wait_for(anext(again), WITHIN)
            assert delivery.body == task(1, queue)
            await delivery.ack()


@pytest.mark.parametrize(
    ("request_on", "published"),
    [
        ("$KV.{prefix}_partitions.p0", False),  # the claim of a partition: it waits on
        ("$KV.{prefix}_partitions.p0", True),  # or returns a batch
        ("CONSUMER.DURABLE.CREATE.{prefix}_events.events_1", False),
        ("CONSUMER.DURABLE.CREATE.{prefix}_events.events_1", True),
        ("{prefix}.dead.", "malformed"),  # a malformed event kept, a batch behind it
    ],
)
async def test_an_event_read_cancelled_as_nats_py_gets_an_answer_ends(
    make_bus: Callable[..., Awaitable[Any]],
    same_turn: SameTurnCancel,
    request_on: str,
    published: bool | str,
) -> None:
    bus = await make_bus(lease=30.0, partitions=2)
    request_on = request_on.format(prefix=bus.prefix)
    events = [
        SignalReceived(event_id=f"e{n}", run_id="r", time=0.0, name="go", payload=n) for n in (1, 2)
    ]
    if published == "malformed":
        await bus.js.publish(f"{bus.prefix}.events.{partition_of('r', 2)}", b"{not json")
    if published:
        await bus.publish_events(events)
    async with contextlib.aclosing(bus.consume_events(max_batch=10)) as reader:
        waiting = asyncio.ensure_future(anext(reader))
        same_turn.cancel(waiting, request_on)
        ended = await _ended(waiting)
        assert same_turn.fired == [request_on]
        assert ended, f"an event read cancelled as {request_on} was answered ran on for {WITHIN}s"
        assert waiting.cancelled(), f"a cancelled read returned {waiting.result()!r}"
        await bus.release(await bus.claim([0, 1]))  # its cleanup freed the partitions
    if published:  # and handed back the batch it took at once (the lease is 30 s)
        async with contextlib.aclosing(bus.consume_events(max_batch=10)) as again:
            batch = await asyncio.wait_for(anext(again), WITHIN)
            assert batch.events == events
            await batch.ack()


async def _waiting(bus: Any) -> None:
    """Until the reader waits for what comes (not for the answer to a ``no_wait`` request,
    whose status could wake it later)."""

    def waits(puller: Any) -> bool:
        asking = any(lane.open and not lane.lingering for lane in puller.lanes)
        return puller._waiter is not None and not asking

    deadline = asyncio.get_running_loop().time() + WITHIN
    while not (bus._pullers and all(map(waits, bus._pullers))):
        assert asyncio.get_running_loop().time() < deadline, "the reader never waited"
        await asyncio.sleep(0.01)


@pytest.mark.parametrize(
    ("reads", "when"),
    [
        ("tasks", "waiting"),  # woken by the reconnect: it asks its lanes, then waits
        ("tasks", "rung"),  # a task rang its doorbell as the link came back: taken
        ("events", "waiting"),
        ("events", "asking"),  # the link came back as it asked its lanes: it asks again
    ],
)
async def test_a_read_cancelled_as_it_makes_its_consumers_again_after_a_reconnect_ends(
    make_bus: Callable[..., Awaitable[Any]],
    same_turn: SameTurnCancel,
    monkeypatch: pytest.MonkeyPatch,
    reads: str,
    when: str,
) -> None:
    """A reconnect has a reader make its consumers again before it asks them anew; a
    cancel dropped then ends the read before it waits (``LINGER``, 60 s here) or returns
    what it took (handed back at once: the lease is 30 s)."""
    readers = pytest.importorskip("tideflow.bus.backends.nats_readers")
    monkeypatch.setattr(readers, "LINGER", 60.0)
    bus = await make_bus(lease=30.0, partitions=1)
    reconnect = asyncio.Event()

    def reconnected(*, wake: bool = True) -> None:
        bus._known.clear()  # what the bus does when the link comes back
        for puller in bus._pullers:
            if wake:
                puller.reconnected()
            else:  # (its wake taken by the doorbell, or by a wait for an answer)
                for lane in puller.lanes:
                    lane.open, lane.stale = 0, True

    if reads == "tasks":  # a prefetch of 1: it waits on a doorbell for its 3 lanes
        items = bus.consume_tasks(["default"], prefetch=1 if when == "rung" else 5)
        request_on = f"CONSUMER.DURABLE.CREATE.{bus.prefix}_tasks.tasks_default_"
    else:
        items = bus.consume_events(max_batch=10)
        request_on = f"CONSUMER.DURABLE.CREATE.{bus.prefix}_events.events_0"
        top_up = readers.EventReader._top_up

        async def asking(self: Any) -> None:
            await top_up(self)
            if reconnect.is_set():
                reconnect.clear()  # (as it waited for their answers: the wake went there)
                reconnected(wake=False)

        monkeypatch.setattr(readers.EventReader, "_top_up", asking)
    async with contextlib.aclosing(items) as reader:
        waiting = asyncio.ensure_future(anext(reader))
        await _waiting(bus)
        same_turn.cancel(waiting, request_on)
        if when == "waiting":
            reconnected()
        elif when == "rung":
            reconnected(wake=False)
            await bus.publish_tasks([task(1)])
        else:  # woken (a batch settled, say); the link comes back as it asks its lanes
            reconnect.set()
            for puller in bus._pullers:
                puller.wake()
        ended = await _ended(waiting)
        assert same_turn.fired == [request_on]
        assert ended, f"a read cancelled as {request_on} was answered ran on for {WITHIN}s"
        assert waiting.cancelled(), f"a cancelled read returned {waiting.result()!r}"
    if when == "rung":
        async with contextlib.aclosing(bus.consume_tasks(["default"], prefetch=1)) as again:
            delivery = await asyncio.wait_for(anext(again), WITHIN)
            assert delivery.body == task(1)
            await delivery.ack()


async def test_a_partition_renewer_ends_at_the_cancel_its_renewal_dropped(
    make_bus: Callable[..., Awaitable[Any]], same_turn: SameTurnCancel
) -> None:
    """Cancelled once, as the answer to its renewal came: it ends there, without the
    second cancel a reader's close would send it half a second later."""
    bus = await make_bus(lease=1.5, partitions=1)  # renewed every half second
    async with contextlib.aclosing(bus.consume_events(max_batch=10)) as reader:
        waiting = asyncio.ensure_future(anext(reader))
        try:
            deadline = asyncio.get_running_loop().time() + WITHIN
            while not (
                renewers := [
                    t for t in asyncio.all_tasks() if t.get_name() == "tideflow-nats-partitions"
                ]
            ):
                assert asyncio.get_running_loop().time() < deadline, "the reader never claimed"
                await asyncio.sleep(0.01)
            (renewer,) = renewers
            request_on = f"$KV.{bus.prefix}_partitions.p0"
            same_turn.cancel(renewer, request_on)
            await asyncio.wait((renewer,), timeout=WITHIN)
            ended = renewer.done()
            assert same_turn.fired == [request_on]
            assert ended, f"a partition renewer cancelled as it renewed ran on for {WITHIN}s"
            assert renewer.cancelled()
        finally:
            await stop(waiting)


async def test_an_event_delivered_again_before_its_batch_is_made_is_in_it_once(
    make_bus: Callable[..., Awaitable[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An event that arrived and then waited past the consumer's AckWait before its batch
    was made (a loaded loop) is delivered again by the server while it waits; the batch
    holds it once, by its later delivery. Seen in CI: a batch of two events came as the
    first one twice (test_an_attempts_report_travels_with_its_round[asyncio-nats])."""
    from tideflow.bus.backends import nats_readers as readers
    from tideflow.model.events import TaskCompleted, TaskStarted

    bus = await make_bus(lease=0.5)
    common = {"run_id": "r", "time": 0.0, "step_key": "a", "attempt": 1}
    reports = [
        TaskStarted(event_id="s", **common, worker="h/1"),
        TaskCompleted(event_id="c", **common, output={"ok": True}),
    ]
    await bus.publish_events(reports)
    batch_of = readers.EventReader._batch
    stalled: list[int] = []

    async def late(self: Any) -> Any:
        # the first batch is made only once the server has delivered what arrived again
        if self.puller.arrived and not stalled:
            stalled.append(len(self.puller.arrived))
            await self._stand()  # a request open for the redeliveries
            deadline = asyncio.get_running_loop().time() + WITHIN
            while len(self.puller.arrived) < 2 * len(reports):
                assert asyncio.get_running_loop().time() < deadline, "nothing came again"
                await self.puller.wait(0.05)
        return await batch_of(self)

    monkeypatch.setattr(readers.EventReader, "_batch", late)
    async with contextlib.aclosing(
        bus.consume_events([partition_of("r", bus.partitions)], max_batch=10)
    ) as batches:
        batch = await asyncio.wait_for(anext(batches), WITHIN * 2)
        assert stalled == [len(reports)]
        assert [e.event_id for e in batch.events] == ["s", "c"]
        await batch.ack()
    reader = bus.consume_events(max_batch=10)
    try:  # acknowledged by the later deliveries: nothing comes a third time
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(anext(reader), 1.5)
    finally:
        await reader.aclose()
