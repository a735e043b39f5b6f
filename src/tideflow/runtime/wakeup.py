"""One wake-up for a set of durable rows, and the rounds it runs: the one mechanism that
arms time in an engine.

Durable timers (``sleep``, retry backoffs, deadlines, the run timeout: runtime/timers.py)
and schedule slots (runtime/schedule_timers.py) are rows in the store with a fire time.
Each holder of such rows keeps one ``Wakeup``: a callback on the ``Clock`` for the
soonest fire time it knows of, and a *round* (a coroutine of the holder) that reads the
store, does what is due and returns the next fire time (None: nothing left to wake for).

What it guarantees, whatever the order in which things arrive on the event loop:

- rounds never overlap;
- a round is **asked for** by the wake-up falling due, by ``ask()`` (a notification:
  something changed) or by ``run()`` (a caller that waits), and every ask is followed by
  the whole of a round that *began after it* (an ask that comes while a round runs makes
  one more round after it; the check and the end of the rounds happen in one step of
  the loop, so no ask can fall between them and be lost);
- after every round the wake-up is armed for the soonest of what the round returned and
  of every ``at()`` asked for while it ran (a row committed after the round's read is not
  forgotten);
- a round that raises is logged, its callers get the exception, and the wake-up is armed
  ``retry_after`` seconds later (earlier-only): a store that is down delays, never stops;
- a wake-up asks for no round before its time on the clock: the event loop's own clock,
  which ``SystemClock.call_at`` rides on, drifts from the wall clock and may call back a
  fraction of a millisecond early; that wake-up is armed again for what is left.

The old schedule path lost wake-ups here: its round was a separate task whose "in
progress" mark was cleared by the caller that started it, one loop step after the task
ended; a wake-up that arrived in between (a wake-up fired a moment early and re-armed
for the same row does exactly that) found the mark, asked for "one more round" of a
round that was over, and nothing re-armed: the schedules stopped until a sweep.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable

from tideflow.runtime.clock import Clock, TimerHandle

__all__ = ["RETRY_AFTER", "Round", "Wakeup"]

RETRY_AFTER = 1.0
"""Seconds before a round that failed (the store is down) is tried again."""

Round = Callable[[], Awaitable[float | None]]
"""Does what is due and returns the next fire time (None: no wake-up needed)."""


class Wakeup:
    def __init__(
        self,
        clock: Clock,
        round: Round,
        *,
        what: str,
        log: logging.Logger,
        retry_after: float = RETRY_AFTER,
    ) -> None:
        """``what``: how the log names a round that failed (``"timers could not be
        loaded"``)."""
        self._clock = clock
        self._round = round
        self._what = what
        self._log = log
        self._retry_after = retry_after
        self._wake: tuple[float, TimerHandle] | None = None
        self._asked = 0
        """Asks so far, numbered from 1."""
        self._served = 0
        """Every ask up to this number was followed by a round that ended."""
        self._failed: tuple[int, int, Exception] | None = None
        """The latest round that failed: the asks it served (after, up to) and its error."""
        self._since = math.inf
        """The soonest ``at()`` asked for while a round runs or is asked for."""
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def busy(self) -> bool:
        """Whether a round runs or is asked for."""
        return self._task is not None

    def at(self, when: float) -> None:
        """Wake up at ``when`` unless the wake-up set comes first."""
        if self._closed:
            return
        if self._task is not None:
            self._since = min(self._since, when)
        if self._wake is not None:
            if self._wake[0] <= when:
                return
            self._wake[1].cancel()
        self._arm(when)

    def ask(self) -> None:
        """Something changed: run a round soon (one that begins after this call)."""
        if self._closed:
            return
        self._asked += 1
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._rounds())

    async def run(self) -> None:
        """Run a round that begins after this call and wait for its end; what it raised
        is raised here (the wake-up is then armed to try again)."""
        if self._closed:
            return
        self.ask()
        mine = self._asked
        while self._served < mine and self._task is not None:
            await asyncio.shield(self._task)
        failed = self._failed
        if failed is not None and failed[0] < mine <= failed[1]:
            raise failed[2]

    async def idle(self) -> None:
        """Wait until no round runs or is asked for."""
        while self._task is not None:
            await asyncio.shield(self._task)

    def close(self) -> None:
        """No more rounds or wake-ups (a round in progress ends by itself)."""
        self._closed = True
        if self._wake is not None:
            self._wake[1].cancel()
            self._wake = None

    # -- inside ---------------------------------------------------------------------

    def _arm(self, when: float) -> None:
        self._wake = (when, self._clock.call_at(when, lambda: self._woken(when)))

    def _woken(self, when: float) -> None:
        self._wake = None
        if self._clock.now() < when:
            # the event loop's clock ran ahead of the wall clock (they drift apart by a
            # fraction of a millisecond): a round now would find nothing due yet
            self._arm(when)
            return
        self.ask()

    async def _rounds(self) -> None:
        try:
            while self._served < self._asked and not self._closed:
                await self._one()
        finally:
            # in the step that checked for asks: an ask made after this starts a new task
            self._task = None

    async def _one(self) -> None:
        served, asked = self._served, self._asked
        try:
            upcoming = await self._round()
        except Exception as exc:  # the store is down: try again a little later
            self._served = asked
            self._failed = (served, asked, exc)
            self._log.warning(
                "%s (%s: %s); trying again in %gs",
                self._what, type(exc).__name__, exc, self._retry_after,
            )  # fmt: skip
            self.at(self._clock.now() + self._retry_after)
            self._since = math.inf  # no round settles: the wake-ups set stay as they are
            return
        self._served = asked
        self._settle((math.inf if upcoming is None else upcoming), self._since)

    def _settle(self, upcoming: float, since: float) -> None:
        """Arm the wake-up for the soonest of what the round found and what was asked
        for meanwhile (replacing the one set: the round read the store after it)."""
        when = min(upcoming, since)
        self._since = math.inf
        if self._closed or (self._wake is not None and self._wake[0] == when):
            return
        if self._wake is not None:
            self._wake[1].cancel()
            self._wake = None
        if when < math.inf:
            self._arm(when)
