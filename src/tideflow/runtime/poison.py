"""Why a commit failed, and the event that fails a run the engine cannot carry on.

A failed group commit is one of three things, and the scheduler treats them apart:

- ``UNAVAILABLE``: the store is down or busy (``StoreUnavailable``, connection
  errors, and any store error it cannot place). Nothing is wrong with the data:
  every run waits and the events come again after a backoff. A store that is
  down never fails runs.
- ``CONFLICT``: another applier advanced a run first. That run is reloaded and
  its events applied again; the other runs of the batch commit without it.
- ``DATA``: a value of the batch cannot be stored (``UnstorableData``, a step
  error such as ``OutputNotSerializable``, a ``TypeError`` or ``ValueError``
  from encoding). Writing it again would fail again, so the run it belongs to is
  found (each run of the batch is committed alone) and failed with an
  ``EngineError``; the others commit without it.
"""

from __future__ import annotations

import enum

from tideflow.errors import EngineError, StepError
from tideflow.model.events import EngineFailed, ErrorInfo, Event
from tideflow.store.base import ConcurrencyConflict, StoreError, UnstorableData


class Failure(enum.Enum):
    UNAVAILABLE = "unavailable"
    CONFLICT = "conflict"
    DATA = "data"


DEFINITELY_DATA = (UnstorableData, StepError)
"""Errors that name a value of the batch: the run is failed even when it was alone."""


def classify(exc: BaseException) -> Failure:
    if isinstance(exc, ConcurrencyConflict):
        return Failure.CONFLICT
    if isinstance(exc, DEFINITELY_DATA):
        return Failure.DATA
    if isinstance(exc, StoreError | OSError | TimeoutError):
        return Failure.UNAVAILABLE
    return Failure.DATA  # an encoding error (TypeError, ValueError, OverflowError, ...)


def describe(exc: BaseException) -> str:
    text = exc.message if isinstance(exc, StoreError | StepError) else str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def engine_failed(run_id: str, events: list[Event], cause: str) -> EngineFailed:
    """The event that fails ``run_id`` because ``events`` could not be applied or stored."""
    kinds = ", ".join(sorted({type(e).__name__ for e in events})) or "an event"
    message = (
        f"the engine could not apply or store {kinds} of this run ({cause}); the run was "
        "failed so that it holds up no other run"
    )
    return EngineFailed(
        event_id=f"{run_id}:engine-failed",
        run_id=run_id,
        time=max((e.time for e in events), default=0.0),
        error=ErrorInfo(type=EngineError.__name__, message=message, retryable=False),
    )
