"""The timer wheel: the armed timers due soon, held in memory on a Clock.

Every armed timer is a row in the store (``Store.due_timers``), written by the
commit that armed it. The wheel holds only the timers due within ``horizon``
seconds (at most ``capacity`` loaded at a time): a timer armed further out stays
in the store alone, and the wheel sets one wake-up for the soonest of those. At
that wake-up (and at start) it *refills*: it loads what falls due within the
horizon, fires what is already due, and sets the next wake-up from the store.
There is no polling: without timers beyond the horizon there is no wake-up.
A run waiting on a timer a month away therefore costs no memory until then. The wake-up
and the refills are a ``Wakeup`` (runtime/wakeup.py), the one mechanism the schedules'
slots use too: no wake-up or refill asked for is lost, whenever it arrives.

In a cluster each server's wheel holds and fires only the timers of the runs it owns
(``owns``): a refill reads the stored rows of every partition and skips the others'
(filtered here, not in the query: fine for this cut, see docs/deployment.md), and
``drop`` lets go of a partition given up. A wake-up set for another server's timer
only costs a refill.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable

from tideflow.runtime.clock import Clock, TimerHandle
from tideflow.runtime.wakeup import Wakeup
from tideflow.store.base import DueTimer

log = logging.getLogger("tideflow.timers")

DEFAULT_HORIZON = 60.0
"""Seconds ahead the wheel holds timers in memory."""
DEFAULT_CAPACITY = 10_000
"""Most stored timers loaded by one refill."""

DueTimers = Callable[..., Awaitable[list[DueTimer]]]
"""``Store.due_timers``."""


class TimerWheel:
    def __init__(
        self,
        clock: Clock,
        fire: Callable[[str, str], None],
        due_timers: DueTimers,
        *,
        horizon: float = DEFAULT_HORIZON,
        capacity: int = DEFAULT_CAPACITY,
        owns: Callable[[str], bool] | None = None,
    ) -> None:
        """``owns(run_id)``: whether this engine fires the run's timers (None: all)."""
        self._clock = clock
        self._owns = owns
        self._fire = fire
        self._due = due_timers
        self._horizon = horizon
        self._capacity = capacity
        self._handles: dict[tuple[str, str], TimerHandle] = {}
        self._wakeup = Wakeup(clock, self._load, what="timers could not be loaded", log=log)

    def __len__(self) -> int:
        return len(self._handles)

    def arm(self, run_id: str, timer_id: str, fire_at: float) -> None:
        """Hold a timer just armed (committed) if it falls due within the horizon; a later
        one only moves the wake-up earlier (its row brings it back in time)."""
        if fire_at > self._clock.now() + self._horizon:
            self.cancel(run_id, timer_id)  # re-armed further out
            self._wake_at(fire_at)
            return
        self._hold(run_id, timer_id, fire_at)

    def holds(self, run_id: str, timer_id: str) -> bool:
        """Whether the timer is held here, to fire when it falls due."""
        return (run_id, timer_id) in self._handles

    def cancel(self, run_id: str, timer_id: str) -> None:
        handle = self._handles.pop((run_id, timer_id), None)
        if handle is not None:
            handle.cancel()

    def drop(self, gone: Callable[[str], bool]) -> None:
        """Let go of the held timers of the runs ``gone`` says this engine gave up."""
        for key in [key for key in self._handles if gone(key[0])]:
            self._handles.pop(key).cancel()

    async def refill(self) -> None:
        """Load the stored timers due within the horizon, fire those already due, and set
        the next wake-up. Refills never overlap: this waits for one that begins after
        the call (what it raised is raised here; the wake-up then tries again)."""
        await self._wakeup.run()

    def close(self) -> None:
        self._wakeup.close()
        for handle in self._handles.values():
            handle.cancel()
        self._handles.clear()

    async def _load(self) -> float | None:
        """One refill: the next wake-up (None: no stored timer beyond the horizon)."""
        now = self._clock.now()
        until = now + self._horizon
        rows = await self._due(until, self._capacity)
        for row in rows:
            key = (row.run_id, row.timer_id)
            if key in self._handles:
                continue  # held already (re-armed in memory, e.g. by recovery)
            if self._owns is not None and not self._owns(row.run_id):
                continue  # another server's
            if row.fire_at <= now:
                self._fire(*key)
            else:
                self._hold(row.run_id, row.timer_id, row.fire_at)
        if len(rows) >= self._capacity:  # more within the horizon: load them when these fire
            return rows[-1].fire_at
        later = await self._due(math.inf, 1, after=until)
        return later[0].fire_at if later else None

    def _hold(self, run_id: str, timer_id: str, fire_at: float) -> None:
        key = (run_id, timer_id)
        old = self._handles.pop(key, None)
        if old is not None:
            old.cancel()
        self._handles[key] = self._clock.call_at(fire_at, lambda: self._expire(key))

    def _wake_at(self, when: float) -> None:
        self._wakeup.at(when)

    def _expire(self, key: tuple[str, str]) -> None:
        if self._handles.pop(key, None) is not None:
            self._fire(*key)
