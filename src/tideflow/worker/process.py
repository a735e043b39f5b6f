"""`tideflow worker`: a worker pool on a cluster's bus, until SIGTERM or SIGINT.

It takes tasks from its queues (``--queues``; every queue when none is given), holds
at most ``prefetch`` of them and runs at most ``concurrency`` at a time, importing the
functions of `python` steps from its own environment (``--path`` directories go first
on ``sys.path``). It needs no store, except for ``idempotent: false`` steps (below).

Stopping:

- **SIGTERM / SIGINT**: it takes no new task and hands back (nacks) at once those it
  holds but has not started; the attempts running get ``grace`` seconds to finish and
  report their outcome; what is still running then is cancelled and handed back (the
  bus delivers it to another worker, which runs it again as the same attempt with the
  same idempotency key). Exit 0.
- **SIGKILL** (or a crash, a lost machine): its deliveries are not renewed; once their
  lease expires the bus delivers them to another worker, which runs them again the same
  way (the run's history records ``started again … (delivery 2: lease_expired …)``).

``idempotent: false`` steps run only after their start is recorded (a second run could
repeat a side effect). A worker given the cluster's store (``--store``) publishes the
start and waits until the engine has committed it, reading the run's history
(``StoreStarts``); a worker without a store fails such an attempt with
``DurableStartUnavailable`` (not retryable) rather than run it unrecorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import socket
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tideflow.bus.base import Bus
from tideflow.errors import BusError, DurableStartUnavailable
from tideflow.lifecycle import Stop, shown
from tideflow.model import storable
from tideflow.model.events import EVENT_KINDS, RunRetried, TaskStarted
from tideflow.store.base import HistoryEntry, Store
from tideflow.worker.executors.registry import ExecutorRegistry
from tideflow.worker.interceptors import Interceptor
from tideflow.worker.pool import WorkerPool

log = logging.getLogger("tideflow.worker")

DEFAULT_GRACE = 30.0
START_TIMEOUT = 30.0
"""Seconds an ``idempotent: false`` attempt waits for the engine to record its start."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerOptions:
    bus: str
    queues: Sequence[str] | None = None
    """None: every queue."""
    concurrency: int = 8
    prefetch: int | None = None
    """Tasks held at most (running or waiting for a slot); ``concurrency`` when None."""
    paths: Sequence[str] = ()
    grace: float = DEFAULT_GRACE
    store: str | None = None
    max_output: int = storable.MAX_STEP_OUTPUT
    metrics: socket.socket | None = None
    """Serve Prometheus metrics on this listening socket (``--metrics``; the metrics
    extra)."""


class StoreStarts:
    """Durable starts for a worker with the cluster's store: publish the ``TaskStarted``,
    then read the run's history until it holds it (True) or holds what makes it a no-op:
    another start of the attempt, its end, a later attempt, the run's end (False)."""

    def __init__(self, bus: Bus, store: Store, *, timeout: float = START_TIMEOUT) -> None:
        self._bus = bus
        self._store = store
        self._timeout = timeout

    async def __call__(self, event: TaskStarted) -> bool:
        await self._bus.publish_events([event])
        deadline = time.monotonic() + self._timeout
        delay = 0.005
        while True:
            verdict = start_verdict(await self._store.history(event.run_id), event)
            if verdict is not None:
                return verdict
            if time.monotonic() >= deadline:
                raise DurableStartUnavailable(
                    f"the engine did not record the start of attempt {event.attempt} of "
                    f"{event.step_key} within {self._timeout:g}s; it was not run (is a "
                    "`tideflow server` running on this store and bus?)"
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.2)


def start_verdict(history: Sequence[HistoryEntry], event: TaskStarted) -> bool | None:
    """Whether the history shows ``event`` applied (True), made moot (False), or neither
    yet (None). Only the event's round counts (the entries from the round's
    ``run_retried`` on, before the next one): an earlier round's attempts and end say
    nothing about it, and a later round makes it moot."""
    subject = f"{event.step_key}:compensate" if event.compensation else event.step_key
    for entry in history:
        if entry.event.get("event_id") == event.event_id:
            return True
    wanted = event.round
    if wanted is None:  # not sent by a worker: the run's current round
        wanted = sum(entry.kind == _RETRIED for entry in history)
    current = 0
    for entry in history:
        if entry.kind == _RETRIED:
            current += 1
        if current != wanted:
            if current > wanted:
                return False  # retried since: the attempt is stale
            continue
        for t in entry.transitions:
            if t.get("subject") == "run" and t.get("new") in _RUN_ENDED:
                return False
            if t.get("subject") != subject or t.get("attempt") is None:
                continue
            attempt = int(t["attempt"])
            if attempt > event.attempt:
                return False
            if attempt == event.attempt and (
                t.get("new") != "running" or "started" in str(t.get("cause", ""))
            ):
                return False
    return None


_RETRIED = EVENT_KINDS[RunRetried]
_RUN_ENDED = frozenset(
    {"succeeded", "failed", "cancelled", "timed_out", "compensated", "compensation_failed"}
)


