"""The thread pool of sync ``python`` steps: bounded, of daemon threads, and able to
give up on a call.

A thread cannot be killed. When the attempt a call belongs to ends while the call
still runs (its timeout passed, the run was cancelled, the worker shuts down),
the call is *abandoned*: its thread no longer counts against the pool's size (a
new one takes its place, so hung calls cannot starve the pool) and, being a
daemon, it does not keep the process alive (``concurrent.futures`` joins its
threads at exit, so one hung function would keep ``tideflow run`` from ever
ending). An abandoned thread that returns after all goes back to the pool when
there is room, otherwise it ends. ``isolation: process`` is the way to actually
stop such a function.

The event loop hands calls over with :meth:`DaemonThreadPool.call`, which answers
with an asyncio future directly (no ``concurrent.futures.Future`` wrapped in a
second one): results come back in batches, one wake-up of the loop for all the calls
that finished while it was busy, not one wake-up per call.

Waking a thread costs the loop a system call and a fight for the GIL, so a call from
the loop wakes a thread only when no thread is busy: a busy thread takes the queued
calls itself as it finishes each one. Whether that is enough is checked on the loop
every ``STALL`` seconds while calls wait: when every busy thread has been in its
current call that long (slow or blocked functions), more threads are woken, one per
waiting call, up to the pool's size; but not while a thread woken earlier has yet to
take its call (it waits for the GIL, which the busy loop holds: waking more then only
had them all fight for it). Quick functions thus run on one or two threads with few
wake-ups; slow ones still run side by side (each waits ``STALL`` at most for a thread).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, Generic, Protocol, TypeVar

T = TypeVar("T")


class _Handle(Protocol):
    """What a worker thread needs of a call's future (``concurrent.futures.Future`` or a
    `LoopCall`)."""

    def set_running_or_notify_cancel(self) -> bool: ...
    def set_result(self, result: Any) -> None: ...
    def set_exception(self, exception: BaseException | None) -> None: ...
    def cancel(self) -> bool: ...


_Item = tuple[_Handle, Callable[[], Any], bool]
"""A call, its handle, and whether it was submitted from outside an event loop (such a
call wakes a thread at once, and the thread that takes it wakes the next)."""
STALL = 0.001
"""Seconds every busy thread must have spent in its current call before the loop wakes
more threads for the calls waiting."""
_NAMES = itertools.count()
"""Thread numbers, unique in the process, so that a warning names one thread."""


class DaemonThreadPool(Executor):
    def __init__(self, max_workers: int, thread_name_prefix: str) -> None:
        self.max_workers = max_workers
        self._prefix = thread_name_prefix
        self._calls: deque[_Item] = deque()
        self._wake: queue.SimpleQueue[bool] = queue.SimpleQueue()
        """Tokens for idle threads: True, look for calls; False, end."""
        self._lock = threading.Lock()
        self._threads: set[threading.Thread] = set()
        self._abandoned: set[threading.Thread] = set()
        self._running: dict[_Handle, threading.Thread] = {}
        self._idle = 0
        """Threads blocked on ``_wake``."""
        self._tokens = 0
        """True tokens put on ``_wake`` that no thread has taken yet."""
        self._waking = 0
        """Threads woken (or started) that have not looked for calls yet: while one is on
        its way, a new call wakes nobody, so a burst of calls costs one wake-up, not one
        per call (each thread that takes a call wakes the next while calls remain, so a
        slow call does not hold up the ones behind it)."""
        self._closed = False
        self._results: _Results | None = None
        self._busy_since: dict[threading.Thread, float] = {}
        """Threads running a call -> when they started it."""
        self._watch: asyncio.TimerHandle | None = None

    def call(self, fn: Callable[[], T]) -> LoopCall[T]:
        """Run ``fn()`` in a pool thread for the running event loop; await ``.future`` for
        its result. Pass the `LoopCall` to :meth:`abandon` to give up on it."""
        loop = asyncio.get_running_loop()
        results = self._results
        if results is None or results.loop is not loop:
            results = self._results = _Results(loop)
        handle: LoopCall[T] = LoopCall(loop.create_future(), results)
        with self._lock:
            self._put(handle, fn, False)
            if not self._busy_since and not self._waking:
                self._wake_one()  # nobody would come for it otherwise
            elif self._watch is None:
                self._watch = loop.call_later(STALL, self._check, loop)
        return handle

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future: Future[T] = Future()
        with self._lock:
            self._put(future, lambda: fn(*args, **kwargs), True)
            self._wake_one()
        return future

    def _put(self, handle: _Handle, call: Callable[[], Any], eager: bool) -> None:
        """Queue a call (lock held)."""
        if self._closed:
            raise RuntimeError("the thread pool is shut down")
        self._calls.append((handle, call, eager))

    def _check(self, loop: asyncio.AbstractEventLoop) -> None:
        """On the loop, every ``STALL`` seconds while calls wait: wake threads for them
        when every busy thread is stuck in its call (see the module docstring)."""
        with self._lock:
            self._watch = None
            if not self._calls or self._closed:
                return
            if not self._waking:
                # A thread on its way waits for the GIL, which the loop holds (it is busy),
                # not for a call: waking more would only have them all fight for it.
                since = time.monotonic() - STALL
                if all(started <= since for started in self._busy_since.values()):
                    for _ in range(len(self._calls)):
                        if not self._wake_another():
                            break
            self._watch = loop.call_later(STALL, self._check, loop)

    def abandon(self, future: _Handle) -> str | None:
        """Stop waiting for ``future``: a queued call never starts; a running one keeps its
        thread, which leaves the pool. The thread's name, when the call was running."""
        if future.cancel():
            return None
        with self._lock:
            thread = self._running.get(future)
            if thread is None:
                return None
            self._abandoned.add(thread)
            self._wake_one()  # the queued calls must not wait on the hung one
            return thread.name

    def abandoned(self) -> list[str]:
        """Names of the threads still running an abandoned call."""
        with self._lock:
            return sorted(thread.name for thread in self._abandoned)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._closed = True
            threads = list(self._threads - self._abandoned)
            cancelled = list(self._calls) if cancel_futures else []
            if cancel_futures:
                self._calls.clear()
            self._waking += len(threads)
        for handle, *_ in cancelled:
            handle.cancel()
        for _ in threads:
            self._wake.put(False)
        if wait:
            for thread in threads:
                thread.join()

    def _wake_one(self) -> None:
        """Have a thread come for the queued calls, unless one is on its way (lock held)."""
        if self._waking or not self._calls or self._closed:
            return
        self._wake_another()

    def _wake_another(self) -> bool:
        """Wake an idle thread or start one, if the pool has room (lock held)."""
        if self._idle > self._tokens:
            self._waking += 1
            self._tokens += 1
            self._wake.put(True)
            return True
        if len(self._threads) - len(self._abandoned) < self.max_workers:
            self._waking += 1
            self._start_thread()
            return True
        return False

    def _start_thread(self) -> None:
        thread = threading.Thread(
            target=self._work, name=f"{self._prefix}_{next(_NAMES)}", daemon=True
        )
        self._threads.add(thread)
        thread.start()

    def _work(self) -> None:
        me = threading.current_thread()
        item = self._take(me)  # a new thread was started for a call
        while True:
            if item is None:
                with self._lock:
                    self._idle += 1
                go_on = self._wake.get()
                with self._lock:
                    self._idle -= 1
                    if go_on:
                        self._tokens -= 1
                if not go_on:
                    break
                item = self._take(me)
                continue
            handle, call, _ = item
            try:
                handle.set_result(call())
            except BaseException as exc:
                handle.set_exception(exc)
            finally:
                del item, call
            stay, item = self._next(handle, me)
            if not stay:
                break
        with self._lock:
            self._threads.discard(me)
            self._abandoned.discard(me)

    def _take(self, me: threading.Thread) -> _Item | None:
        """For a thread just woken (or started): the next call to run (marked running on
        ``me``), or None when there is none."""
        with self._lock:
            self._waking -= 1
            return self._pop(me)

    def _pop(self, me: threading.Thread) -> _Item | None:
        """`_take` with the lock held."""
        while self._calls:
            item = self._calls.popleft()
            if item[0].set_running_or_notify_cancel():
                self._running[item[0]] = me
                self._busy_since[me] = time.monotonic()
                if item[2]:
                    self._wake_one()
                return item
        return None

    def _next(self, future: _Handle, me: threading.Thread) -> tuple[bool, _Item | None]:
        """After a call: stay for more work (True) or end, when an abandoned thread
        returns to a pool that is full; staying, the next call to run (as `_take`, under
        the same hold of the lock: every call of a busy thread comes this way)."""
        with self._lock:
            del self._running[future]
            self._busy_since.pop(me, None)
            if me in self._abandoned:
                self._abandoned.discard(me)
                if len(self._threads) - len(self._abandoned) > self.max_workers:
                    return False, None
            return True, self._pop(me)


