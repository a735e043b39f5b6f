"""The scheduler has the store forget relayed outbox rows: a busy engine's commits take
them (no transaction of its own), a quiet engine makes one after ``FORGET_AFTER``
seconds without a commit, until none is left. The wait is driven by the test."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, cast

import pytest

from tideflow.runtime import scheduler as scheduler_module
from tideflow.runtime.scheduler import Scheduler
from tideflow.store.base import AppliedEvent


class _Relay:
    def __init__(self) -> None:
        self.relayed: list[str] = []
        self.on_relayed: Callable[[], None] | None = None

    def forgotten(self, count: int) -> None:
        del self.relayed[:count]


class _Store:
    def __init__(self) -> None:
        self.commits: list[tuple[int, list[str]]] = []

    async def commit(self, batch: Sequence[AppliedEvent], relayed: Sequence[str] = ()) -> None:
        self.commits.append((len(batch), list(relayed)))


class _Waits:
    """``asyncio.sleep`` for the scheduler: each wait ends when the test says so."""

    def __init__(self, real_sleep: Callable[[float], Awaitable[None]]) -> None:
        self.real_sleep = real_sleep
        self.waiting = 0
        self.ticks: asyncio.Queue[None] = asyncio.Queue()

    async def sleep(self, delay: float) -> None:
        assert delay == scheduler_module.FORGET_AFTER
        self.waiting += 1
        await self.ticks.get()

    async def until(self, condition: Callable[[], bool]) -> None:
        """Let the loop run until ``condition()`` holds (a bounded number of turns)."""
        for _ in range(1000):
            if condition():
                return
            await self.real_sleep(0)
        raise AssertionError("the scheduler did not get there")

    async def tick(self, condition: Callable[[], bool]) -> None:
        """End the wait in progress, then run until ``condition()`` holds."""
        self.ticks.put_nowait(None)
        await self.until(condition)


@pytest.fixture
def parts(monkeypatch: pytest.MonkeyPatch) -> tuple[Scheduler, _Relay, _Store, _Waits]:
    relay, store = _Relay(), _Store()
    waits = _Waits(asyncio.sleep)
    scheduler = Scheduler(
        store=cast(Any, store),
        bus=cast(Any, None),
        runs=cast(Any, None),
        plans=cast(Any, None),
        relay=cast(Any, relay),
        batch_size=10,
    )
    monkeypatch.setattr(asyncio, "sleep", waits.sleep)  # the test drives every wait
    return scheduler, relay, store, waits


async def test_a_busy_engine_forgets_relayed_rows_in_its_commits_only(
    parts: tuple[Scheduler, _Relay, _Store, _Waits],
) -> None:
    scheduler, relay, store, waits = parts
    relay.relayed.append("a")
    assert relay.on_relayed is not None
    relay.on_relayed()  # as the relay does when an outbox effect was relayed
    await waits.until(lambda: waits.waiting == 1)
    await scheduler._commit([])  # the engine's next commit takes "a"
    relay.relayed.append("b")  # relayed after that commit
    relay.on_relayed()
    await waits.tick(lambda: waits.waiting == 2)  # the wait ends: a commit came meanwhile
    assert store.commits == [(0, ["a"])]  # none of its own: "b" waits for a quiet moment
    await waits.tick(lambda: not relay.relayed)  # a wait with no commit: quiet
    assert store.commits == [(0, ["a"]), (0, ["b"])]


async def test_a_quiet_engine_forgets_them_alone_and_stops_waiting(
    parts: tuple[Scheduler, _Relay, _Store, _Waits],
) -> None:
    scheduler, relay, store, waits = parts
    relay.relayed.append("a")
    assert relay.on_relayed is not None
    relay.on_relayed()
    await waits.until(lambda: waits.waiting == 1)
    await waits.tick(lambda: not relay.relayed)
    assert store.commits == [(0, ["a"])]
    await waits.until(lambda: scheduler._forgetting is None)  # nothing left: it ended
    assert waits.waiting == 1
