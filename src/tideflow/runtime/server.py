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
them run out after the bus's delivery lease; until then the scheduler's event stream
is refused, and the scheduler opens it again with a backoff (runtime/scheduler.py).

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
from dataclasses import dataclass, field
from typing import Any

from tideflow.errors import BusError, StoreError
from tideflow.lifecycle import Stop, shown
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
        bus=open_bus(options.bus),
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


__all__ = ["LEASE_LOST", "STOPPED", "ServerOptions", "check_urls", "serve"]
