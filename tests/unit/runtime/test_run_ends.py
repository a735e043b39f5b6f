"""The engine announces the runs a committed batch ended (``Bus.publish_run_ends``), in
one call per batch, only when someone may hear them (``Bus.run_ends_heard``): an
embedded engine on the in-process bus with no cluster client publishes nothing. With
the in-process bus and a ``Client.connect`` client on it, that client's wait is woken
by the announcement (the real brokers: tests/integration/test_cluster_wait.py)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

import pytest

from tideflow.bus.backends.local import LocalBus
from tideflow.bus.base import RunEnded
from tideflow.client import Client
from tideflow.runtime import remote
from tideflow.runtime.runtime import Runtime
from tideflow.store.backends.memory import MemoryStore

FLOW = {
    "name": "pair",
    "version": "1",
    "steps": [{"id": "a", "type": "noop"}, {"id": "b", "type": "noop", "depends_on": ["a"]}],
}
FAILING = {
    "name": "bad",
    "version": "1",
    "steps": [{"id": "a", "type": "shell", "command": ["false"], "retry": {"max_attempts": 1}}],
}


class SpyBus(LocalBus):
    def __init__(self) -> None:
        super().__init__()
        self.announced: list[list[RunEnded]] = []

    async def publish_run_ends(self, ends: Sequence[RunEnded]) -> None:
        self.announced.append(list(ends))
        await super().publish_run_ends(ends)


async def test_an_embedded_engine_no_one_listens_to_announces_nothing() -> None:
    bus = SpyBus()
    async with Runtime(bus=bus, workers=2) as rt:
        await rt.register(FLOW)
        results = await asyncio.gather(*(rt.run("pair", {"i": i}) for i in range(20)))
    assert {r.status for r in results} == {"succeeded"}
    assert bus.announced == []


async def test_the_ends_of_a_batch_are_announced_together_with_their_status() -> None:
    bus = SpyBus()
    async with Runtime(bus=bus, workers=2) as rt, contextlib.aclosing(await bus.run_ends()) as ends:
        await rt.register(FLOW)
        await rt.register(FAILING)
        good = await rt.start_run("pair")
        bad = await rt.start_run("bad")
        await rt.wait(good)
        await rt.wait(bad)
        heard = {(await anext(ends)).run_id for _ in range(2)}
        assert heard == {good, bad}
    announced = [end for batch in bus.announced for end in batch]
    assert sorted(announced, key=lambda e: e.run_id) == sorted(
        [RunEnded(good, "succeeded"), RunEnded(bad, "failed")], key=lambda e: e.run_id
    )
    assert all(batch for batch in bus.announced)  # never an empty call


async def test_many_runs_ending_in_one_batch_are_one_announcement() -> None:
    bus = SpyBus()
    async with Runtime(bus=bus, workers=0) as rt:
        await rt.register(
            {"name": "one", "version": "1", "steps": [{"id": "a", "type": "set", "values": {}}]}
        )
        async with contextlib.aclosing(await bus.run_ends()):
            # an engine step: each run ends in the batch that applies its start
            for run_id in await asyncio.gather(*(rt.start_run("one") for _ in range(10))):
                await rt.wait(run_id)
    assert sum(len(batch) for batch in bus.announced) == 10
    assert len(bus.announced) < 10


async def test_a_client_on_the_bus_is_woken_by_the_announcement(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(remote, "RECHECK", 600.0)  # only a heard end can end the wait
    store, bus = MemoryStore(), SpyBus()
    async with Runtime(store=store, bus=bus, workers=2, cluster=True) as rt:
        await rt.register(FLOW)
        async with Client.connect(store, bus) as client:
            run_id = await client.start("pair")
            result = await asyncio.wait_for(client.wait(run_id), 10)
    assert result.status == "succeeded"
    assert [RunEnded(run_id, "succeeded")] in bus.announced
