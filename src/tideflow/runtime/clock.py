"""Time for the runtime: the wall clock and timers that fire on it.

The core never reads a clock; the runtime stamps events with ``Clock.now()`` and
arms durable timers through ``Clock.call_at``. ``SystemClock`` uses the event
loop's own timer heap (woken by the loop, never polled); ``ManualClock`` (in
``tideflow.testing``) lets tests skip time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol


class TimerHandle(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the epoch (UTC)."""
        ...

    def call_at(self, when: float, callback: Callable[[], None]) -> TimerHandle:
        """Run ``callback`` on the event loop at wall-clock time ``when``."""
        ...


class SystemClock:
    def now(self) -> float:
        return time.time()

    def call_at(self, when: float, callback: Callable[[], None]) -> TimerHandle:
        loop = asyncio.get_running_loop()
        return loop.call_later(max(0.0, when - time.time()), callback)
