"""A virtual-time event loop and the clock that reads it: one timeline for everything.

The engine measures time in three ways: the runtime's ``Clock`` (timers, leases,
deadlines), the local bus's clock (delivery leases, nack delays) and the event loop
itself (``asyncio.sleep`` in retry backoffs, heartbeats, sweeps; ``asyncio.timeout``).
A ``ManualClock`` only covers the first two, so a simulated ``sleep: 1h`` would still
leave a relay backoff waiting on the wall clock. ``VirtualLoop`` makes the loop's own
``time()`` virtual and, whenever the loop has nothing ready, jumps it to the next
scheduled callback instead of blocking in ``select``: the whole process runs on one
virtual timeline, as fast as the CPU goes, and a run that sleeps an hour ends in
milliseconds. ``SimClock`` is the runtime's (and the bus's) clock on that timeline.

Determinism: one thread, one loop, callbacks in the order the loop schedules them (FIFO
for ready ones, then by time and insertion for timers), no wall clock: the same program
does the same thing in the same order. ``run_in_executor`` runs the function inline
(a thread's completion would land at a wall-clock moment). What would break it: a
thread started by the code under test that calls back into the loop (the SQLite
store's thread: the simulation's SQLite store runs its calls inline, see
``stores.py``), or iteration over ``set``/``dict`` keyed by ``str`` hashes across
processes (``PYTHONHASHSEED``; the ``python -m tideflow.testing.sim`` replay pins it).
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any, TypeVar

T = TypeVar("T")

EPOCH = 1_767_225_600.0
"""Wall-clock time (1 January 2026, UTC) of virtual time 0."""


class Stalled(RuntimeError):
    """The loop has nothing ready and nothing scheduled: every task waits for something
    that can never happen (a lost wake-up), or it spun ``max_steps`` turns without
    virtual time moving on (a livelock)."""


class _VirtualSelector(selectors.BaseSelector):
    """The loop's real selector (its self-pipe), where a timeout moves virtual time on
    instead of being waited out."""

    def __init__(self) -> None:
        self._real = selectors.DefaultSelector()
        self.loop: VirtualLoop | None = None

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._real.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.modify(fileobj, events, data)

    def get_map(self) -> Any:
        return self._real.get_map()

    def close(self) -> None:
        self._real.close()

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = self._real.select(0)
        loop = self.loop
        if ready or loop is None:
            return ready
        return loop._idle(timeout)


class VirtualLoop(asyncio.SelectorEventLoop):
    """An event loop on virtual time (see the module docstring). ``max_steps`` bounds
    the turns of the loop taken at one virtual instant (a livelock is a failure)."""

    def __init__(self, *, max_steps: int = 2_000_000) -> None:
        selector = _VirtualSelector()
        super().__init__(selector)
        selector.loop = self
        self._now = 0.0
        self._still = 0
        self._max_steps = max_steps
        self.strict = True
        """Raise ``Stalled`` when nothing can ever run again (off while tearing down)."""

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        """Move virtual time on (the loop does it by itself whenever it is idle)."""
        if seconds > 0:
            self._now += seconds
            self._still = 0

    def _idle(self, timeout: float | None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            if self.strict:
                raise Stalled(
                    f"at virtual time {self._now:.3f} s nothing is ready and nothing is "
                    "scheduled: every task waits for a wake-up that will never come"
                )
            return []
        if timeout > 0:
            self.advance(timeout)
            return []
        self._still += 1
        if self._still > self._max_steps and self.strict:
            raise Stalled(
                f"{self._max_steps} turns of the loop at virtual time {self._now:.3f} s "
                "without time moving on: a livelock"
            )
        return []

    def run_in_executor(  # type: ignore[override]
        self, executor: Executor | None, func: Callable[..., T], *args: Any
    ) -> asyncio.Future[T]:
        """Run ``func`` here and now: a thread would finish at a wall-clock moment."""
        future: asyncio.Future[T] = self.create_future()
        try:
            future.set_result(func(*args))
        except BaseException as exc:
            future.set_exception(exc)
        return future

    def run_to_end(self, main: Any) -> Any:
        """Run ``main`` to its end, then cancel what is left and close the loop."""
        try:
            return self.run_until_complete(main)
        finally:
            self.strict = False
            try:
                tasks = [t for t in asyncio.all_tasks(self) if not t.done()]
                for task in tasks:
                    task.cancel()
                if tasks:
                    self.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
                self.run_until_complete(self.shutdown_asyncgens())
            finally:
                self.close()


class SimClock:
    """The runtime's ``Clock`` (and the local bus's) on the loop's virtual time."""

    def __init__(self, loop: VirtualLoop, epoch: float = EPOCH) -> None:
        self.loop = loop
        self.epoch = epoch

    def now(self) -> float:
        return self.epoch + self.loop.time()

    def call_at(self, when: float, callback: Callable[[], None]) -> asyncio.TimerHandle:
        return self.loop.call_at(when - self.epoch, callback)
