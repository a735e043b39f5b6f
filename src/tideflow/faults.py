"""Fault injection for crash tests: kill this process at a named point of the runtime.

Set ``TIDEFLOW_FAULT=<point>:<n>`` (e.g. ``before_commit:3``) and the process
SIGKILLs itself the n-th time it reaches that point. Unset (always, outside
tests) it costs one attribute check. Points: ``before_commit``,
``after_commit``, ``after_relay``, ``task_started``, ``task_finished``.
"""

from __future__ import annotations

import os
import signal
from collections import Counter

_SPEC = os.environ.get("TIDEFLOW_FAULT", "")
_POINT, _, _NTH = _SPEC.partition(":")
ARMED = bool(_POINT)
_counts: Counter[str] = Counter()


def checkpoint(point: str) -> None:
    """Die here if the fault specification names this point and its count is reached."""
    if point != _POINT:
        return
    _counts[point] += 1
    if _counts[point] >= int(_NTH or 1):
        os.kill(os.getpid(), signal.SIGKILL)
