"""Who is told that a run changed: the in-process hub behind the API's event streams.

The engine calls ``RunChanges.listener`` after every committed change of a run it owns
(``Runtime.add_listener``; `tideflow server` registers it, ``ServerOptions.listeners``);
each open view of the streams (a feed, api/feeds.py: one per view, however many streams
show it) holds a ``Watch`` and wakes when its run (or, watching all runs, any run)
changed. A feed also rechecks the store every ``RECHECK`` seconds, for the runs another
server of the cluster owns, whose changes this process never hears of.
Nothing here does I/O or imports an HTTP framework.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Sequence

from tideflow.model.events import Transition
from tideflow.model.run import RunState

__all__ = ["RECHECK", "RunChanges", "Watch"]

RECHECK = 2.0
"""Seconds between two reads of the store by a stream that heard of no change (as
``Client.wait`` does in a cluster)."""


class Watch:
    """One stream's view of the hub: ``wait`` returns once something changed since the
    last ``wait`` (or after ``timeout`` seconds)."""

    def __init__(self) -> None:
        self._changed = asyncio.Event()

    def poke(self) -> None:
        self._changed.set()

    async def wait(self, timeout: float) -> bool:
        """Whether a change was heard (False: the timeout passed first)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._changed.wait()
        heard = self._changed.is_set()
        self._changed.clear()
        return heard

    def clear(self) -> None:
        """Forget the changes heard until now (a read that sees them is about to start)."""
        self._changed.clear()


class RunChanges:
    def __init__(self) -> None:
        self._watches: dict[str | None, set[Watch]] = {}
        self.closed = False
        """Set when the server stops: every stream ends (or the server would wait for
        them, its open requests, before it stops)."""

    def close(self) -> None:
        self.closed = True
        for watches in self._watches.values():
            for watch in watches:
                watch.poke()

    def listener(self, state: RunState, transitions: Sequence[Transition]) -> None:
        """The engine's listener: ``state`` was committed."""
        self.changed(state.run_id)

    def changed(self, run_id: str) -> None:
        for key in (run_id, None):
            for watch in self._watches.get(key, ()):
                watch.poke()

    @contextlib.contextmanager
    def watch(self, run_id: str | None) -> Iterator[Watch]:
        """Watch one run, or every run (None), while the block runs."""
        watch = Watch()
        self._watches.setdefault(run_id, set()).add(watch)
        try:
            yield watch
        finally:
            watches = self._watches[run_id]
            watches.discard(watch)
            if not watches:
                del self._watches[run_id]

    @property
    def watching(self) -> int:
        """Open watches (for tests and the logs)."""
        return sum(len(w) for w in self._watches.values())
