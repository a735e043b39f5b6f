"""`tideflow server`: the engine of a cluster, with no workers, until SIGTERM or SIGINT.

A server is ``Runtime(workers=0)`` on a shared store and a real bus: the scheduler
consumes the events of every partition of the bus, the relay publishes tasks for the
`tideflow worker` processes, timers fire, and on start recovery puts back in motion
what the previous engine left. It holds the store's engine lease (runtime/lease.py)
while it runs, so **one server is active per store**; another one started on the same
store is a *standby*: it waits for the lease (``--standby``, or up to
``--wait-for-engine SECONDS``) and takes over when the active one stops (at once after
a clean stop, within the lease's TTL after a SIGKILL), recovering first.

The next step (partition ownership, several active servers) changes what a server
consumes, not its shape: a server will hold leases on a share of the partitions and the
scheduler will consume ``bus.consume_events(partitions)`` instead of all of them.

Taking over also means taking the bus's event partitions: the dead server's claims on
them run out after the bus's delivery lease, so the server's bus (``ClaimingBus``)
waits for them, trying again with a backoff, instead of failing the scheduler's consumer
at once.

Stopping: the first SIGTERM or SIGINT finishes the batch being applied, stops the
relay and the timers (what they still held is re-derived by the next engine's
recovery), releases the lease and exits 0. A server whose lease another engine took
over (it was paused for longer than the TTL) stops advancing runs and exits 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import socket
from collections.abc import AsyncGenerator, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from tideflow.bus.base import Bus, Control, Delivery, EventBatch, Message, Stream
from tideflow.errors import BusError, StoreError
from tideflow.lifecycle import Stop, shown
from tideflow.model.commands import DispatchTask
from tideflow.model.events import Event
from tideflow.runtime.lease import DEFAULT_TTL
from tideflow.runtime.runtime import Runtime

log = logging.getLogger("tideflow.server")

STOPPED = 0
LEASE_LOST = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerOptions:
    store: str
    bus: str
    wait_for_engine: float = 0.0
    """Seconds to wait for the engine lease held by another server (``math.inf``: a
    standby, waiting as long as it takes)."""
    lease_ttl: float = DEFAULT_TTL
    runtime: dict[str, Any] = field(default_factory=dict)
    """More ``Runtime`` options (clock, limits, batch size)."""


def check_urls(store: str, bus: str) -> None:
    """A server's store and bus must be reachable from other processes."""
    if store.split(":", 1)[0].lower() == "memory":
        raise StoreError(
            "a server's store must be shared with its clients: use postgresql://… (or "
            "sqlite:///file.db on one machine), not memory://"
        )
    if bus.split(":", 1)[0].lower() in ("memory", "local"):
        raise BusError(
            "a server's bus must reach workers in other processes: use redis://host:6379/0, "
            "not the in-process bus (memory://)"
        )


async def serve(options: ServerOptions, stop: Stop | None = None) -> int:
    """Run the engine until ``stop`` (SIGTERM/SIGINT): ``STOPPED``, or ``LEASE_LOST``.
    Raises ``EngineAlreadyRunning`` when another server holds the lease longer than
    ``wait_for_engine``."""
    check_urls(options.store, options.bus)
    stop = stop or Stop()
    stop.install()
    lost: list[bool] = []

    def lease_lost() -> None:
        lost.append(True)
        stop.set("lease lost")

    from tideflow.bus import open_bus

    rt = Runtime(
        store=options.store,
        bus=ClaimingBus(open_bus(options.bus)),
        workers=0,
        recover=True,
        lease=True,
        lease_ttl=options.lease_ttl,
        wait_for_engine=options.wait_for_engine,
        on_lease_lost=lease_lost,
        **options.runtime,
    )
    me = f"{socket.gethostname()}/{os.getpid()}"
    log.info(
        "tideflow server %s: engine (scheduler, relay, timers, recovery; no workers) for "
        "store %s, bus %s (%d event partitions, delivery lease %gs)",
        me,
        shown(options.store),
        shown(options.bus),
        rt.bus.partitions,
        rt.bus.lease,
    )
    try:
        started = await _started(rt, options, stop)
    except BaseException:
        with contextlib.suppress(Exception):
            await rt.close()
        stop.uninstall()
        raise
    if not started:
        with contextlib.suppress(Exception):
            await rt.close()
        stop.uninstall()
        log.info("stopped before it took the engine lease")
        return STOPPED
    try:
        log.info(
            "serving: holds the store's engine lease (TTL %gs), recovery done, consuming "
            "every event partition",
            options.lease_ttl,
        )
        await stop.wait()
    finally:
        log.info("stopping: finishing the batch in progress, releasing the lease")
        await rt.close()
        stop.uninstall()
    if lost:
        log.error("stopped: another engine holds the store's lease now")
        return LEASE_LOST
    log.info("stopped")
    return STOPPED


async def _started(rt: Runtime, options: ServerOptions, stop: Stop) -> bool:
    """Start the runtime (waiting for the lease as a standby may); False when ``stop``
    came first."""
    if options.wait_for_engine > 0:
        patience = (
            "as long as it takes"
            if math.isinf(options.wait_for_engine)
            else (f"up to {options.wait_for_engine:g}s")
        )
        log.info("taking the engine lease; while another server holds it, waiting %s", patience)
    starting = asyncio.create_task(rt.start(), name="tideflow-server-start")
    stopping = asyncio.create_task(stop.wait(), name="tideflow-server-stop")
    try:
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
    if not starting.done():
        starting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await starting
        return False
    starting.result()  # EngineAlreadyRunning, a store or bus that cannot be opened
    return True


class ClaimingBus(Bus):
    """A server's bus: ``consume_events`` waits for partitions another consumer still
    claims (a dead server's claims run out after the delivery lease), trying again with a
    backoff from 50 ms to 1 s; everything else is the bus's own."""

    def __init__(self, bus: Bus) -> None:
        self.inner = bus
        self.partitions = bus.partitions
        self.lease = bus.lease

    async def open(self) -> None:
        await self.inner.open()

    async def close(self) -> None:
        await self.inner.close()

    async def publish_tasks(self, tasks: Sequence[DispatchTask | Message[DispatchTask]]) -> None:
        await self.inner.publish_tasks(tasks)

    async def publish_events(self, events: Sequence[Event | Message[Event]]) -> None:
        await self.inner.publish_events(events)

    async def publish_control(self, message: Control) -> None:
        await self.inner.publish_control(message)

    def consume_tasks(
        self, queues: Collection[str] | None = None, *, prefetch: int
    ) -> Stream[Delivery[DispatchTask]]:
        return self.inner.consume_tasks(queues, prefetch=prefetch)

    def consume_control(self) -> Stream[Control]:
        return self.inner.consume_control()

    async def consume_events(
        self, partitions: Collection[int] | None = None, *, max_batch: int
    ) -> AsyncGenerator[EventBatch, None]:
        """The inner consumer's batches; a claim refused before the first batch is tried
        again (once a batch came, a lost claim ends the stream: another engine has it)."""
        delay = 0.05
        taken = False
        while True:
            batches = self.inner.consume_events(partitions, max_batch=max_batch)
            try:
                async for batch in batches:
                    taken = True
                    yield batch
                return
            except BusError as exc:
                if taken:
                    raise
                if delay == 0.05:
                    log.info("waiting for the event partitions (%s)", exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
            finally:
                await batches.aclose()


__all__ = ["LEASE_LOST", "STOPPED", "ClaimingBus", "ServerOptions", "check_urls", "serve"]
