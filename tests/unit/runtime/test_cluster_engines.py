"""Several cluster engines (``Runtime(cluster=True)``) on one store and one in-process
bus: each applies the runs of its share of the partitions, a new one takes its share
without a restart, a stopped one's partitions are taken over, and no run is applied
twice. The same with real processes: tests/acceptance/cluster/test_partitions.py."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence

import pytest

from tideflow.bus.backends.local import LocalBus
from tideflow.bus.base import partition_of
from tideflow.errors import EngineAlreadyRunning, EngineUnreachable
from tideflow.model.events import SignalReceived, Transition
from tideflow.model.run import RunState
from tideflow.runtime.runtime import Runtime
from tideflow.store.backends.memory import MemoryStore
from tideflow.store.base import Store

PARTITIONS = 8
TTL = 0.5
FLOW = {
    "name": "pair",
    "version": "1",
    "steps": [
        {"id": "a", "type": "noop"},
        {"id": "nap", "type": "sleep", "duration": "50ms", "depends_on": ["a"]},
        {"id": "b", "type": "noop", "depends_on": ["nap"]},
    ],
}


class Engines:
    def __init__(self) -> None:
        self.store: Store = MemoryStore()
        self.bus = LocalBus(partitions=PARTITIONS)
        self.applied_by: dict[str, set[int]] = {}
        self.runtimes: list[Runtime] = []

    async def add(self) -> Runtime:
        rt = Runtime(store=self.store, bus=self.bus, workers=2, cluster=True, lease_ttl=TTL)
        index = len(self.runtimes)

        def committed(state: RunState, transitions: Sequence[Transition]) -> None:
            self.applied_by.setdefault(state.run_id, set()).add(index)

        rt.add_listener(committed)
        await rt.start()
        self.runtimes.append(rt)
        return rt

    async def finished(self, run_ids: list[str], timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        for run_id in run_ids:
            while (await self.store.get_run(run_id)).status != "succeeded":
                assert time.monotonic() < deadline, f"run {run_id} did not finish"
                await asyncio.sleep(0.01)

    async def start(self, rt: Runtime, count: int) -> list[str]:
        return [await rt.start_run("pair", {"i": i}) for i in range(count)]


@contextlib.asynccontextmanager
async def engines() -> AsyncIterator[Engines]:
    cluster = Engines()
    try:
        yield cluster
    finally:
        for rt in reversed(cluster.runtimes):
            with contextlib.suppress(Exception):
                await rt.close()


def applied(rt: Runtime) -> frozenset[int]:
    assert rt.partitions is not None
    return rt.partitions.ownership.applied


async def until(check: object, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)


async def test_engines_share_the_partitions_and_take_over_a_stopped_one() -> None:
    async with engines() as cluster:
        first = await cluster.add()
        await first.register(FLOW)
        assert applied(first) == frozenset(range(PARTITIONS))
        second = await cluster.add()
        await until(
            lambda: applied(second) and applied(first) | applied(second) == set(range(8)),
            "the second engine takes its share without a restart",
        )
        assert not applied(first) & applied(second)
        runs = await cluster.start(first, 40)
        await cluster.finished(runs)
        for run_id in runs:  # each run was applied by the owner of its partition
            owner = 0 if partition_of(run_id, PARTITIONS) in applied(first) else 1
            assert cluster.applied_by[run_id] == {owner}, run_id
        assert {i for run_id in runs for i in cluster.applied_by[run_id]} == {0, 1}

        third = await cluster.add()
        await until(lambda: applied(third), "a third engine rebalances")
        await until(
            lambda: sum(len(applied(rt)) for rt in cluster.runtimes) == PARTITIONS,
            "every partition is applied by exactly one engine",
        )
        more = await cluster.start(second, 30)
        await second.close()
        cluster.runtimes.remove(second)
        await until(
            lambda: applied(first) | applied(third) == set(range(8)),
            "the stopped engine's partitions are taken over",
        )
        await cluster.finished(more)
        for run_id in runs + more:
            history = await cluster.store.history(run_id)
            done = Counter(
                (e.event["step_key"], e.event["attempt"])
                for e in history
                if e.kind == "task_completed"
            )
            assert done and max(done.values()) == 1, (run_id, done)


async def test_a_cluster_engine_applies_no_event_of_a_partition_it_does_not_own() -> None:
    async with engines() as cluster:
        first = await cluster.add()
        await first.register(FLOW)
        second = await cluster.add()
        await until(lambda: applied(second), "the second engine takes its share")
        await until(lambda: not applied(first) & applied(second), "the first gave the share up")
        runs = await cluster.start(first, 20)
        await cluster.finished(runs)
        theirs = [r for r in runs if partition_of(r, PARTITIONS) in applied(second)]
        assert theirs
        assert all(cluster.applied_by[r] == {1} for r in theirs)
        assert not any(r in first._engine.runs for r in theirs)  # never cached by first


async def test_an_embedded_engine_and_a_cluster_exclude_each_other() -> None:
    async with engines() as cluster:
        await cluster.add()
        embedded = Runtime(store=cluster.store, bus=LocalBus(), lease=True)
        with pytest.raises(EngineAlreadyRunning) as refused:
            await embedded.start()
        assert "served by a cluster of 1 live `tideflow server`" in str(refused.value)
        await embedded.close()

        signal = SignalReceived(event_id="s1", run_id="r1", time=0.0, name="go", payload=None)
        with pytest.raises(EngineUnreachable) as unreachable:
            await embedded.deliver([signal])  # a client with no bus: it cannot reach them
        assert "--bus" in str(unreachable.value)


async def test_the_timers_of_a_partition_taken_over_fire_on_the_new_owner() -> None:
    """Recovery of a partition being taken loads its timers (before it is applied): a
    wheel that kept only applied partitions' timers skipped them and the runs slept on."""
    napping = {**FLOW, "name": "nap", "steps": [{"id": "nap", "type": "sleep", "duration": "1s"}]}
    async with engines() as cluster:
        first = await cluster.add()
        await first.register(napping)
        second = await cluster.add()
        await until(lambda: applied(second), "the second engine takes its share")
        await until(lambda: not applied(first) & applied(second), "the first gave it up")
        runs = [await first.start_run("nap", {}) for _ in range(12)]
        theirs = [r for r in runs if partition_of(r, PARTITIONS) in applied(second)]
        assert theirs

        async def armed() -> int:
            return len(await cluster.store.due_timers(float("inf")))

        deadline = time.monotonic() + 10
        while await armed() < len(runs):
            assert time.monotonic() < deadline, "every run sleeps"
            await asyncio.sleep(0.01)
        await second.close()  # its wheel held their timers
        cluster.runtimes.remove(second)
        await cluster.finished(runs)
