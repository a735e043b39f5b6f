"""The timer wheel: durable timers of every run, armed in memory on a Clock.

The durable copy of each timer lives in the run state (``RunState.timers``); this
wheel only holds what is armed in this process, so re-arming after a restart is
``arm_all`` over the unfinished runs.
"""

from __future__ import annotations

from collections.abc import Callable

from tideflow.runtime.clock import Clock, TimerHandle


class TimerWheel:
    def __init__(self, clock: Clock, fire: Callable[[str, str], None]) -> None:
        self._clock = clock
        self._fire = fire
        self._handles: dict[tuple[str, str], TimerHandle] = {}

    def __len__(self) -> int:
        return len(self._handles)

    def arm(self, run_id: str, timer_id: str, fire_at: float) -> None:
        key = (run_id, timer_id)
        old = self._handles.pop(key, None)
        if old is not None:
            old.cancel()
        self._handles[key] = self._clock.call_at(fire_at, lambda: self._expire(key))

    def cancel(self, run_id: str, timer_id: str) -> None:
        handle = self._handles.pop((run_id, timer_id), None)
        if handle is not None:
            handle.cancel()

    def close(self) -> None:
        for handle in self._handles.values():
            handle.cancel()
        self._handles.clear()

    def _expire(self, key: tuple[str, str]) -> None:
        if self._handles.pop(key, None) is not None:
            self._fire(*key)
