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
- ``wait`` polls the run's summary row (one indexed read) with a backoff from 10 ms to
  0.5 s until the run has ended: the store has no notification channel for run ends
  (its inbox channel carries events to the engine, not results to clients).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Sequence

from tideflow.bus.base import Bus
from tideflow.client import Client, EngineLink
from tideflow.errors import EngineUnreachable
from tideflow.model import storable
from tideflow.model.events import Event, RunStarted
from tideflow.model.run import RunState
from tideflow.model.states import RUN_TERMINAL
from tideflow.runtime.catalog import Catalog
from tideflow.runtime.clock import Clock, SystemClock
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

    async def deliver(self, events: Sequence[Event]) -> None:
        await self._bus.publish_events(events)

    async def commit(self, events: Sequence[Event]) -> None:
        await self._bus.publish_events(events)
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
        """Publish the start of a run just stored; the run is durable already, so a bus
        that keeps refusing it costs latency, not the run (see the module docstring)."""
        delay = START_FIRST_DELAY
        for tries in range(1, START_TRIES + 1):
            try:
                await self._bus.publish_events([event])
                return
            except Exception as exc:
                if tries == START_TRIES:
                    log.warning(
                        "run %s is stored (pending) but its start could not be published "
                        "after %d tries (%s: %s): a `tideflow server`'s sweep starts it once "
                        "it has been pending one sweep interval, or the next server start does",
                        state.run_id,
                        tries,
                        type(exc).__name__,
                        exc,
                    )
                    return
            await asyncio.sleep(delay)
            delay *= 2

    async def state(self, run_id: str) -> RunState:
        return await load_state(self._store, self._plans, run_id)

    async def wait(self, run_id: str, timeout: float | None = None) -> RunResult:
        """Poll the run's summary until it has ended (see the module docstring)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = FIRST_POLL
        while (await self._store.get_run(run_id)).status not in _TERMINAL:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(f"run {run_id} had not ended after {timeout:g}s")
            await asyncio.sleep(delay if left is None else min(delay, left))
            delay = min(delay * 2, LAST_POLL)
        state = await self.state(run_id)
        return result_of(state, await self._plans.get(state.plan_hash))


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
) -> AsyncIterator[Client]:
    """A client on a cluster's store and bus, opened (and closed on exit); no engine."""
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
        try:
            yield Client(
                store,
                BusLink(store, bus, catalog.plans, apply_timeout=apply_timeout),
                catalog,
                clock=clock,
                new_event_id=lambda: f"{prefix}-{next(counter)}",
                max_step_output=max_step_output,
            )
        finally:
            await bus.close()
    finally:
        await store.close()


__all__ = ["APPLY_TIMEOUT", "BusLink", "connect", "load_state"]
