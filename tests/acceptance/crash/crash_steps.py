"""Step functions of the crash tests: deterministic, slow enough to be killed mid-step,
and each execution recorded durably.

Every call appends two JSON lines to the file named by ``$TIDEFLOW_CRASH_LOG``
(opened with ``O_APPEND``, fsynced before going on; each line written as
``"\n" + record + "\n"`` in one ``write``, see `crash_checks.read_log` for why):
``phase: "start"`` when the
function is entered and ``phase: "end"`` just before it returns (or raises). A
line carries ``run_id, step_key, attempt, idempotency_key, pid, compensation``, so
the test can tell, after a SIGKILL, which step instances ran, in which process,
under which idempotency key. Results depend only on the input (the flaky step
fails on its first attempt whatever happens), so a re-executed step returns what
the first execution would have.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tideflow import StepContext

LOG_ENV = "TIDEFLOW_CRASH_LOG"

GATE = threading.Event()
"""Released by the in-process recovery test; `gated_add` blocks on it."""
GATE_REACHED = threading.Event()


class GatewayBusy(ConnectionError):
    """A retryable failure (the flaky step's first attempt)."""


class Rejected(ValueError):
    """A failure that is not retried: the saga's last step, so the run compensates."""


def _record(ctx: StepContext, phase: str, compensation: bool) -> None:
    line = {
        "run_id": ctx.run_id,
        "step_key": ctx.step_key,
        "attempt": ctx.attempt,
        "idempotency_key": ctx.idempotency_key,
        "pid": os.getpid(),
        "compensation": compensation,
        "phase": phase,
    }
    fd = os.open(os.environ[LOG_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, ("\n" + json.dumps(line) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def _execution(ctx: StepContext, compensation: bool = False) -> Iterator[None]:
    _record(ctx, "start", compensation)
    time.sleep(random.uniform(0.002, 0.012))  # so that kills land mid-step
    try:
        yield
    finally:
        _record(ctx, "end", compensation)


def add(value: int, amount: int, ctx: StepContext) -> int:
    with _execution(ctx):
        return value + amount


def multiply(value: int, factor: int, ctx: StepContext) -> int:
    with _execution(ctx):
        return value * factor


def flaky_multiply(value: int, factor: int, ctx: StepContext) -> int:
    """Fails its first attempt with a retryable error, then succeeds."""
    with _execution(ctx):
        if ctx.attempt == 1:
            raise GatewayBusy(f"busy (attempt {ctx.attempt})")
        return value * factor


def total(values: list[int], ctx: StepContext) -> int:
    with _execution(ctx):
        return sum(values)


def reserve(item: str, ctx: StepContext) -> dict[str, Any]:
    with _execution(ctx):
        return {"reserved": item}


def release(item: str, ctx: StepContext) -> dict[str, Any]:
    """Compensation of `reserve`."""
    with _execution(ctx, compensation=True):
        return {"released": item}


def reject(item: str, ctx: StepContext) -> None:
    with _execution(ctx):
        raise Rejected(f"{item} rejected")


def gated_add(value: int, amount: int, ctx: StepContext) -> int:
    """`add` that waits for the in-process test to open `GATE` (at most 10 s)."""
    with _execution(ctx):
        GATE_REACHED.set()
        GATE.wait(10)
        return value + amount
