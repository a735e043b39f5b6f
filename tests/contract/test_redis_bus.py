"""The Redis Streams bus beyond the contract: its URL, its errors, what it does with a
malformed entry, a consumer that died, a partition count that disagrees, a lost connection,
a cancel that redis-py drops."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.asyncio.connection import Connection

from tideflow.bus import open_bus
from tideflow.bus.backends.redis import RedisBus
from tideflow.bus.closing import cancel_and_wait
from tideflow.errors import BusError
from tideflow.model.plan import Priority

from .test_bus_contract import WITHIN, event, next_of, task

Open = Callable[..., Awaitable[RedisBus]]


@pytest.fixture
async def raw(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


@pytest.fixture
async def prefix(raw: aioredis.Redis) -> AsyncIterator[str]:
    name = f"tftest-{uuid.uuid4().hex[:12]}"
    yield name
    keys = [key async for key in raw.scan_iter(match=f"{name}:*")]
    if keys:
        await raw.delete(*keys)


@pytest.fixture
async def open_redis(redis_url: str, prefix: str) -> AsyncIterator[Open]:
    opened: list[RedisBus] = []

    async def make(**options: Any) -> RedisBus:
        bus = RedisBus(redis_url, prefix=prefix, **options)
        await bus.open()
        opened.append(bus)
        return bus

    yield make
    for bus in opened:
        await bus.close()


# -- URLs ------------------------------------------------------------------------


def test_open_bus_builds_the_redis_bus_with_its_options() -> None:
    bus = open_bus("redis://:secret@db.example:6380/3?prefix=blue&partitions=64&lease=12.5")
    assert isinstance(bus, RedisBus)
    assert (bus.prefix, bus.partitions, bus.lease) == ("blue", 64, 12.5)
    assert bus.url == "redis://:secret@db.example:6380/3"  # the options are tideflow's
    assert "secret" not in bus.shown
    plain = open_bus("rediss://localhost")
    assert isinstance(plain, RedisBus)
    assert (plain.url, plain.prefix, plain.partitions, plain.lease) == (
        "rediss://localhost/0",
        "tideflow",
        16,
        30.0,
    )


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis://h/0?partition=3", "unknown option 'partition'; the options are prefix"),
        ("redis://h/0?db=1", "unknown option 'db'"),
        ("redis://h/0?lease=soon", "lease='soon' is not a number"),
        ("redis://h/0?partitions=2.5", "partitions='2.5' is not a number"),
        ("redis://h/0?lease=0", "lease must be a positive number"),
        ("redis://h/0?lease=nan", "lease must be a positive number"),
        ("redis://h/0?partitions=0", "partitions must be a whole number"),
        ("redis://h/0?prefix=", "prefix must be a non-empty name"),
        ("redis://h/0?prefix=a*b", "prefix must be a non-empty name"),
        ("redis://h/zero", r"the path is the database number \(redis://host:6379/0\)"),
        ("redis://h:port/0", "the port is not a number"),
    ],
)
def test_open_bus_refuses_a_bad_redis_url(url: str, message: str) -> None:
    with pytest.raises(BusError, match=message):
        open_bus(url)


def test_without_redis_py_open_bus_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "redis", None)
    monkeypatch.delitem(sys.modules, "tideflow.bus.backends.redis")
    with pytest.raises(BusError, match=r"needs redis-py: pip install 'tideflow\[redis\]'"):
        open_bus("redis://localhost:6379/0")


async def test_a_server_that_does_not_answer_is_a_bus_error() -> None:
    bus = RedisBus("redis://:secret@127.0.0.1:1/0")
    with pytest.raises(
        BusError, match=r"redis bus redis://:\*\*\*@127.0.0.1:1/0: connecting failed"
    ):
        await bus.open()
    with pytest.raises(BusError, match=r"is not open: await bus\.open"):
        await bus.publish_tasks([task(1)])


# -- on the server ------------------------------------------------------------------


async def test_the_partition_count_is_the_same_for_every_bus_of_a_prefix(open_redis: Open) -> None:
    await open_redis(partitions=4)
    await open_redis(partitions=4)
    with pytest.raises(BusError, match="has 4 event partitions, this bus was given partitions=8"):
        await open_redis(partitions=8)


async def test_malformed_entries_are_acknowledged_and_moved_to_the_dead_stream(
    open_redis: Open, raw: aioredis.Redis, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    bus = await open_redis()
    stream = f"{prefix}:tasks:default:normal"
    await raw.xadd(stream, {"b": b"{not json"})
    await raw.xadd(
        stream, {"b": b'{"command": "CancelTask", "run_id": "r", "step_key": "a", "attempt": 1}'}
    )
    await raw.xadd(stream, {"x": b"1"})
    await bus.publish_tasks([task(1)])
    await raw.xadd(f"{prefix}:events:0", {"b": b'{"kind": "Meteor"}'})
    await bus.publish_events([event("r", 1)])
    with caplog.at_level(logging.ERROR, logger="tideflow.bus.redis"):
        async with contextlib.aclosing(bus.consume_tasks(prefetch=10)) as tasks:
            delivery = await next_of(tasks)
            assert delivery.body == task(1)
            await delivery.ack()
        async with contextlib.aclosing(bus.consume_events(max_batch=10)) as batches:
            batch = await next_of(batches)
            assert batch.events == [event("r", 1)]
            await batch.ack()
    dead = await raw.xrange(f"{prefix}:dead")
    errors = [fields[b"error"].decode() for _, fields in dead]
    assert [fields[b"stream"] for _, fields in dead] == [stream.encode()] * 3 + [
        f"{prefix}:events:0".encode()
    ]
    assert "the body is not JSON" in errors[0]
    assert "a CancelTask command" in errors[1]
    assert "no body" in errors[2]
    assert "unknown type 'Meteor'" in errors[3]
    assert dead[0][1][b"field:b"] == b"{not json"  # the entry as it was, to inspect
    for key, group in ((stream, "workers"), (f"{prefix}:events:0", "engine")):
        assert (await raw.xpending(key, group))["pending"] == 0
        assert await raw.xlen(key) == 0
    logged = [r.getMessage() for r in caplog.records]
    assert any(stream in m and "moved to" in m and "not JSON" in m for m in logged)


async def test_a_task_held_by_a_worker_that_died_goes_to_another(
    open_redis: Open, raw: aioredis.Redis, prefix: str
) -> None:
    bus = await open_redis(lease=0.2)
    await bus.publish_tasks([task(1, priority=Priority.HIGH)])
    stream = f"{prefix}:tasks:default:high"
    await raw.xgroup_create(stream, "workers", id="0", mkstream=True)
    await raw.xreadgroup("workers", "ghost", {stream: ">"})  # a worker that then died
    pending = await raw.xpending_range(stream, "workers", "-", "+", 10)
    assert [p["consumer"] for p in pending] == [b"ghost"]  # visible to an operator
    async with contextlib.aclosing(bus.consume_tasks(prefetch=1)) as tasks:
        again = await next_of(tasks)
        assert (again.body, again.deliveries) == (task(1, priority=Priority.HIGH), 2)
        pending = await raw.xpending_range(stream, "workers", "-", "+", 10)
        assert [p["consumer"] for p in pending] != [b"ghost"]
        await again.ack()
    assert await raw.xlen(stream) == 0


async def test_a_partition_locked_by_a_consumer_that_died_is_free_after_the_lease(
    open_redis: Open, raw: aioredis.Redis, prefix: str
) -> None:
    bus = await open_redis(partitions=1, lease=0.2)
    await bus.publish_events([event("r", 1)])
    await raw.set(f"{prefix}:owner:0", "ghost", px=200)
    with pytest.raises(BusError, match="partition 0 is consumed by another consumer"):
        await anext(bus.consume_events(max_batch=10))
    deadline = time.monotonic() + WITHIN
    while await raw.exists(f"{prefix}:owner:0"):  # the lock's end (PTTL rounds down: not a sleep)
        assert time.monotonic() < deadline, "the ghost's lock never lapsed"
        await asyncio.sleep(0.005)
    async with contextlib.aclosing(bus.consume_events(max_batch=10)) as batches:
        batch = await next_of(batches)
        assert batch.events == [event("r", 1)]
        owner = await raw.get(f"{prefix}:owner:0")
        assert owner not in (None, b"ghost")
        await batch.ack()
    assert await raw.get(f"{prefix}:owner:0") is None  # released when it closed


async def test_a_consumer_whose_connection_is_killed_reconnects(
    open_redis: Open, raw: aioredis.Redis, prefix: str
) -> None:
    bus = await open_redis()
    async with contextlib.aclosing(bus.consume_tasks(["default"], prefetch=1)) as tasks:
        waiting = asyncio.ensure_future(anext(tasks))
        ours = await asyncio.wait_for(_blocked(raw, f"tideflow:{prefix}"), WITHIN)
        for client in ours:
            await raw.client_kill_filter(_id=client["id"])
        await bus.publish_tasks([task(1)])
        delivery = await asyncio.wait_for(waiting, WITHIN)
        assert delivery.body == task(1)
        await delivery.ack()


async def _blocked(raw: aioredis.Redis, name: str) -> list[dict[str, Any]]:
    """The connections of the bus named ``name``, once one of them waits in XREAD."""
    while True:
        ours = [c for c in await raw.client_list() if c["name"] == name]
        if any(c["cmd"] == "xread" for c in ours):
            return ours
        await asyncio.sleep(0.005)


class _Proxy:
    """A TCP proxy in front of the shared Redis, to cut (an outage) and restore."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.port = 0
        self.server: asyncio.Server | None = None
        self.links: list[asyncio.StreamWriter] = []

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._link, "127.0.0.1", self.port)
        self.port = self.server.sockets[0].getsockname()[1]

    async def cut(self) -> None:
        assert self.server is not None
        self.server.close()
        for writer in self.links:
            writer.close()
        self.links.clear()
        await self.server.wait_closed()

    async def _link(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self.links += [writer, up_writer]

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


async def test_a_consumer_rides_out_an_outage_and_says_so(
    redis_url: str, prefix: str, raw: aioredis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    from urllib.parse import urlsplit

    target = urlsplit(redis_url)
    proxy = _Proxy(target.hostname or "127.0.0.1", target.port or 6379)
    await proxy.start()
    bus = RedisBus(f"redis://127.0.0.1:{proxy.port}/0", prefix=prefix)
    await bus.open()
    caplog.set_level(logging.INFO, logger="tideflow.bus.redis")
    try:
        async with contextlib.aclosing(bus.consume_tasks(["default"], prefetch=1)) as tasks:
            waiting = asyncio.ensure_future(anext(tasks))
            await asyncio.wait_for(_blocked(raw, f"tideflow:{prefix}"), WITHIN)
            await proxy.cut()
            await asyncio.wait_for(_logged(caplog, "consume_tasks failed (ConnectionError"), WITHIN)
            direct = RedisBus(redis_url, prefix=prefix)
            await direct.open()
            await direct.publish_tasks([task(1)])  # published during the outage
            await direct.close()
            assert not waiting.done()
            await proxy.start()
            delivery = await asyncio.wait_for(waiting, WITHIN)
            assert delivery.body == task(1)
            await delivery.ack()
            await asyncio.wait_for(_logged(caplog, "consume_tasks works again"), WITHIN)
    finally:
        await bus.close()
        await proxy.cut()


async def _logged(caplog: pytest.LogCaptureFixture, text: str) -> None:
    # caplog has nothing to wait on: look again every few ms (the caller bounds the wait)
    while not any(text in r.getMessage() for r in caplog.records):  # noqa: ASYNC110
        await asyncio.sleep(0.005)


async def test_a_burst_of_publishers_waits_for_connections_instead_of_failing(
    open_redis: Open,
) -> None:
    """More concurrent publishes than the pool holds (a client starting many runs at
    once): they wait for a connection instead of failing with "Too many connections"."""
    bus = await open_redis()
    events = [event(f"run-{n}", n) for n in range(300)]
    await asyncio.gather(*(bus.publish_events([e]) for e in events))
    batches = bus.consume_events(max_batch=1000)
    got = 0
    async with contextlib.aclosing(batches) as stream:
        while got < len(events):
            batch = await next_of(stream)
            got += len(batch.events)
            await batch.ack()
    assert got == len(events)


async def test_tasks_acknowledged_together_take_one_script_call(
    open_redis: Open, raw: aioredis.Redis
) -> None:
    bus = await open_redis()
    await bus.publish_tasks([task(n) for n in range(1, 5)])
    calls: list[int] = []
    settle = bus.settle

    async def counted(entries: Any, *args: Any) -> int:
        calls.append(len(entries))
        return await settle(entries, *args)

    bus.settle = counted  # type: ignore[method-assign]
    async with contextlib.aclosing(bus.consume_tasks(prefetch=4)) as tasks:
        held = [await next_of(tasks) for _ in range(4)]
        await bus.ack_tasks(held)
        assert calls == [4]
        stream = bus.task_stream("default", Priority.NORMAL)
        assert await raw.xlen(stream) == 0  # deleted as well as acknowledged
        assert (await raw.xpending(stream, "workers"))["pending"] == 0


# -- a cancel redis-py drops --------------------------------------------------------


class SameTurnCancel:
    """Cancels a task in the loop turn in which redis-py has written a command of that task
    holding given bytes (a command's name, or a script's SHA). redis-py writes each command
    under ``asyncio.wait_for``, which on Python 3.11 then returns as if no cancel had come
    (the cancel is dropped, though still counted by the task) and the reply is read as
    usual: what CI met now and then under load (a Redis reader's ``anext``, cancelled once,
    ran on and the test awaiting it hung), here every time."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.armed: dict[asyncio.Future[Any], bytes] = {}
        self.fired: list[bytes] = []
        target: contextvars.ContextVar[tuple[asyncio.Task[Any], bytes] | None]
        target = contextvars.ContextVar("target", default=None)
        send, write = Connection.send_packed_command, Connection._send_packed_command

        async def sending(conn: Connection, command: Any, check_health: bool = True) -> None:
            task = asyncio.current_task()
            wire = command.encode() if isinstance(command, str) else command
            wire = wire if isinstance(wire, bytes) else b"".join(wire)
            what = self.armed.get(task) if task is not None else None
            hit = task is not None and what is not None and what in wire
            if hit:
                del self.armed[task]
            # the write runs in a task of wait_for's, in a copy of this context
            token = target.set((task, what) if hit else None)  # type: ignore[arg-type]
            try:
                await send(conn, command, check_health)
            finally:
                target.reset(token)

        async def writing(conn: Connection, command: Any) -> None:
            await write(conn, command)
            hit = target.get()
            if hit is not None:
                target.set(None)
                self.fired.append(hit[1])
                hit[0].cancel()  # the command is written: wait_for's task ends this turn

        monkeypatch.setattr(Connection, "send_packed_command", sending)
        monkeypatch.setattr(Connection, "_send_packed_command", writing)

    def cancel(self, task: asyncio.Future[Any], when_sent: bytes) -> None:
        self.armed[task] = when_sent


@pytest.fixture
def same_turn(monkeypatch: pytest.MonkeyPatch) -> SameTurnCancel:
    return SameTurnCancel(monkeypatch)


def _wire(bus: RedisBus, sent: str) -> bytes:
    """A command's name, or the SHA of the bus's script of that name."""
    script = bus._scripts.get(sent)
    return sent.encode() if script is None else script.sha.encode()


async def _ended(read: asyncio.Future[Any]) -> bool:
    """Whether ``read``, cancelled once, is over within WITHIN seconds (it is cancelled
    again until it is, so that the test goes on either way)."""
    await asyncio.wait((read,), timeout=WITHIN)
    if read.done():
        return True
    await cancel_and_wait(read)
    return False


LEASES = {"XREADGROUP": 2.0, "XREAD": 2.0}
"""A read that blocks on the server answers its dropped cancel when its block ends: at
most a quarter of the lease later (0.5 s here). The others answer at once: 30 s tells a
hand-back from a lease that runs out."""


@pytest.mark.parametrize(
    ("queues", "prefetch", "sent", "published"),
    [
        # waiting for tasks: of named queues, taking them as they come (a prefetch of
        # one from each lane), or woken by them; of every queue, or for new queues
        (["default"], 3, "XREADGROUP", False),
        (["default"], 1, "XREAD", False),
        (None, 1, "XREAD", False),
        (["default"], 1, "take_tasks", False),  # looking, finding none
        (["default"], 1, "take_tasks", True),  # taking one
        (None, 1, "take_tasks", True),
        (["default"], 1, "announce", False),  # the reader's presence
    ],
)
async def test_a_task_read_cancelled_as_redis_py_sends_its_command_ends(
    open_redis: Open,
    same_turn: SameTurnCancel,
    queues: list[str] | None,
    prefetch: int,
    sent: str,
    published: bool,
) -> None:
    bus = await open_redis(lease=LEASES.get(sent, 30.0))
    if published:
        await bus.publish_tasks([task(1)])
    reader = bus.consume_tasks(queues, prefetch=prefetch, worker="host-a/41")
    waiting = asyncio.ensure_future(anext(reader))
    same_turn.cancel(waiting, _wire(bus, sent))
    ended = await _ended(waiting)
    assert same_turn.fired == [_wire(bus, sent)]
    assert ended, f"a task read cancelled as its {sent} was sent ran on for {WITHIN}s"
    assert waiting.cancelled(), f"a cancelled read returned {waiting.result()!r}"
    assert await bus.worker_beats() == []  # its cleanup ran: the presence is withdrawn
    await reader.aclose()
    if published:  # handed back by that cleanup, not by the lease running out
        async with contextlib.aclosing(bus.consume_tasks(queues, prefetch=1)) as again:
            delivery = await next_of(again)
            assert (delivery.body, delivery.deliveries) == (task(1), 2)
            await delivery.ack()


@pytest.mark.parametrize(
    ("sent", "published"),
    [
        ("XREADGROUP", False),  # waiting for events
        ("take_events", False),
        ("take_events", True),  # taking a batch
        ("claim_partitions", False),
    ],
)
async def test_an_event_read_cancelled_as_redis_py_sends_its_command_ends(
    open_redis: Open, same_turn: SameTurnCancel, sent: str, published: bool
) -> None:
    bus = await open_redis(lease=LEASES.get(sent, 30.0), partitions=2)
    if published:
        await bus.publish_events([event("r", 1), event("r", 2)])
    reader = bus.consume_events(max_batch=10)
    waiting = asyncio.ensure_future(anext(reader))
    same_turn.cancel(waiting, _wire(bus, sent))
    ended = await _ended(waiting)
    assert same_turn.fired == [_wire(bus, sent)]
    assert ended, f"an event read cancelled as its {sent} was sent ran on for {WITHIN}s"
    assert waiting.cancelled(), f"a cancelled read returned {waiting.result()!r}"
    await reader.aclose()
    # its cleanup ran: the partitions are free (a claim of them is refused while they are
    # locked) and a batch it took is handed back at once
    async with contextlib.aclosing(bus.consume_events(max_batch=10)) as again:
        if published:
            batch = await next_of(again)
            assert batch.events == [event("r", 1), event("r", 2)]
            await batch.ack()
        else:
            await anext_none(again)


async def anext_none(items: Any) -> None:
    """Start a read and stop it: a claim refused would raise here."""
    waiting = asyncio.ensure_future(anext(items))
    await asyncio.sleep(0.02)
    waiting.cancel()
    assert await _ended(waiting)
    if not waiting.cancelled():
        waiting.result()
