"""The python executor's per-call work: what is computed once is not computed per call,
and results of sync functions come back to the event loop in batches."""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import AsyncIterator
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from tideflow.worker.executors.errors import InvalidStepConfig, InvalidStepInput
from tideflow.worker.executors.python import PythonExecutor
from tideflow.worker.executors.threads import DaemonThreadPool

from .conftest import ModuleDir, make_ctx


@pytest.fixture
async def python() -> AsyncIterator[PythonExecutor]:
    executor = PythonExecutor(max_workers=2)
    yield executor
    await executor.aclose()


def _count_calls(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> list[int]:
    calls = [0]
    original = getattr(owner, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return calls


async def test_signature_is_not_bound_per_call(
    python: PythonExecutor, modules: ModuleDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    mod = modules.write(
        "def add(a, b=1, *, ctx=None, **extra):\n    return a + b + len(extra)\n"
        "def plain(a, /, b):\n    return b\n"
    )
    binds = _count_calls(monkeypatch, inspect.Signature, "bind")
    for i in range(5):
        out = await python.execute(make_ctx(), {"function": f"{mod}:add"}, {"a": i, "z": 0})
        assert out == i + 2
    assert binds[0] == 0
    # Input that does not fit is still told apart, in the words of Signature.bind.
    with pytest.raises(InvalidStepInput, match="missing a required argument: 'a'"):
        await python.execute(make_ctx(), {"function": f"{mod}:add"}, {"b": 2})
    with pytest.raises(InvalidStepInput, match="positional"):
        await python.execute(make_ctx(), {"function": f"{mod}:plain"}, {"a": 1, "b": 2})


async def test_a_config_is_validated_once_not_per_attempt(
    python: PythonExecutor, modules: ModuleDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    mod = modules.write("def f():\n    return 1\n")
    checks = _count_calls(monkeypatch, Draft202012Validator, "iter_errors")
    config = {"function": f"{mod}:f", "timeout": "5s"}
    for attempt in range(1, 6):
        assert await python.execute(make_ctx(attempt), dict(config), None) == 1
    assert checks[0] == 1
    # Another config is checked (and a bad one still fails, every time).
    assert await python.execute(make_ctx(), {**config, "timeout": 7}, None) == 1
    assert checks[0] == 2
    for _ in range(2):
        with pytest.raises(InvalidStepConfig, match="timeout"):
            await python.execute(make_ctx(), {**config, "timeout": [1]}, None)
    assert checks[0] == 4


async def test_results_that_finish_together_wake_the_loop_once() -> None:
    pool = DaemonThreadPool(2, thread_name_prefix="tideflow-test")
    loop = asyncio.get_running_loop()
    wakeups = _CountingWakeups(loop)
    finished = threading.Semaphore(0)

    def work(i: int) -> int:
        finished.release()
        return i * 2

    try:
        calls = [pool.call(lambda i=i: work(i)) for i in range(20)]
        for _ in calls:  # the loop is busy (blocked here) while every call finishes
            assert finished.acquire(timeout=10)
        with wakeups:
            results = await asyncio.wait_for(asyncio.gather(*(c.future for c in calls)), 10)
    finally:
        pool.shutdown()
    assert results == [i * 2 for i in range(20)]
    assert wakeups.count <= 2  # one per batch (a call may finish after the first batch)


async def test_an_abandoned_queued_call_never_runs() -> None:
    pool = DaemonThreadPool(1, thread_name_prefix="tideflow-test")
    release = threading.Event()
    ran: list[str] = []
    try:
        blocker = pool.call(lambda: release.wait(10))
        queued = pool.call(lambda: ran.append("queued"))
        assert pool.abandon(queued) is None
        assert queued.future.cancelled()
        release.set()
        assert await asyncio.wait_for(blocker.future, 10) is True
        after = pool.call(lambda: ran.append("after"))
        await asyncio.wait_for(after.future, 10)
    finally:
        pool.shutdown()
    assert ran == ["after"]


async def test_a_slow_call_does_not_hold_up_the_calls_queued_behind_it() -> None:
    pool = DaemonThreadPool(2, thread_name_prefix="tideflow-test")
    release = threading.Event()
    try:
        # One burst: the thread that takes the slow call wakes another for the rest.
        slow = pool.call(lambda: release.wait(10))
        quick = [pool.call(lambda i=i: i) for i in range(5)]
        done = await asyncio.wait_for(asyncio.gather(*(c.future for c in quick)), 10)
        assert done == [0, 1, 2, 3, 4]
        assert not slow.future.done()
        release.set()
        assert await asyncio.wait_for(slow.future, 10) is True
    finally:
        release.set()
        pool.shutdown()


class _CountingWakeups:
    """Counts ``call_soon_threadsafe`` on a loop while active."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.count = 0
        self._original = loop.call_soon_threadsafe

    def __enter__(self) -> None:
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return self._original(*args, **kwargs)

        self.loop.call_soon_threadsafe = counted  # type: ignore[method-assign]

    def __exit__(self, *exc: object) -> None:
        del self.loop.call_soon_threadsafe


async def test_a_call_queued_behind_a_busy_thread_wakes_nobody_until_that_thread_is_stuck() -> None:
    pool = DaemonThreadPool(4, thread_name_prefix="tideflow-test")
    release = threading.Event()
    started = threading.Event()
    try:

        def slow() -> bool:
            started.set()
            return release.wait(10)

        blocker = pool.call(slow)
        assert await asyncio.to_thread(started.wait, 10)
        quick = [pool.call(lambda i=i: i) for i in range(3)]
        # Queued behind a busy thread: no wake-up, no new thread (the busy one would take
        # them, were it quick)...
        assert len(pool._threads) == 1
        # ...but it is stuck in its call, so the loop's check wakes threads for them.
        done = await asyncio.wait_for(asyncio.gather(*(c.future for c in quick)), 10)
        assert done == [0, 1, 2]
        assert 2 <= len(pool._threads) <= 4
        assert not blocker.future.done()
        release.set()
        assert await asyncio.wait_for(blocker.future, 10) is True
    finally:
        release.set()
        pool.shutdown()


async def test_calls_queued_while_a_woken_thread_is_on_its_way_wake_no_more_threads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A thread woken for a burst of quick calls waits for the GIL while the loop is busy;
    the loop's checks meanwhile must not wake the rest of the pool (they would all fight
    for the GIL: a wake-up per call, not one per burst)."""
    pool = DaemonThreadPool(4, thread_name_prefix="tideflow-test")
    started: list[int] = []
    # A thread that never arrives: started, on its way, and not looking for calls yet.
    monkeypatch.setattr(pool, "_start_thread", lambda: started.append(1))
    calls = [pool.call(lambda i=i: i) for i in range(5)]
    assert started == [1]
    await asyncio.sleep(0.02)  # a dozen checks, every STALL seconds
    assert started == [1]
    pool.shutdown(wait=False, cancel_futures=True)
    assert all(call.future.cancelled() for call in calls)
