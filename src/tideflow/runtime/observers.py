"""The engine's observer port: what metrics (and any other watcher) hear of the engine.

One interface fed by what the engine does anyway, instead of counters sprinkled through
it: every committed batch as the core applied it (events, transitions, commands), an
effect of the relay that failed, a commit that failed, an event stream that failed. An
``EngineObserver`` overrides what it wants; the base class ignores everything.

Observers are called in the engine's task, after the fact, one by one; an exception one
raises is logged with its name and changes nothing else (like the relay's listeners).
With no observer the engine pays one empty-list test per batch.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from tideflow.store.base import AppliedEvent

log = logging.getLogger("tideflow.observers")


class EngineObserver:
    """Override the methods you need; each is called after the fact and must be cheap."""

    def applied(self, batch: Sequence[AppliedEvent], now: float) -> None:
        """A batch was committed and its effects handed to the relay (``now``: when)."""

    def effect_failed(self, what: str, run_id: str, exc: Exception) -> None:
        """An effect of the relay failed (it is tried again after a backoff)."""

    def commit_failed(self, exc: Exception) -> None:
        """A commit of a batch, or of one run of it, failed (its events come again)."""

    def consume_failed(self, exc: Exception) -> None:
        """The scheduler's event stream failed (it is opened again after a backoff)."""

    def swept(self, kind: str, count: int) -> None:
        """The reconciliation sweep repaired ``count`` things of ``kind`` that a lost
        notification left (``timer``, ``outbox``, ``start``, ``schedule_slot``)."""


class Observers(list[EngineObserver]):
    """The engine's observers; each call reaches every one, whatever the others raise."""

    def applied(self, batch: Sequence[AppliedEvent], now: float) -> None:
        for observer in self:
            try:
                observer.applied(batch, now)
            except Exception:
                _failed(observer, "applied")

    def effect_failed(self, what: str, run_id: str, exc: Exception) -> None:
        for observer in self:
            try:
                observer.effect_failed(what, run_id, exc)
            except Exception:
                _failed(observer, "effect_failed")

    def commit_failed(self, exc: Exception) -> None:
        for observer in self:
            try:
                observer.commit_failed(exc)
            except Exception:
                _failed(observer, "commit_failed")

    def consume_failed(self, exc: Exception) -> None:
        for observer in self:
            try:
                observer.consume_failed(exc)
            except Exception:
                _failed(observer, "consume_failed")

    def swept(self, kind: str, count: int) -> None:
        for observer in self:
            try:
                observer.swept(kind, count)
            except Exception:
                _failed(observer, "swept")


def _failed(observer: EngineObserver, method: str) -> None:
    log.exception(
        "observer %s failed in %s (the engine carries on)", type(observer).__name__, method
    )


__all__ = ["EngineObserver", "Observers"]
