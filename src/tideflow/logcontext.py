"""What every log line of engine and worker activity says it is about: the run, the step,
the attempt and the trace (tideflow.observability.logging puts them on each record).

Context variables, so each asyncio task carries its own: the scheduler sets the run while
it applies one of its events, the relay while it carries out one of its effects, a worker
while an attempt runs (``about``). ``trace_id`` is for tracing to set (``set_trace_id``);
it stays None until something does. ``secret_values`` holds the secret values an attempt
resolved, so a log line written while it runs is masked like its output is.

It sits beside ``tideflow.faults`` at the top of the package: the engine and the worker
set it, the observability hooks read it, and neither imports the other.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

run_id: ContextVar[str | None] = ContextVar("tideflow_run_id", default=None)
step_id: ContextVar[str | None] = ContextVar("tideflow_step_id", default=None)
attempt: ContextVar[int | None] = ContextVar("tideflow_attempt", default=None)
trace_id: ContextVar[str | None] = ContextVar("tideflow_trace_id", default=None)
secret_values: ContextVar[tuple[str, ...]] = ContextVar("tideflow_secret_values", default=())


@contextlib.contextmanager
def about(
    run: str | None, step: str | None = None, attempt_number: int | None = None
) -> Iterator[None]:
    """Log lines written inside the block are about this run (step, attempt)."""
    tokens = (run_id.set(run), step_id.set(step), attempt.set(attempt_number))
    try:
        yield
    finally:
        attempt.reset(tokens[2])
        step_id.reset(tokens[1])
        run_id.reset(tokens[0])


@contextlib.contextmanager
def with_secrets(values: tuple[str, ...]) -> Iterator[None]:
    """Log lines written inside the block mask these values (an attempt's secrets)."""
    token = secret_values.set(secret_values.get() + values)
    try:
        yield
    finally:
        secret_values.reset(token)


def bind(run: str | None, step: str | None = None, attempt_number: int | None = None) -> None:
    """Log lines of the current asyncio task from now on are about this run (step,
    attempt): for a task that does one attempt's work and ends (its context ends too)."""
    run_id.set(run)
    step_id.set(step)
    attempt.set(attempt_number)


def set_trace_id(value: str | None) -> None:
    """The trace the current task works for (tracing sets it; None: no trace)."""
    trace_id.set(value)


__all__ = [
    "about",
    "attempt",
    "bind",
    "run_id",
    "secret_values",
    "set_trace_id",
    "step_id",
    "trace_id",
    "with_secrets",
]
