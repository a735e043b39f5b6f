"""Time for the runtime: the wall clock and timers that fire on it.

The core never reads a clock; the runtime stamps events with ``Clock.now()`` and
arms durable timers through ``Clock.call_at``. ``SystemClock`` uses the event
loop's own timer heap (woken by the loop, never polled); ``ManualClock`` (in
``tideflow.testing``) lets tests skip time.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Mapping
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
    """The wall clock, optionally shifted by ``offset`` seconds."""

    def __init__(self, offset: float = 0.0) -> None:
        self.offset = offset

    def now(self) -> float:
        return time.time() + self.offset

    def call_at(self, when: float, callback: Callable[[], None]) -> TimerHandle:
        loop = asyncio.get_running_loop()
        return loop.call_later(max(0.0, when - self.now()), callback)


CLOCK_OFFSET_VARIABLE = "TIDEFLOW_CLOCK_OFFSET"


def clock_from_environment(environ: Mapping[str, str]) -> SystemClock:
    """The wall clock shifted by ``TIDEFLOW_CLOCK_OFFSET`` seconds when set: for tests
    that need time to have passed between two commands (never set it in production)."""
    text = environ.get(CLOCK_OFFSET_VARIABLE, "").strip()
    if not text:
        return SystemClock()
    try:
        offset = float(text)
    except ValueError:
        raise ValueError(
            f"{CLOCK_OFFSET_VARIABLE} must be a number of seconds, got {text!r}; unset it"
        ) from None
    if not math.isfinite(offset):
        raise ValueError(f"{CLOCK_OFFSET_VARIABLE} must be finite, got {text!r}; unset it")
    return SystemClock(offset)
