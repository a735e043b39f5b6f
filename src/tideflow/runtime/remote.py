"""A client in a process with no engine, on a cluster's store and bus (cluster mode).

::

    async with Client.connect(store="postgresql://…", bus="redis://…") as client:
        run_id = await client.start("flows/order.yaml", {"order_id": "A1"})
        await client.signal(run_id, "approval", {"approved": True})
        result = await client.wait(run_id)

The engine (a `tideflow server`) owns the runs; this client only talks to it through the
bus and reads what it committed from the store (``BusLink``):

- a new run is stored ``pending`` by the client (so it is durable before anything else
  happens), then its ``RunStarted`` is published, tried ``START_TRIES`` times (50 ms
  doubling between tries); when the bus keeps refusing it, ``start`` still returns the
  run's id, with a warning: the stored ``pending`` row is the start's outbox, and the
  server's reconciliation sweep (runtime/sweep.py) publishes it once the run has been
  pending for one sweep interval (or the next server start does); signals and cancels
  are published and the call returns (the engine applies them within milliseconds);
- ``retry`` publishes its ``RunRetried`` and waits until the engine has committed it (it
  reports the run's status after the retry), up to ``apply_timeout`` seconds
  (``EngineUnreachable`` when no engine applied it by then);
- reads (``get``, ``state``, ``history``) load the run from the store each time, never a
  cache: the engine changes it;
- ``wait`` does not poll: the engine announces the runs each committed batch ended on
  the bus (``Bus.run_ends``, at most once), and the client holds one subscription to
  them, opened at its first ``wait`` and kept until it closes, however many waits run
  (a dict of run id -> the futures of its waits). A wait registers its future, then
  reads the run's summary row once (after subscribing, so an end announced in between
  is not missed), and then sleeps until the run's end is heard, reading the summary
  again only every ``RECHECK`` seconds: the safety net for an announcement lost (the
  bus is at most once, an engine may die between its commit and the announcement, a
  client's link may be down for a moment). A subscription that cannot be opened is
  tried again in the background (the waits meanwhile end by those rechecks).
  ``retry`` still polls the history (10 ms backing off to 0.5 s) for its event: a
  retry does not end the run, so no run end announces it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

from tideflow.bus.base import NO_HEADERS, Bus, Headers, RunEnded, Stream, with_headers
from tideflow.bus.closing import cancel_and_wait
from tideflow.client import Client, EngineLink
from tideflow.errors import EngineUnreachable
from tideflow.model import storable
from tideflow.model.events import Event, RunStarted
from tideflow.model.run import RunState
from tideflow.model.states import RUN_TERMINAL
from tideflow.runtime.catalog import Catalog
from tideflow.runtime.clock import Clock, SystemClock
from tideflow.runtime.gathering import Gathering
from tideflow.runtime.result import RunResult, result_of
from tideflow.runtime.runs import Plans, RunCache
from tideflow.store.base import Store
from tideflow.worker.executors.registry import ExecutorRegistry

APPLY_TIMEOUT = 30.0
"""Seconds a ``retry`` waits for the engine to commit its event."""
START_TRIES = 4
"""Publications of a new run's start before ``start`` leaves it to the server's sweep."""
START_FIRST_DELAY = 0.05
FIRST_POLL = 0.01
LAST_POLL = 0.5
RECHECK = 2.0
"""Seconds between two reads of a waited run's summary while its end is not heard: how
late a ``wait`` returns at worst when the announcement was lost, and one indexed read per
waiting run per this many seconds."""
_TERMINAL = frozenset(status.value for status in RUN_TERMINAL)
log = logging.getLogger("tideflow.client")


class BusLink(EngineLink):
    """Events onto the bus for the cluster's engine; run state read from the store."""

    def __init__(
        self, store: Store, bus: Bus, plans: Plans, *, apply_timeout: float = APPLY_TIMEOUT
    ) -> None:
        self._store = store
        self._bus = bus
        self._plans = plans
        self._apply_timeout = apply_timeout
        self._waiting: dict[str, list[asyncio.Future[None]]] = {}
        """Run id -> the futures of its waits, each done when the run's end is heard."""
        self._listener: asyncio.Task[None] | None = None
        self._first_try = asyncio.Event()
        """Set once the subscription was first tried (opened or failed)."""
        self._starts: Gathering[RunStarted, None] = Gathering(self._publish_starts)
        """Starts published together (``start_run``)."""

    async def deliver(self, events: Sequence[Event], headers: Headers = NO_HEADERS) -> None:
        await self._bus.publish_events(with_headers(events, headers))

    async def commit(self, events: Sequence[Event], headers: Headers = NO_HEADERS) -> None:
        await self._bus.publish_events(with_headers(events, headers))
        for event in events:
            await self._applied(event)

    async def _applied(self, event: Event) -> None:
        """Return once the store's history holds ``event`` (the engine committed it)."""
        deadline = time.monotonic() + self._apply_timeout
        delay = FIRST_POLL
        while True:
            history = await self._store.history(event.run_id)
            if any(entry.event.get("event_id") == event.event_id for entry in history):
                return
            if time.monotonic() >= deadline:
                raise EngineUnreachable(
                    f"run {event.run_id}: no engine applied {type(event).__name__} within "
                    f"{self._apply_timeout:g}s; it is on the bus and is applied when a "
                    "`tideflow server` runs on this store and bus"
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, LAST_POLL)

    async def start_run(self, state: RunState, event: RunStarted) -> None:
        """Publish the start of a run just stored, with the starts stored meanwhile (one
        publication for them all: runtime/gathering.py)."""
        await self._starts(event)

    async def _publish_starts(self, events: list[RunStarted]) -> list[None]:
        """Publish starts of runs just stored; the runs are durable already, so a bus that
        keeps refusing them costs latency, not the runs (see the module docstring)."""
        delay = START_FIRST_DELAY
        for tries in range(1, START_TRIES + 1):
            try:
                await self._bus.publish_events(events)
                break
            except Exception as exc:
                if tries == START_TRIES:
                    log.warning(
                        "%s stored (pending) but %s could not be published after %d tries "
                        "(%s: %s): a `tideflow server`'s sweep starts %s once pending one "
                        "sweep interval, or the next server start does",
                        _runs(events),
                        "its start" if len(events) == 1 else "their starts",
                        tries,
                        type(exc).__name__,
                        exc,
                        "it" if len(events) == 1 else "them",
                    )
                    break
            await asyncio.sleep(delay)
            delay *= 2
        return [None] * len(events)

    async def state(self, run_id: str) -> RunState:
        return await load_state(self._store, self._plans, run_id)

    async def wait(self, run_id: str, timeout: float | None = None) -> RunResult:
        """The run's result once it has ended: woken by its end on the bus, read again every
        ``RECHECK`` seconds until then (see the module docstring)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        await self._listening(timeout)
        heard = self._register(run_id)
        try:
            while (await self._store.get_run(run_id)).status not in _TERMINAL:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"run {run_id} had not ended after {timeout:g}s")
                if heard.done():  # an end heard that the store no longer shows (retried)
                    self._unregister(run_id, heard)
                    heard = self._register(run_id)
                await asyncio.wait(
                    (heard,), timeout=RECHECK if left is None else min(RECHECK, left)
                )
        finally:
            self._unregister(run_id, heard)
        state = await self.state(run_id)
        return result_of(state, await self._plans.get(state.plan_hash))

    def _register(self, run_id: str) -> asyncio.Future[None]:
        heard: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(run_id, []).append(heard)
        return heard

    def _unregister(self, run_id: str, heard: asyncio.Future[None]) -> None:
        futures = self._waiting.get(run_id)
        if futures is not None and heard in futures:
            futures.remove(heard)
            if not futures:
                del self._waiting[run_id]

    def _heard(self, end: RunEnded) -> None:
        for heard in self._waiting.pop(end.run_id, ()):
            if not heard.done():
                heard.set_result(None)

    async def _listening(self, limit: float | None) -> None:
        """Open the subscription at the first wait; return once it was tried (or after
        ``limit`` seconds: the wait's timeout)."""
        if self._listener is None:
            self._listener = asyncio.get_running_loop().create_task(self._listen())
        if not self._first_try.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(limit):
                    await self._first_try.wait()

    async def _listen(self) -> None:
        """Hold the client's one run-end subscription, opening it again when it fails (the
        first failure of a row is a warning, the others DEBUG)."""
        delay, failures = FIRST_POLL, 0
        while True:
            try:
                ends: Stream[RunEnded] = await self._bus.run_ends()
            except Exception as exc:
                failures += 1
                log.log(
                    logging.WARNING if failures == 1 else logging.DEBUG,
                    "cannot hear run ends (%s: %s): waits read the store every %gs until "
                    "then; trying again in %.2fs",
                    type(exc).__name__,
                    exc,
                    RECHECK,
                    delay,
                )
                self._first_try.set()
                await asyncio.sleep(delay)
                delay = min(delay * 2, RECHECK)
                continue
            if failures:
                log.info("hearing run ends again (after %d failed tries)", failures)
            self._first_try.set()
            delay, failures = FIRST_POLL, 0
            try:
                async for end in ends:
                    self._heard(end)
            finally:
                await ends.aclose()

    async def close(self) -> None:
        """Drop the subscription (the client is closing)."""
        listener, self._listener = self._listener, None
        if listener is not None:
            await cancel_and_wait(listener)


def _runs(events: Sequence[Event]) -> str:
    """``run X is`` / ``N runs (X, Y, Z, …) are``: what a log line says of ``events``."""
    if len(events) == 1:
        return f"run {events[0].run_id} is"
    shown = ", ".join(e.run_id for e in events[:3])
    return f"{len(events)} runs ({shown}{', …' if len(events) > 3 else ''}) are"


async def load_state(store: Store, plans: Plans, run_id: str) -> RunState:
    """The run's state as the store holds it now (snapshot plus the events after it)."""
    cache = RunCache(store, plans, size=1)
    return (await cache.get(run_id)).state


@contextlib.asynccontextmanager
async def connect(
    store: Store | str,
    bus: Bus | str,
    *,
    executors: ExecutorRegistry | None = None,
    clock: Clock | None = None,
    max_step_output: int = storable.MAX_STEP_OUTPUT,
    max_run_input: int = storable.MAX_RUN_INPUT,
    apply_timeout: float = APPLY_TIMEOUT,
    tracer_provider: Any = None,
) -> AsyncIterator[Client]:
    """A client on a cluster's store and bus, opened (and closed on exit); no engine.
    ``tracer_provider``: the runs it starts join the caller's trace (docs/observability.md)."""
    from tideflow.observability.tracing import Tracing

    tracing = None if tracer_provider is None else Tracing(tracer_provider)
    if isinstance(store, str):
        from tideflow.store import open_store

        store = open_store(store)
    if isinstance(bus, str):
        from tideflow.bus import open_bus

        bus = open_bus(bus)
    clock = clock or SystemClock()
    catalog = Catalog(
        store, executors or ExecutorRegistry(), clock=clock, max_run_input=max_run_input
    )
    if store.compile_plan is None:
        store.compile_plan = catalog.compile_stored
    prefix = uuid.uuid4().hex[:10]
    counter = iter(range(1, 1 << 62))
    await store.open()
    try:
        await bus.open()
        link = BusLink(store, bus, catalog.plans, apply_timeout=apply_timeout)
        try:
            yield Client(
                store,
                link,
                catalog,
                clock=clock,
                new_event_id=lambda: f"{prefix}-{next(counter)}",
                max_step_output=max_step_output,
                bus=bus,
                tracing=tracing,
            )
        finally:
            await link.close()
            await bus.close()
    finally:
        await store.close()


__all__ = ["APPLY_TIMEOUT", "RECHECK", "BusLink", "connect", "load_state"]
