"""Coalesce concurrent calls into one batched call: many starts, one commit and one publish.

A ``Gathering`` wraps a function of a batch (``Store.create_runs``, ``Bus.publish_events``).
Each caller hands over one item and waits for its own result. There is no timer: when
nothing is being flushed, the caller flushes its own item at once, in its own task (a
lone start costs what it did: no task, no turn of the loop); the callers that come while
a flush is in flight gather, and go together as the next batch (up to ``limit`` items)
as soon as that flush ends. So under a burst of N concurrent starts, the number of
commits is about N / (what gathers during one commit), not N. (A flush that never
yields, as an in-memory store's, gathers nothing: it has nothing to gain.)

The gathered batches are flushed by one task of the gathering, never by a caller: a
caller that is cancelled does not cancel the others' flush. A flush of several items
that raises is tried again item by item, so one bad item (a run id taken already, an
input the store refuses) fails its own caller only (unless ``apart`` says the failure is
everyone's: the store is down); the function may also return an exception for an item
(``Store.create_runs`` does), which goes to that item's caller alone.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

GATHER_LIMIT = 500
"""Items at most in one batch (one statement or one publish; bounded in size)."""

Flush = Callable[[list[T]], Awaitable[Sequence[R | Exception]]]


class Gathering(Generic[T, R]):
    """``await gathering(item)``: ``flush`` called on the items gathered meanwhile; the
    item's own result (or its exception raised)."""

    def __init__(
        self,
        flush: Flush[T, R],
        *,
        limit: int = GATHER_LIMIT,
        apart: Callable[[Exception], bool] = lambda exc: True,
    ) -> None:
        """``apart``: whether a failed flush of several items may be one item's fault, so
        each is tried alone (not when the store is down: every item would fail again,
        one at a time)."""
        if limit < 1:
            raise ValueError(f"a gathering's limit must be at least 1, not {limit}")
        self._flush = flush
        self._apart = apart
        self._limit = limit
        self._waiting: deque[tuple[T, asyncio.Future[R]]] = deque()
        self._flusher: asyncio.Task[None] | None = None
        self._busy = False
        """Whether a flush is in flight (a caller's own, or the flusher's)."""
        self.batches = 0
        """Flushes made so far (tests and benches read it)."""

    async def __call__(self, item: T) -> R:
        if not self._busy:  # nothing in flight: this item goes now, from this task
            self._busy = True
            try:
                self.batches += 1
                (result,) = await self._flush([item])
            finally:
                self._busy = False
                if self._waiting:  # what gathered meanwhile goes at once
                    self._start()
            if isinstance(result, Exception):
                raise result
            return result
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._waiting.append((item, future))
        return await future

    def _start(self) -> None:
        self._busy = True
        self._flusher = asyncio.get_running_loop().create_task(self._flush_all())

    async def _flush_all(self) -> None:
        waiting = self._waiting
        try:
            await self._flush_waiting(waiting)
        finally:
            self._busy = False

    async def _flush_waiting(self, waiting: deque[tuple[T, asyncio.Future[R]]]) -> None:
        while waiting:
            batch = [waiting.popleft() for _ in range(min(self._limit, len(waiting)))]
            try:
                await self._flush_batch(batch)
            except Exception as exc:  # a flush that broke its contract: its callers hear it
                _fail(batch, exc)
            except BaseException:  # cancelled (the loop is closing): nobody waits forever
                _fail(batch, _gone())
                _fail([waiting.popleft() for _ in range(len(waiting))], _gone())
                raise

    async def _flush_batch(self, batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        self.batches += 1
        try:
            results = await self._flush([item for item, _ in batch])
        except Exception as exc:
            if len(batch) == 1 or not self._apart(exc):
                results = [exc] * len(batch)
            else:  # each alone: one bad item fails only its own caller
                for one in batch:
                    await self._flush_batch([one])
                return
        if len(results) != len(batch):
            raise RuntimeError(
                f"a gathered flush returned {len(results)} results for {len(batch)} items"
            )
        for (_, future), result in zip(batch, results, strict=True):
            if future.done():  # its caller was cancelled
                continue
            if isinstance(result, Exception):
                future.set_exception(result)
            else:
                future.set_result(result)


def _fail(batch: list[tuple[T, asyncio.Future[R]]], exc: Exception) -> None:
    for _, future in batch:
        if not future.done():
            future.set_exception(exc)


def _gone() -> Exception:
    return RuntimeError("the gathered call was cancelled before it was flushed")
