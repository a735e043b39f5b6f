"""Concurrent starts are gathered: one store commit and one bus publication for the starts
that came while the previous ones were being written, and no wait for a lone one (it is
flushed by its caller, at once). The flushes here take a turn of the loop at least, as a
store's or a broker's round trip does: one that never yields gathers nothing."""

from __future__ import annotations

import asyncio
import textwrap
from collections.abc import Sequence
from pathlib import Path

import pytest

from tideflow.bus.backends.local import LocalBus
from tideflow.bus.base import Message
from tideflow.dsl import compile_definition
from tideflow.errors import RunExists, StoreUnavailable
from tideflow.model.events import Event, RunStarted
from tideflow.runtime.gathering import Gathering
from tideflow.runtime.remote import connect
from tideflow.runtime.runtime import Runtime
from tideflow.store import open_store
from tideflow.store.backends.memory import MemoryStore
from tideflow.store.base import Created, NewRun, Store

CHAIN = compile_definition(
    textwrap.dedent(
        """
        name: chain
        version: "1"
        steps:
          - {id: a, type: noop}
          - {id: b, type: noop, depends_on: [a]}
        """
    )
)


class Recorder:
    """A flush that records its batches and holds each until ``release`` is set."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.release = asyncio.Event()
        self.release.set()
        self.entered = asyncio.Event()

    async def __call__(self, items: list[int]) -> list[int | Exception]:
        self.batches.append(list(items))
        self.entered.set()
        await asyncio.sleep(0)  # a round trip
        await self.release.wait()
        if len(items) > 1 and 13 in items:
            raise ValueError("13 spoils its batch")
        return [ValueError(f"{i} is odd") if i % 2 else i * 10 for i in items]


async def test_a_lone_call_goes_at_once_and_the_calls_made_meanwhile_go_together() -> None:
    flush = Recorder()
    gathering: Gathering[int, int] = Gathering(flush)
    assert await gathering(2) == 20
    assert flush.batches == [[2]]
    flush.release.clear()
    flush.entered.clear()
    first = asyncio.create_task(gathering(4))
    await flush.entered.wait()  # 4 is being flushed alone: the next ones gather
    rest = [asyncio.create_task(gathering(i)) for i in (6, 8, 10)]
    await asyncio.sleep(0)
    flush.release.set()
    assert await first == 40
    assert [await task for task in rest] == [60, 80, 100]
    assert flush.batches == [[2], [4], [6, 8, 10]]
    assert gathering.batches == 3


async def test_an_item_refused_fails_its_own_caller_only() -> None:
    flush = Recorder()
    gathering: Gathering[int, int] = Gathering(flush)
    results = await asyncio.gather(*(gathering(i) for i in (2, 3, 4)), return_exceptions=True)
    assert results[0] == 20 and results[2] == 40
    assert isinstance(results[1], ValueError) and "3 is odd" in str(results[1])
    # a batch whose flush raises is flushed again item by item
    results = await asyncio.gather(
        *(gathering(i) for i in (10, 12, 13, 14)), return_exceptions=True
    )
    assert results[0] == 100 and results[1] == 120 and results[3] == 140
    assert isinstance(results[2], ValueError) and "13 is odd" in str(results[2])
    assert flush.batches[-5:] == [[10], [12, 13, 14], [12], [13], [14]]


async def test_a_failure_that_is_everyones_is_not_tried_item_by_item() -> None:
    calls: list[list[int]] = []

    async def down(items: list[int]) -> list[int | Exception]:
        calls.append(items)
        await asyncio.sleep(0)
        raise StoreUnavailable("the store is down")

    gathering: Gathering[int, int] = Gathering(down, apart=lambda exc: False)
    results = await asyncio.gather(*(gathering(i) for i in range(5)), return_exceptions=True)
    assert all(isinstance(r, StoreUnavailable) for r in results)
    assert calls == [[0], [1, 2, 3, 4]]


async def test_a_cancelled_caller_does_not_cancel_the_others() -> None:
    flush = Recorder()
    flush.release.clear()
    gathering: Gathering[int, int] = Gathering(flush)
    tasks = [asyncio.create_task(gathering(i)) for i in (2, 4, 6)]
    await flush.entered.wait()
    tasks[0].cancel()
    flush.release.set()
    assert [await t for t in tasks[1:]] == [40, 60]
    with pytest.raises(asyncio.CancelledError):
        await tasks[0]


async def test_the_batches_are_bounded() -> None:
    flush = Recorder()
    gathering: Gathering[int, int] = Gathering(flush, limit=4)
    assert await asyncio.gather(*(gathering(2 * i) for i in range(10))) == [
        20 * i for i in range(10)
    ]
    assert [len(b) for b in flush.batches] == [1, 4, 4, 1]
    with pytest.raises(ValueError, match="at least 1"):
        Gathering(flush, limit=0)


ROUND_TRIP = 0.002
"""Seconds a store's commit or a broker's publication takes here (a network round trip)."""


def counted(store: Store, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of each ``create_runs`` batch the store is asked to write."""
    sizes: list[int] = []
    real = store.create_runs

    async def create_runs(runs: Sequence[NewRun]) -> list[Created | Exception]:
        sizes.append(len(runs))
        await asyncio.sleep(ROUND_TRIP)
        return await real(runs)

    monkeypatch.setattr(store, "create_runs", create_runs)
    return sizes