async def refuse_durable_start(event: TaskStarted) -> bool:
    raise DurableStartUnavailable(
        f"step {event.step_key} is idempotent: false: its start must be recorded before it "
        "runs, and this worker has no store; start `tideflow worker` with --store URL (the "
        "cluster's store)"
    )


def check_bus(url: str) -> None:
    if url.split(":", 1)[0].lower() in ("memory", "local"):
        raise BusError(
            "a worker's bus must be the cluster's: use redis://host:6379/0, not the "
            "in-process bus (memory://), which no engine in another process can reach"
        )


def add_paths(paths: Sequence[str]) -> None:
    """Put ``paths`` first on ``sys.path``, in the order given."""
    for path in reversed([os.path.abspath(p) for p in paths]):
        if path in sys.path:
            sys.path.remove(path)
        sys.path.insert(0, path)


async def work(options: WorkerOptions, stop: Stop | None = None) -> int:
    """Run the pool until ``stop`` (SIGTERM/SIGINT), then drain it; exit code 0."""
    from tideflow.bus import open_bus

    check_bus(options.bus)
    add_paths(options.paths)
    stop = stop or Stop()
    stop.install()
    bus = open_bus(options.bus)
    store = _store(options.store)
    executors = ExecutorRegistry()
    metrics: Any = None
    exposed: asyncio.Server | None = None
    try:
        await bus.open()
        if store is not None:
            await store.open()
        interceptors: list[Interceptor] = []
        if options.metrics is not None:
            metrics, exposed = await _serve_metrics(bus, options.metrics)
            interceptors.append(metrics.interceptor)
        pool = _pool(options, bus, store, executors, interceptors)
        pool.start()
        _started(options, bus)
        await stop.wait()
        log.info(
            "draining: %d task(s) held; taking no new ones, running ones get up to %gs",
            pool.running,
            options.grace,
        )
        left = await pool.drain(options.grace)
        log.info("stopped: %d task(s) still running after the grace were handed back", left)
    finally:
        stop.uninstall()
        if exposed is not None:
            exposed.close()
        with contextlib.suppress(Exception):
            await executors.aclose()
        await bus.close()
        if store is not None:
            await store.close()
    return 0


async def _serve_metrics(bus: Bus, sock: socket.socket) -> tuple[Any, asyncio.Server]:
    """The worker's metrics, served on ``sock`` (observability/metrics.py)."""
    from tideflow.observability.metrics import WorkerMetrics, serve_metrics

    metrics = WorkerMetrics(process=True).watch(bus)
    server = await serve_metrics(metrics, sock)
    where = server.sockets[0].getsockname()
    log.info("metrics on http://%s:%d/metrics", where[0], where[1])
    return metrics, server


def _store(url: str | None) -> Store | None:
    if url is None:
        return None
    from tideflow.store import open_store

    return open_store(url, auto_upgrade=False)


def _pool(
    options: WorkerOptions,
    bus: Bus,
    store: Store | None,
    executors: ExecutorRegistry,
    interceptors: Sequence[Interceptor] = (),
) -> WorkerPool:
    prefix = uuid.uuid4().hex[:10]
    ids = itertools.count(1)
    starts: Any = StoreStarts(bus, store) if store is not None else refuse_durable_start
    return WorkerPool(
        bus,
        executors,
        concurrency=options.concurrency,
        prefetch=options.prefetch,
        queues=list(options.queues) if options.queues else None,
        clock=time.time,
        new_event_id=lambda: f"{prefix}-{next(ids)}",
        start_durably=starts,
        max_output=options.max_output,
        interceptors=[*_tracing(), *interceptors],
    )


def _tracing() -> list[Any]:
    """The attempt-span interceptor when ``OTEL_TRACES_EXPORTER`` asks for tracing."""
    from tideflow.observability.tracing import Tracing, provider_from_environment

    provider = provider_from_environment(os.environ, "tideflow-worker")
    return [] if provider is None else [Tracing(provider).interceptor]


def _started(options: WorkerOptions, bus: Bus) -> None:
    queues = ", ".join(options.queues) if options.queues else "every queue"
    durable = (
        f"recorded through the store {shown(options.store)}"
        if options.store
        else "refused (no --store)"
    )
    log.info(
        "tideflow worker %s/%d: taking tasks from %s on bus %s; concurrency %d, prefetch %d, "
        "delivery lease %gs; durable starts (idempotent: false steps) %s; imports from %s",
        socket.gethostname(),
        os.getpid(),
        queues,
        shown(options.bus),
        options.concurrency,
        max(options.prefetch or options.concurrency, options.concurrency),
        bus.lease,
        durable,
        sys.path[0] if options.paths else "the installed environment",
    )


__all__ = [
    "DEFAULT_GRACE",
    "StoreStarts",
    "WorkerOptions",
    "add_paths",
    "check_bus",
    "refuse_durable_start",
    "start_verdict",
    "work",
]
