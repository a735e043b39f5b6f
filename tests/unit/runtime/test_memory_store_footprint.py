"""What the in-memory store keeps of the runs that ended: a copy of what was committed,
held mostly in values the garbage collector does not track (strings, tuples of plain
values), so that thousands of ended runs do not make every full collection walk their
states and transitions."""

from __future__ import annotations

import gc

from tideflow.dsl import compile_definition
from tideflow.model.states import RunStatus
from tideflow.runtime.runtime import Runtime
from tideflow.store.backends.memory import MemoryStore

CHAIN = compile_definition(
    {
        "name": "footprint-chain",
        "version": "1",
        "steps": [{"id": "s0", "type": "noop"}]
        + [{"id": f"s{i}", "type": "noop", "depends_on": [f"s{i - 1}"]} for i in range(1, 10)],
    }
)


async def _tracked() -> int:
    gc.collect()
    return len(gc.get_objects())


async def test_ended_runs_add_few_objects_the_garbage_collector_tracks() -> None:
    store = MemoryStore()
    async with Runtime(store=store) as rt:
        await rt.register(CHAIN)
        for _ in range(5):  # whatever is made once (caches, pools) is made now
            await rt.wait(await rt.start_run(CHAIN))
        before = await _tracked()
        runs = 100
        for _ in range(runs):
            result = await rt.wait(await rt.start_run(CHAIN))
            assert result.status == "succeeded"
            del result
        per_run = (await _tracked() - before) / runs
    # A 10-step run's 11 events stay objects (with their history tuples): about 25
    # tracked objects. Its final state as an object graph and its 42 transitions as
    # objects made it about 105.
    assert per_run < 40, per_run


async def test_an_ended_run_loaded_is_a_copy_of_what_was_committed() -> None:
    store = MemoryStore()
    async with Runtime(store=store) as rt:
        await rt.register(CHAIN)
        run_id = await rt.start_run(CHAIN)
        assert (await rt.wait(run_id)).status == "succeeded"
    loaded = (await store.load_run(run_id)).snapshot
    assert loaded.status is RunStatus.SUCCEEDED
    # What a caller does with the state it loaded (the engine applies the next event to
    # it in place, before that event is committed) does not change what is stored.
    loaded.status = RunStatus.RUNNING
    loaded.steps["s9"].output = "changed"
    again = (await store.load_run(run_id)).snapshot
    assert again is not loaded
    assert again.status is RunStatus.SUCCEEDED
    assert again.steps["s9"].output is None
