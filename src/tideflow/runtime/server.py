"""`tideflow server`: an engine of a cluster, with no workers, until SIGTERM or SIGINT
(or, with ``--embedded``, everything in one process: the store's engine, the in-process
bus and workers, for a one-machine deployment on SQLite with the HTTP API beside it).

A server is ``Runtime(workers=0, cluster=True)`` on a shared store and a real bus. Any
number of servers run side by side on one store and bus, all active: runs hash to the
bus's event partitions, and each server holds leases on a share of them (rows in the
store, renewed every ``ttl / 5`` seconds; runtime/partitions.py) and applies only their
events, so one server at a time advances a run, in order. The share is computed by
rendezvous hashing with bounded loads over the live servers (each holds ``partitions
// n`` or one more), so every server agrees without talking:

- a server that starts takes the free partitions of its share, recovers each (what
  its previous owner left: unrelayed effects, pending runs, lost attempts, timers)
  and only then applies its events; the others give up the partitions that are its
  now at their next heartbeat (after the batch in progress), so adding a server
  rebalances without a restart;
- a server that stops (SIGTERM) gives its partitions up at once; one that dies
  (SIGKILL) keeps them until their leases expire (``TIDEFLOW_ENGINE_LEASE_TTL``, 10 s),
  and until the bus's claim on them runs out (the bus URL's ``lease``): the takeover
  time is the larger of the two. Its unacknowledged events are redelivered to the new
  owner; optimistic concurrency on each run's sequence stays the last line of defence;
- the relay publishes tasks for the `tideflow worker` processes and each server's timer
  wheel fires only the timers of the runs it owns.

Every take and release is logged (``took partitions 0-3,9 …``, ``released partitions
…``); `tideflow db status` lists who holds which partition.

A store is served either by one embedded engine (`tideflow run`, `tideflow resume`,
holding the store's ``engine`` lease, runtime/lease.py) or by servers, never both: a
server waits up to ``--wait-for-engine SECONDS`` for an embedded engine to exit, then
is refused. ``--standby`` is accepted for compatibility and changes nothing: there are
no standbys any more, every server is active.

Stopping: the first SIGTERM or SIGINT finishes the batch being applied, stops the
relay and the timers (what they still held is re-derived by the next owner's recovery),
releases the partitions and exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import socket
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any

from tideflow.client import Client
from tideflow.errors import BusError, StoreError
from tideflow.lifecycle import Stop, shown
from tideflow.runtime.lease import DEFAULT_TTL
from tideflow.runtime.partitions import shown as shown_partitions
from tideflow.runtime.relay import Listener
from tideflow.runtime.runtime import Runtime

log = logging.getLogger("tideflow.server")

STOPPED = 0


Service = Callable[[Client, Stop], AbstractAsyncContextManager[None]]
"""Entered once the server serves, left before the engine stops; ``Stop`` lets it stop
the server when it cannot go on."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerOptions:
    store: str
    bus: str
    wait_for_engine: float = 0.0
    """Seconds to wait for an embedded engine that holds the store (``math.inf``: as
    long as it takes)."""
    lease_ttl: float = DEFAULT_TTL
    runtime: dict[str, Any] = field(default_factory=dict)
    """More ``Runtime`` options (clock, limits, batch size)."""
    services: tuple[Service, ...] = ()
    """What runs beside the engine over its client once it serves, until it stops (the
    HTTP API of ``--http``: api/serving.py)."""
    embedded: bool = False
    """One process for everything (``--embedded``): the store's one engine (its
    ``engine`` lease, not partitions), the in-process bus and ``workers`` workers."""
    workers: int = 0
    executors: Any = None
    """The executor registry of an embedded server's workers (None: the built-in ones)."""
    listeners: tuple[Listener, ...] = ()
    """Called after every committed change of a run this server owns
    (``Runtime.add_listener``): the web UI's event streams hear of changes so."""
    hooks: tuple[Callable[[Runtime], object], ...] = ()
    """Called with the runtime before it starts (metrics attach themselves here)."""


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
    """Run the engine until ``stop`` (SIGTERM/SIGINT): ``STOPPED``. Raises
    ``EngineAlreadyRunning`` when an embedded engine holds the store for longer than
    ``wait_for_engine``, ``BusError`` when the bus's partition count is not the
    cluster's."""
    if options.embedded:
        check_embedded_store(options.store)
    else:
        check_urls(options.store, options.bus)
    stop = stop or Stop()
    stop.install()
    rt = _runtime(options)
    for listener in options.listeners:
        rt.add_listener(listener)
    for hook in options.hooks:
        hook(rt)
    me = f"{socket.gethostname()}/{os.getpid()}"
    if options.embedded:
        log.info(
            "tideflow server %s, embedded: the engine of store %s, the in-process bus and "
            "%d workers in this one process (engine lease TTL %gs)",
            me,
            shown(options.store),
            options.workers,
            options.lease_ttl,
        )
    else:
        log.info(
            "tideflow server %s: engine (scheduler, relay, timers, recovery; no workers) for "
            "store %s, bus %s (%d event partitions, delivery lease %gs, partition lease "
            "TTL %gs)",
            me,
            shown(options.store),
            shown(options.bus),
            rt.bus.partitions,
            rt.bus.lease,
            options.lease_ttl,
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
        log.info("stopped before it joined the cluster")
        return STOPPED
    try:
        if rt.partitions is None:
            log.info("serving: the store's engine, with %d workers", options.workers)
        else:
            log.info(
                "serving: member %s of the cluster, applying partitions %s of %d (the share "
                "of each server follows the live servers)",
                rt.partitions.owner,
                shown_partitions(rt.partitions.ownership.applied),
                rt.bus.partitions,
            )
        async with contextlib.AsyncExitStack() as services:
            for service in options.services:
                await services.enter_async_context(service(rt.client, stop))
            await stop.wait()
    finally:
        log.info("stopping: finishing the batch in progress, releasing the partitions")
        await rt.close()
        stop.uninstall()
    log.info("stopped")
    return STOPPED


def check_embedded_store(store: str) -> None:
    """An embedded server keeps its runs: not in memory."""
    if store.split(":", 1)[0].lower() == "memory":
        raise StoreError(
            "an embedded server's runs must outlive it: use sqlite:///file.db (the default, "
            ".tideflow/tideflow.db) or postgresql://…, not memory://"
        )


def _tracer_provider(service: str) -> Any:
    """OpenTelemetry tracing when ``OTEL_TRACES_EXPORTER`` asks for it (docs/observability.md)."""
    import os

    from tideflow.observability.tracing import provider_from_environment

    return provider_from_environment(os.environ, service)


def _runtime(options: ServerOptions) -> Runtime:
    common: dict[str, Any] = {
        "store": options.store,
        "recover": True,
        "lease_ttl": options.lease_ttl,
        "wait_for_engine": options.wait_for_engine,
        "tracer_provider": _tracer_provider("tideflow-server"),
        "schedules": True,
        **options.runtime,
    }
    if options.embedded:
        return Runtime(workers=options.workers, executors=options.executors, **common)
    from tideflow.bus import open_bus

    return Runtime(bus=open_bus(options.bus), workers=0, cluster=True, **common)


async def _started(rt: Runtime, options: ServerOptions, stop: Stop) -> bool:
    """Start the runtime (join the cluster, take and recover the free partitions of its
    share); False when ``stop`` came first."""
    if options.wait_for_engine > 0:
        patience = (
            "as long as it takes"
            if math.isinf(options.wait_for_engine)
            else (f"up to {options.wait_for_engine:g}s")
        )
        log.info(
            "joining the cluster; while an embedded engine holds the store, waiting %s", patience
        )
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


__all__ = [
    "STOPPED",
    "Listener",
    "ServerOptions",
    "Service",
    "check_embedded_store",
    "check_urls",
    "serve",
]
