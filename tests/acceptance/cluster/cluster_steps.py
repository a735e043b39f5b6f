"""Step functions of the cluster tests, imported by `tideflow worker --path` from here.

Every call appends one JSON line to ``$TIDEFLOW_CLUSTER_LOG`` (``O_APPEND``) with the
run, step, attempt, idempotency key and the worker's pid, so a test can tell which
worker ran what, and how often. ``hold`` blocks while the file named by its input
exists (at most 30 s): the step a test kills or stops a worker in the middle of.
"""

from __future__ import annotations

import json
import os
import time

from tideflow import StepContext

LOG_ENV = "TIDEFLOW_CLUSTER_LOG"


class Busy(ConnectionError):
    """The retryable failure of `flaky`'s first attempt."""


def _record(ctx: StepContext, phase: str) -> None:
    line = {
        "run_id": ctx.run_id,
        "step_key": ctx.step_key,
        "attempt": ctx.attempt,
        "idempotency_key": ctx.idempotency_key,
        "pid": os.getpid(),
        "phase": phase,
    }
    fd = os.open(os.environ[LOG_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        # A record starts with a newline of its own: a SIGKILLed worker can leave a
        # torn record (a write cut at a page boundary), and the next one must not
        # join it on one line.
        os.write(fd, ("\n" + json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)


def add(value: int, amount: int, ctx: StepContext) -> int:
    _record(ctx, "run")
    return value + amount


def total(values: list[int], ctx: StepContext) -> int:
    _record(ctx, "run")
    return sum(values)


def flaky(value: int, ctx: StepContext) -> int:
    """Fails its first attempt with a retryable error, then doubles ``value``."""
    _record(ctx, "run")
    if ctx.attempt == 1:
        raise Busy("busy, try again")
    return value * 2


def hold(value: int, gate: str, ctx: StepContext) -> int:
    """Runs while the file ``gate`` exists (a worker is killed or stopped meanwhile)."""
    _record(ctx, "start")
    deadline = time.monotonic() + 30
    while os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.01)
    _record(ctx, "end")
    return value + 1
