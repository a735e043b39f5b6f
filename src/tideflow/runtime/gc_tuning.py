"""The garbage collector's first threshold while a runtime runs.

CPython collects its youngest generation after every 700 net allocations of container
objects (``gc.get_threshold()[0]``), the middle one after every 10 of those, and the whole
heap once enough objects have survived both. The engine allocates a few dozen such objects
per step (events, tasks, coroutines, futures), nearly all of which reference counting frees
within a turn or two of the event loop; but with a thousand runs in flight the objects of a
run wait about a thousand steps for its next event, so at 700 they are examined two or
three times and promoted, which brings full collections of the whole heap with them. At
tens of thousands of steps per second that was 10-15% of the engine's CPU time.

While at least one `Runtime` runs, the first threshold is raised to ``threshold`` (10,000
unless the runtime is given another, ``Runtime(gc_threshold=...)``); the last runtime to
stop puts the previous value back. It is left alone when it is not CPython's default at the
time (the application chose its own) and when a runtime is given ``gc_threshold=None``.

What it costs in memory: reference counting still frees every object that is not part of a
reference cycle the moment it is no longer used; only cyclic garbage (an exception kept with
its traceback, objects that point at each other) waits longer to be collected, up to 10,000
allocations instead of 700 in the youngest generation (about a millisecond of engine work).
With objects of a few hundred bytes that is a few megabytes at most, not a growth: the
collector runs just as surely, less often. The other two thresholds are not changed.
"""

from __future__ import annotations

import gc
import threading

DEFAULT_THRESHOLD = 10_000
"""The first generation's threshold while a runtime runs (CPython's default: 700)."""
CPYTHON_DEFAULT = 700

_lock = threading.Lock()
_holders = 0
_previous: int | None = None
"""The threshold before the first holder raised it (None: this module did not change it)."""
_applied: int | None = None


def hold(threshold: int | None) -> bool:
    """A runtime starts: raise the first threshold to ``threshold`` unless it is None or the
    application set its own. True when the caller must `release` it when it stops."""
    global _holders, _previous, _applied
    if threshold is None:  # (``Runtime`` has refused one below 1)
        return False
    with _lock:
        _holders += 1
        if _holders == 1:
            first, second, third = gc.get_threshold()
            if first == CPYTHON_DEFAULT:
                _previous, _applied = first, threshold
                gc.set_threshold(threshold, second, third)
    return True


def release() -> None:
    """A runtime that `hold` returned True for stopped: the last one puts the threshold back
    (unless the application changed it meanwhile)."""
    global _holders, _previous, _applied
    with _lock:
        _holders -= 1
        if _holders > 0:
            return
        first, second, third = gc.get_threshold()
        if _previous is not None and first == _applied:
            gc.set_threshold(_previous, second, third)
        _previous = _applied = None


__all__ = ["DEFAULT_THRESHOLD", "hold", "release"]
