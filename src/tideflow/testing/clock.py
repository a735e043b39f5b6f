"""A clock that moves only when a test says so (time-skipping), for the runtime."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(order=True)
class _Timer:
    when: float
    seq: int
    callback: Callable[[], None] = field(compare=False)
    cancelled: bool = field(default=False, compare=False)

    def cancel(self) -> None:
        self.cancelled = True


class ManualClock:
    """``Runtime(clock=ManualClock())``: timers fire on ``advance``, never by themselves."""

    def __init__(self, start: float = 1_767_225_600.0) -> None:
        self._now = start
        self._heap: list[_Timer] = []
        self._seq = itertools.count()

    def now(self) -> float:
        return self._now

    def call_at(self, when: float, callback: Callable[[], None]) -> _Timer:
        timer = _Timer(when, next(self._seq), callback)
        heapq.heappush(self._heap, timer)
        return timer

    def pending(self) -> list[float]:
        """Fire times of the timers still armed, soonest first."""
        return sorted(t.when for t in self._heap if not t.cancelled)

    def advance(self, seconds: float) -> int:
        """Move time forward and run every callback that falls due; returns how many ran."""
        target = self._now + seconds
        fired = 0
        while self._heap and self._heap[0].when <= target:
            timer = heapq.heappop(self._heap)
            if timer.cancelled:
                continue
            self._now = max(self._now, timer.when)
            timer.callback()
            fired += 1
        self._now = target
        return fired
