"""What a client reads of a run is what is committed: a run's state changes in place
before its batch is committed, and a read during that commit waits for it (once,
GET /runs/{id} said `succeeded` while the history held only `run_started`). A sink of
the batch that reads its own run does not wait for the batch it runs in."""

from __future__ import annotations

import asyncio
from typing import Any

from tideflow.dsl import compile_definition
from tideflow.runtime.runtime import Runtime
from tideflow.store.backends.memory import MemoryStore

ONE_STEP = compile_definition(
    {"name": "one", "version": "1", "steps": [{"id": "a", "type": "noop"}]}
)
EMITTER = compile_definition(
    {
        "name": "emitter",
        "version": "1",
        "steps": [{"id": "e", "type": "emit", "event": {"type": "said", "data": {"x": 1}}}],
    }
)


class HeldStore(MemoryStore):
    """Holds the commit of the batch that ends a run until ``release`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.holding = asyncio.Event()
        self.release = asyncio.Event()

    async def commit(self, batch: Any, relayed: Any = ()) -> None:
        if any(applied.state.is_terminal for applied in batch):
            self.holding.set()
            await self.release.wait()
        await super().commit(batch, relayed)


async def _turns(count: int) -> None:
    for _ in range(count):
        await asyncio.sleep(0)


async def test_a_read_during_the_commit_that_ends_a_run_waits_for_it() -> None:
    store = HeldStore()
    async with Runtime(store=store) as rt:
        try:
            run_id = await rt.start_run(ONE_STEP)
            await asyncio.wait_for(store.holding.wait(), 10)
            live = await rt._engine._live(run_id)
            assert live.status == "succeeded"  # applied in place, not committed yet
            reads = [
                asyncio.ensure_future(rt.result(run_id)),
                asyncio.ensure_future(rt.history(run_id)),
                asyncio.ensure_future(rt.state(run_id)),
            ]
            await _turns(20)
            assert not any(read.done() for read in reads)  # they wait for the commit
        finally:
            store.release.set()  # (a failure above must not leave the runtime's close hung)
        result, history, state = await asyncio.wait_for(asyncio.gather(*reads), 10)
    assert result.status == "succeeded"
    assert state.status == "succeeded"
    assert [entry.kind for entry in history] == ["run_started", "task_completed"]


async def test_a_read_of_a_run_with_nothing_in_flight_does_not_wait() -> None:
    store = HeldStore()
    store.release.set()  # nothing is held
    async with Runtime(store=store) as rt:
        done = await rt.run(ONE_STEP)
        read = asyncio.ensure_future(rt.result(done.run_id))
        await _turns(3)
        assert read.done()
        assert read.result().status == "succeeded"


async def test_a_sink_of_the_batch_reads_its_own_run_without_waiting_for_that_batch() -> None:
    seen: list[str] = []
    async with Runtime() as rt:

        async def sink(event: dict[str, Any]) -> None:
            run_id = event["tideflowrunid"]
            seen.append((await rt.result(run_id)).status)

        rt.add_event_sink(sink)
        result = await asyncio.wait_for(rt.run(EMITTER), 10)
    assert result.status == "succeeded"
    assert seen == ["succeeded"]  # effects go out after the commit: it is committed
