"""One read of the store per view, shared by every event stream that shows it.

A *feed* is one view a stream sends (a page of runs for one filter, cursor and limit; one
run's state) together with the task that keeps it current: it reads the view once when
the first stream of it opens, then again after each change the engine's listener tells
of (api/changes.py; changes closer than ``THROTTLE`` are one read) or every ``RECHECK``
seconds without one. Every stream of the same view reads the feed's newest text, so a
change costs one read per view, however many browsers watch it::

    feeds = Feeds(changes)
    reader = await feeds.join(("runs", None, None, 100, None), None, read)  # the error
    text = reader.take()                         # of the first read is raised here
    text = await reader.next(KEEP_ALIVE)         # a newer view, or None: nothing new

A feed never waits for a reader: a slow one skips to the newest view when it reads
again. It stops, and is forgotten, when its last reader closes, when its run ended (its
readers send that last view first), when a read fails (a *problem*: the readers say so
and end) or when the server stops. Nothing here does I/O of its own or imports an HTTP
framework.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Hashable

from tideflow.api.changes import RECHECK, RunChanges
from tideflow.api.problem_types import ERRORS
from tideflow.errors import TideflowError

__all__ = ["KEEP_ALIVE", "RECHECK", "THROTTLE", "Feed", "Feeds", "Reader"]

log = logging.getLogger("tideflow.api")

THROTTLE = 0.2
"""Seconds: the least time between two reads of one feed woken by changes (a 10,000-step
run changes thousands of times a second; a browser needs a few frames a second)."""
KEEP_ALIVE = 15.0
"""Seconds a stream waits for a newer view before it sends a comment (a keep-alive for
proxies, and a write that finds a reader gone)."""
PROBLEM = "the server could not read this view; the error is in its log"

Read = Callable[[], Awaitable[tuple[str, bool]]]
"""Reads a view: its JSON text, and whether it is the last (the run ended)."""


class Feed:
    """One view kept current for its readers: ``version`` counts the texts it published."""

    def __init__(
        self, changes: RunChanges, run_id: str | None, read: Read, gone: Callable[[Feed], None]
    ) -> None:
        self._changes, self._run_id, self._read, self._gone = changes, run_id, read, gone
        self.text = ""
        self.version = 0
        self.ended = False
        """No newer version will come: the run ended, a read failed, or the server stops."""
        self.problem: str | None = None
        """Why it ended early (a read failed): the readers say so and end."""
        self._readers: set[Reader] = set()
        self._first: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._first.add_done_callback(_retrieved)
        self._task = asyncio.create_task(self._keep(), name="tideflow-feed")

    def reader(self) -> Reader:
        reader = Reader(self)
        self._readers.add(reader)
        return reader

    async def first(self) -> None:
        """Once the first view is read; the error of that read, if it failed."""
        await asyncio.shield(self._first)

    def leave(self, reader: Reader) -> None:
        self._readers.discard(reader)
        if not self._readers:
            self._end()
            self._task.cancel()  # its next turn ends it too, should a client drop the cancel

    @property
    def closed(self) -> bool:
        return self._changes.closed

    async def _keep(self) -> None:
        with self._changes.watch(self._run_id) as watch:  # before the first read: no
            try:  # change during it goes unheard
                await self._update()
            except asyncio.CancelledError:  # its last reader left before the first view
                self._first.cancel()
                self._end()
                raise
            except Exception as exc:  # every stream that joined raises it, before it starts
                self._first.set_exception(exc)
                self._end()
                return
            self._first.set_result(None)
            while not self.ended:
                if await watch.wait(RECHECK) and not self.closed:
                    await asyncio.sleep(THROTTLE)  # let a burst of changes become one read
                watch.clear()  # what was heard until now, this read sees
                if self.closed or self.ended:
                    break
                await self._next()
        self._end()

    async def _next(self) -> None:
        try:
            await self._update()
        except TideflowError as exc:  # the browsers reconnect, and read again
            self.problem = _told(exc)
        except Exception:
            log.exception("a stream's view could not be read")
            self.problem = PROBLEM
        if self.problem is not None:
            self._end()

    async def _update(self) -> None:
        text, last = await self._read()
        if text != self.text:
            self.text, self.version = text, self.version + 1
            self._wake()
        if last:
            self._end()

    def _end(self) -> None:
        if not self.ended:
            self.ended = True
            self._gone(self)
        self._wake()

    def _wake(self) -> None:
        for reader in self._readers:
            reader.poke()


class Reader:
    """One stream's place in its feed: the version it sent last."""

    def __init__(self, feed: Feed) -> None:
        self._feed = feed
        self._sent = 0
        self._newer = asyncio.Event()

    def poke(self) -> None:
        self._newer.set()

    def take(self) -> str:
        """The feed's newest text (marked as sent)."""
        self._sent = self._feed.version
        return self._feed.text

    async def next(self, timeout: float) -> str | None:
        """A text newer than the last one taken, as soon as there is one; None when
        ``timeout`` seconds passed without, or when the feed ended (``over``)."""
        try:
            async with asyncio.timeout(timeout):
                while self._feed.version == self._sent and not self.over:
                    self._newer.clear()
                    await self._newer.wait()
        except TimeoutError:
            return None
        return None if self.over else self.take()

    @property
    def over(self) -> bool:
        """Nothing more to send: the server stops, the feed's read failed (``problem``),
        or it ended and this reader sent its last text."""
        feed = self._feed
        if feed.closed or feed.problem is not None:
            return True
        return feed.ended and feed.version == self._sent

    @property
    def problem(self) -> str | None:
        return self._feed.problem

    def close(self) -> None:
        """The stream ended: its feed stops when no other reader is left."""
        self._feed.leave(self)


class Feeds:
    """The open feeds, by view: a stream that opens joins its view's feed, or starts it."""

    def __init__(self, changes: RunChanges) -> None:
        self._changes = changes
        self._feeds: dict[Hashable, Feed] = {}

    async def join(self, key: Hashable, run_id: str | None, read: Read) -> Reader:
        """A reader of the view ``key`` names (``read`` reads it; ``run_id``: the run whose
        changes change it, None for any run's) once its first text is read: the error of
        that read is raised (the one read for every stream that joined meanwhile)."""
        feed = self._feeds.get(key)
        if feed is None:
            feed = self._feeds[key] = Feed(self._changes, run_id, read, self._forget(key))
        reader = feed.reader()
        try:
            await feed.first()
        except BaseException:
            reader.close()
            raise
        return reader

    def _forget(self, key: Hashable) -> Callable[[Feed], None]:
        def forget(feed: Feed) -> None:
            if self._feeds.get(key) is feed:  # the next stream of the view starts a new one
                del self._feeds[key]

        return forget

    @property
    def open(self) -> int:
        """Feeds being kept (for tests and the logs)."""
        return len(self._feeds)


def _told(exc: TideflowError) -> str:
    """What a reader is told of a failed read: the message of an error of the request, the
    meaning of its class for one of the service (its message may name hosts), logged."""
    status = next((ERRORS[c][0] for c in type(exc).__mro__ if c in ERRORS), 500)
    if status < 500:
        return exc.message
    log.warning("a stream's view could not be read: %s", exc.message)
    return " ".join((type(exc).__doc__ or "").split()) if status == 503 else PROBLEM


def _retrieved(first: asyncio.Future[None]) -> None:
    """Every reader that waited raised the first read's error; with none left, it is
    dropped here, not reported as never retrieved."""
    if not first.cancelled():
        with contextlib.suppress(BaseException):
            first.exception()
