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
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

T = TypeVar("T")

_Item = tuple["Future[Any]", Callable[[], Any]]
_NAMES = itertools.count()
"""Thread numbers, unique in the process, so that a warning names one thread."""


class DaemonThreadPool(Executor):
    def __init__(self, max_workers: int, thread_name_prefix: str) -> None:
        self.max_workers = max_workers
        self._prefix = thread_name_prefix
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: set[threading.Thread] = set()
        self._abandoned: set[threading.Thread] = set()
        self._running: dict[Future[Any], threading.Thread] = {}
        self._waiting = 0
        """Threads blocked on the queue, ready to take a call."""
        self._closed = False

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future: Future[T] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("the thread pool is shut down")
            self._queue.put((future, lambda: fn(*args, **kwargs)))
            self._grow()
        return future

    def abandon(self, future: Future[Any]) -> str | None:
        """Stop waiting for ``future``: a queued call never starts; a running one keeps its
        thread, which leaves the pool. The thread's name, when the call was running."""
        if future.cancel():
            return None
        with self._lock:
            thread = self._running.get(future)
            if thread is None:
                return None
            self._abandoned.add(thread)
            self._grow()  # the queued calls must not wait on the hung one
            return thread.name

    def abandoned(self) -> list[str]:
        """Names of the threads still running an abandoned call."""
        with self._lock:
            return sorted(thread.name for thread in self._abandoned)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._closed = True
            threads = list(self._threads - self._abandoned)
        if cancel_futures:
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    item[0].cancel()
        for _ in threads:
            self._queue.put(None)
        if wait:
            for thread in threads:
                thread.join()

    def _grow(self) -> None:
        """Start a thread when calls wait and the pool has room (the lock is held)."""
        counted = len(self._threads) - len(self._abandoned)
        if self._queue.qsize() > self._waiting and counted < self.max_workers:
            self._start_thread()

    def _start_thread(self) -> None:
        thread = threading.Thread(
            target=self._work, name=f"{self._prefix}_{next(_NAMES)}", daemon=True
        )
        self._threads.add(thread)
        thread.start()

    def _work(self) -> None:
        me = threading.current_thread()
        while True:
            with self._lock:
                self._waiting += 1
            item = self._queue.get()
            with self._lock:
                self._waiting -= 1
            if item is None:
                break
            future, call = item
            if not future.set_running_or_notify_cancel():
                continue
            with self._lock:
                self._running[future] = me
            try:
                future.set_result(call())
            except BaseException as exc:
                future.set_exception(exc)
            finally:
                del item, call
            if not self._next(future, me):
                break
        with self._lock:
            self._threads.discard(me)
            self._abandoned.discard(me)

    def _next(self, future: Future[Any], me: threading.Thread) -> bool:
        """After a call: stay for more work (True) or end, when an abandoned thread
        returns to a pool that is full."""
        with self._lock:
            del self._running[future]
            if me in self._abandoned:
                self._abandoned.discard(me)
                return len(self._threads) - len(self._abandoned) <= self.max_workers
            return True