def published_starts(bus: LocalBus, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of ``RunStarted`` in each publication of starts on ``bus``."""
    sizes: list[int] = []
    real = bus.publish_events

    async def publish_events(events: Sequence[Event | Message[Event]]) -> None:
        starts = [e for e in events if isinstance(_event(e), RunStarted)]
        if starts:
            sizes.append(len(starts))
            await asyncio.sleep(ROUND_TRIP)
        await real(events)

    monkeypatch.setattr(bus, "publish_events", publish_events)
    return sizes


def _event(item: Event | Message[Event]) -> Event:
    return item.body if isinstance(item, Message) else item


async def test_a_burst_of_starts_is_few_commits_and_publications_and_keys_hold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(f"sqlite:///{tmp_path}/runs.db")
    commits = counted(store, monkeypatch)
    bus = LocalBus()
    publications = published_starts(bus, monkeypatch)
    async with Runtime(store=store, bus=bus, workers=2) as rt:
        await rt.client.register(CHAIN)
        ids = await asyncio.gather(
            *(rt.client.start(CHAIN, {"i": i}, idempotency_key=f"k{i % 40}") for i in range(50))
        )
        assert len(set(ids)) == 40
        assert all(ids[i] == ids[i + 40] for i in range(10))  # a key reused in the burst
        assert sum(commits) == 50
        assert len(commits) <= 5, commits  # main: 50
        assert sum(publications) == 40
        assert len(publications) <= 5, publications
        for run_id in set(ids):
            assert (await rt.client.wait(run_id, 30)).status == "succeeded"
        # a key of an earlier burst names its run still
        again = await asyncio.gather(
            *(rt.client.start(CHAIN, {"i": i}, idempotency_key=f"k{i}") for i in range(3))
        )
        assert again == ids[:3]


async def test_a_cluster_client_publishes_a_burst_of_starts_together(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = MemoryStore()
    commits = counted(store, monkeypatch)
    bus = LocalBus()
    publications = published_starts(bus, monkeypatch)
    async with connect(store, bus) as client:
        await client.register(CHAIN)
        ids = await asyncio.gather(*(client.start(CHAIN, {"i": i}) for i in range(30)))
        assert len(set(ids)) == 30
        assert sum(commits) == 30 and len(commits) <= 3, commits
        assert sum(publications) == 30 and len(publications) <= 3, publications
        with pytest.raises(RunExists):
            await client.start(CHAIN, run_id=ids[0])


async def test_a_lone_call_takes_no_turn_of_the_loop() -> None:
    """A call with nothing in flight is flushed by its caller: a flush that does not
    yield returns without the loop running anything else in between."""
    flushed: list[list[int]] = []

    async def at_once(items: list[int]) -> list[int | Exception]:
        flushed.append(items)
        return [i + 1 for i in items]

    gathering: Gathering[int, int] = Gathering(at_once)
    other_ran = False

    async def other() -> None:
        nonlocal other_ran
        other_ran = True

    task = asyncio.get_running_loop().create_task(other())
    assert [await gathering(i) for i in range(3)] == [1, 2, 3]
    assert not other_ran  # no turn of the loop was taken
    await task
    assert flushed == [[0], [1], [2]]