_PENDING, _RUNNING, _CANCELLED, _FINISHED = range(4)


class LoopCall(Generic[T]):
    """A call handed to the pool from an event loop: its asyncio ``future``, and what the
    worker thread does with it (the `_Handle` interface)."""

    __slots__ = ("_results", "_state", "future")

    def __init__(self, future: asyncio.Future[T], results: _Results) -> None:
        self.future = future
        self._results = results
        self._state = _PENDING

    def set_running_or_notify_cancel(self) -> bool:
        with self._results.lock:
            if self._state != _PENDING:
                return False
            self._state = _RUNNING
            return True

    def cancel(self) -> bool:
        """Stop the call if it has not started (True); a running call cannot be stopped."""
        with self._results.lock:
            if self._state == _PENDING:
                self._state = _CANCELLED
            cancelled = self._state == _CANCELLED
        if cancelled and not self.future.done():
            self.future.cancel()
        return cancelled

    def set_result(self, result: Any) -> None:
        self._state = _FINISHED
        self._results.add(self.future, result, None)

    def set_exception(self, exception: BaseException | None) -> None:
        self._state = _FINISHED
        self._results.add(self.future, None, exception)


class _Results:
    """Results of `LoopCall`s on their way back to one event loop: the first result of a
    batch schedules one delivery, which sets every result that arrived by then."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.lock = threading.Lock()
        self._done: deque[tuple[asyncio.Future[Any], Any, BaseException | None]] = deque()
        self._scheduled = False

    def add(self, future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
        """Called in a worker thread."""
        self._done.append((future, result, error))
        with self.lock:
            if self._scheduled:
                return
            self._scheduled = True
        # A closed loop raises RuntimeError: nobody waits for the result any more.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        with self.lock:
            self._scheduled = False
        done = self._done
        while done:
            future, result, error = done.popleft()
            if future.done():
                continue  # cancelled: the attempt ended without it
            if error is None:
                future.set_result(result)
            else:
                future.set_exception(error)
