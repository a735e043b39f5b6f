"""The reconciliation sweep: now and then, repair what a lost notification leaves.

The engine is driven by notifications, never by polling: a commit arms its timers in the
wheel and hands its effects to the relay, a client's start publishes the run's
``RunStarted``. A notification can be lost while the row it announces is durable: a
commit that reported a failure but went through (its timers and outbox rows are in the
store, nothing armed or relayed them), a client whose start publish failed after the run
was stored (``pending``), a server stopped between a commit and its relay. Recovery
repairs all of it when an engine starts; the sweep repairs it while the engine runs,
every ``interval`` seconds (``Runtime(sweep_interval=)``, `tideflow server
--sweep-interval`, ``TIDEFLOW_SWEEP_INTERVAL``; default 30 s; 0 turns it off), with one
indexed query per part and nothing more when there is nothing to repair:

- **due timers** (``Store.due_timers``, index ``timers_due``): a timer row due for
  longer than one interval that the wheel does not hold and the relay is not publishing
  is fired (a second ``TimerFired`` for a timer that fired already changes nothing: the
  core ignores a timer that is no longer armed);
- **unrelayed outbox rows** (``Store.pending_outbox``, index ``outbox_created``): a row
  that was pending at the previous round and still is, and that this relay does not
  answer for (``Relay.owed``: being tried, or relayed and waiting for the next commit to
  forget it), is relayed, so what is in flight is never relayed twice beside itself;
- **lost starts** (``Store.pending_runs``, index ``runs_pending``): the engine's admitter
  (runtime/admission.py) admits pending runs from the store whenever room frees or a start
  arrives; when it is idle with room and the queue still holds a run created more than one
  interval ago, that run's start was lost (a client whose publish failed after the run
  was stored): the round admits it, and counts it. A run that waits because the engine is
  at its admission bound is no repair: it is queued, and the round reads nothing then.

Each part reads at most ``BATCH`` rows a round (what is left comes in the next rounds)
and keeps only the runs ``owns`` accepts (run id -> this engine owns the run's
partition; by default every run), so with several active servers each sweeps its own.

What the sweep does **not** do: hand attempts in flight back (``Store.expired_tasks``).
Recovery may, at start, because no engine and no embedded worker was live then; while
this engine runs, a task row says nothing about whether its attempt is alive (the rows
are written by commits and never claimed: a worker holds a task through the bus's own
lease, not the row's), so every row of a running attempt would look expired and be
dispatched again or reported lost. The bus's leases already hand back what a dead
worker held (``XAUTOCLAIM`` on Redis, ``AckWait`` on NATS), and a task publish that
failed is retried by the relay until it succeeds.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from tideflow.bus.closing import cancel_and_wait
from tideflow.runtime.clock import Clock
from tideflow.runtime.observers import Observers
from tideflow.runtime.recovery import Owns, every_run
from tideflow.runtime.relay import Relay, timer_key
from tideflow.runtime.runs import RunCache
from tideflow.runtime.timers import TimerWheel
from tideflow.store.base import Store

log = logging.getLogger("tideflow.sweep")

DEFAULT_INTERVAL = 30.0
"""Seconds between two rounds of the sweep."""
INTERVAL_ENV = "TIDEFLOW_SWEEP_INTERVAL"
BATCH = 1000
"""Most rows one part reads in a round."""
STATEMENTS_PER_ROUND = 3
"""SQL statements of a round that finds nothing to repair: one query per part."""
LostStarts = Callable[[float], Awaitable[int]]
"""Admit the pending runs the admitter missed (``Admitter.repair``): how many of them were
created before the given time (their start was lost)."""


@dataclass(slots=True)
class Repairs:
    """What one round repaired."""

    timers: int = 0
    outbox: int = 0
    starts: int = 0

    def __bool__(self) -> bool:
        return bool(self.timers or self.outbox or self.starts)

    def __str__(self) -> str:
        parts = [
            f"{self.timers} due timer(s) fired" if self.timers else "",
            f"{self.outbox} outbox row(s) relayed" if self.outbox else "",
            f"{self.starts} pending run(s) whose start was lost admitted" if self.starts else "",
        ]
        return ", ".join(part for part in parts if part) or "nothing"


async def fire_due_timers(
    store: Store,
    timers: TimerWheel,
    relay: Relay,
    *,
    before: float,
    owns: Owns = every_run,
    limit: int = BATCH,
) -> int:
    """Fire the timers due at or before ``before`` that the wheel does not hold and the
    relay is not publishing; how many were fired."""
    fired = 0
    for row in await store.due_timers(before, limit):
        if not owns(row.run_id) or timers.holds(row.run_id, row.timer_id):
            continue
        if relay.busy(timer_key(row.run_id, row.timer_id)):
            continue
        relay.timer_fired(row.run_id, row.timer_id)
        fired += 1
    return fired


class OutboxWatch:
    """The outbox part: remembers which rows were pending at the previous round."""

    def __init__(self) -> None:
        self._seen: set[str] = set()

    async def relay_stuck(
        self, store: Store, relay: Relay, *, owns: Owns = every_run, limit: int = BATCH
    ) -> int:
        """Relay the rows pending at the previous round and now that the relay does not
        answer for; how many were relayed."""
        owed = relay.owed()  # before the read: see Relay.owed
        items = [item for item in await store.pending_outbox(limit) if item.id not in owed]
        stuck = [item for item in items if item.id in self._seen and owns(item.run_id)]
        self._seen = {item.id for item in items}
        if stuck:
            await relay.relay(
                [item.command for item in stuck], dict(enumerate(item.id for item in stuck))
            )
        return len(stuck)


class Sweep:
    """The engine's periodic task: one ``round`` every ``interval`` seconds."""

    def __init__(
        self,
        *,
        store: Store,
        runs: RunCache,
        timers: TimerWheel,
        relay: Relay,
        clock: Clock,
        interval: float = DEFAULT_INTERVAL,
        owns: Owns = every_run,
        observers: Observers | None = None,
        lost_starts: LostStarts | None = None,
    ) -> None:
        """``lost_starts``: the engine's admitter's repair (None: no start is repaired)."""
        self.interval = check_interval(interval)
        self._lost_starts = lost_starts
        self._observers = observers if observers is not None else Observers()
        self.owns = owns
        """Which runs this engine sweeps (set by whoever assigns partitions)."""
        self._store = store
        self._runs = runs
        self._timers = timers
        self._relay = relay
        self._clock = clock
        self._outbox = OutboxWatch()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Sweep every ``interval`` seconds from now on (never when it is 0)."""
        if self.interval > 0 and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="tideflow-sweep")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None

    async def round(self) -> Repairs:
        """Repair what the store says a lost notification left (see the module docstring)."""
        now = self._clock.now()
        before = now - self.interval
        owns = self.owns
        store, relay = self._store, self._relay
        repairs = Repairs(
            timers=await fire_due_timers(store, self._timers, relay, before=before, owns=owns),
            outbox=await self._outbox.relay_stuck(store, relay, owns=owns),
            starts=0 if self._lost_starts is None else await self._lost_starts(before),
        )
        if repairs:
            log.info("sweep repaired what lost notifications left: %s", repairs)
            for kind, count in (
                ("timer", repairs.timers),
                ("outbox", repairs.outbox),
                ("start", repairs.starts),
            ):
                if count:
                    self._observers.swept(kind, count)
        return repairs

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.round()
            except Exception as exc:  # the store is down: the next round tries again
                log.warning(
                    "the sweep could not read the store (%s: %s); next round in %gs",
                    type(exc).__name__,
                    exc,
                    self.interval,
                )


def check_interval(interval: float) -> float:
    """A sweep interval must be a finite number of seconds, 0 (off) or more."""
    if not (isinstance(interval, int | float) and math.isfinite(interval) and interval >= 0):
        raise ValueError(
            f"sweep interval {interval!r}: give seconds between two sweeps (e.g. 30), or 0 "
            "to turn the sweep off"
        )
    return float(interval)


def interval_from_environment(environ: Mapping[str, str]) -> float:
    """``TIDEFLOW_SWEEP_INTERVAL`` seconds, or the default when it is unset or empty."""
    text = environ.get(INTERVAL_ENV, "").strip()
    if not text:
        return DEFAULT_INTERVAL
    try:
        return check_interval(float(text))
    except ValueError:
        raise ValueError(
            f"{INTERVAL_ENV}={text!r}: give seconds between two sweeps (e.g. 30), or 0 to "
            "turn the sweep off"
        ) from None


__all__ = [
    "BATCH",
    "DEFAULT_INTERVAL",
    "INTERVAL_ENV",
    "STATEMENTS_PER_ROUND",
    "OutboxWatch",
    "Owns",
    "Repairs",
    "Sweep",
    "check_interval",
    "every_run",
    "fire_due_timers",
    "interval_from_environment",
]
