"""The deterministic simulation (tideflow.testing.sim): thousands of seeds, each a
schedule of faults at every port call on a virtual-time loop, every invariant checked;
a seed replays exactly; and the engine bugs it found, each pinned by a scripted fault.

``TIDEFLOW_SIM_EXAMPLES`` sets how many seeds Hypothesis draws (default 2000, what CI
runs); a failing seed prints its report and ``python -m tideflow.testing.sim --seed N``.
"""

from __future__ import annotations

import asyncio
import os
import textwrap
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tideflow.dsl import compile_definition
from tideflow.errors import StoreUnavailable
from tideflow.model.plan import Plan
from tideflow.runtime.result import RunResult
from tideflow.runtime.runtime import Runtime
from tideflow.testing.sim import Fault, Scripted, SimClock, Stalled, VirtualLoop, simulate
from tideflow.testing.sim.bus import SimBus
from tideflow.testing.sim.stores import SimMemoryStore
from tideflow.testing.sim.workloads import CHILD, register_functions

EXAMPLES = int(os.environ.get("TIDEFLOW_SIM_EXAMPLES", "2000"))


def _holds(seed: int) -> None:
    outcome = simulate(seed)
    assert not outcome.violations, outcome.report()


@pytest.mark.slow
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,  # a seed is its own reproducer: the report names it
    suppress_health_check=[HealthCheck.too_slow],
)
@given(seed=st.integers(min_value=0, max_value=2**32 - 1))
def test_every_invariant_holds_for_every_seed(seed: int) -> None:
    _holds(seed)


@pytest.mark.parametrize("seed", range(40))
def test_the_first_seeds_hold_every_invariant(seed: int) -> None:
    """Fast, and the same seeds every time (one in five on SQLite: seeds 0, 5, 10, ...)."""
    _holds(seed)


@pytest.mark.parametrize("seed", [93, 147, 207, 237, 646, 20206])
def test_the_seeds_that_found_engine_bugs_hold_every_invariant(seed: int) -> None:
    """Each found a bug (docs/reliability.md); 20206: a held start whose run could not be
    loaded to settle its doubt raised out of the batch, leaving the states the batch had
    applied to other runs in the cache, uncommitted (a chain hung). The scenarios are
    the simulation's of today: a change to it may make these seeds test other things."""
    _holds(seed)


@pytest.mark.parametrize("seed", [6, 74, 229, 235])
def test_a_seed_replays_exactly(seed: int) -> None:
    """Heavy faults, restarts, SQLite: the same faults at the same calls, the same
    histories (event ids, times, transitions), twice."""
    first, second = simulate(seed), simulate(seed)
    assert first.faults and first.faults == second.faults
    assert first.histories == second.histories
    assert first.digest == second.digest


def test_an_hour_of_sleep_takes_no_wall_clock_time() -> None:
    register_functions()
    plan = compile_definition(
        'name: nap\nversion: "1"\nsteps:\n  - {id: a, type: sleep, duration: 1h}\n'
        "  - {id: b, type: python, function: sim.work, input: {x: 1}, depends_on: [a]}\n"
        'output: "{{ steps.b.output }}"\n'
    )
    loop = VirtualLoop()

    async def main() -> tuple[RunResult, float]:
        clock = SimClock(loop)
        async with Runtime(clock=clock, bus=SimBus(Scripted({}), clock), gc_threshold=None) as rt:
            result = await rt.run(plan, run_id="nap")
        return result, loop.time()

    result, elapsed = loop.run_to_end(main())
    assert (result.status, result.output) == ("succeeded", 2)
    assert elapsed >= 3600.0


def test_a_loop_where_nothing_can_happen_any_more_says_so() -> None:
    loop = VirtualLoop()

    async def forever() -> None:
        await loop.create_future()

    with pytest.raises(Stalled, match="nothing is ready and nothing is scheduled"):
        loop.run_to_end(forever())


# -- the engine bugs the simulation found, one scripted fault each --------------------


def _run(
    script: dict[tuple[str, int], Fault],
    body: Callable[[Runtime, SimMemoryStore], Awaitable[Any]],
) -> Any:
    """``body(runtime, store)`` on a virtual-time loop, the faults of ``script`` only."""
    register_functions()
    loop = VirtualLoop()
    faults = Scripted(script)
    store = SimMemoryStore(faults)

    async def main() -> Any:
        clock = SimClock(loop)
        faults.now = loop.time
        rt = Runtime(
            store=store,
            bus=SimBus(faults, clock),
            clock=clock,
            gc_threshold=None,
            sweep_interval=10,
        )
        async with rt:
            return await body(rt, store)

    return loop.run_to_end(main())


def _plan(text: str) -> Plan:
    return compile_definition(textwrap.dedent(text))


CHAIN = _plan(
    """
    name: two
    version: "1"
    steps:
      - {id: a, type: python, function: sim.work, input: {x: 1}}
      - {id: b, type: python, function: sim.work, input: {x: "{{ steps.a.output }}"},
         depends_on: [a]}
    output: "{{ steps.b.output }}"
    """
)


async def _finishes(rt: Runtime, plan: Plan, run_id: str) -> RunResult:
    """Start the run (again while the store fails: its id is its idempotency key) and
    wait for its end (virtual time: a run that hangs fails the test at once)."""
    for _ in range(10):
        try:
            await rt.start_run(plan, run_id=run_id, idempotency_key=run_id)
            break
        except StoreUnavailable:
            await asyncio.sleep(1)
    return await rt.wait(run_id, timeout=86_400)


def test_a_start_whose_commit_went_through_but_reported_a_failure_dispatches_its_steps() -> None:
    """A client's start failed after the run was stored (so its start was never published)
    and the engine admitted the pending run from the queue; that RunStarted was stored
    although the commit said it failed: the admitter's start comes again and is held (the
    run is no longer pending), so nothing loaded the run to settle the doubt and its first
    attempt was never dispatched (the run hung)."""
    script = {("store.create_runs", 1): Fault.AFTER, ("store.commit", 1): Fault.AFTER}
    result = _run(script, lambda rt, _: _finishes(rt, CHAIN, "r"))
    assert (result.status, result.output) == ("succeeded", 3)


def test_an_event_whose_run_cannot_be_loaded_for_a_moment_comes_again() -> None:
    """A commit reported a failure (the run is evicted), then loading the run to apply
    its events again failed once (store unavailable): the events were dropped as those of
    a run that can never be loaded, and the run hung."""
    script = {("store.commit", 2): Fault.AFTER, ("store.load_run", 1): Fault.BEFORE}
    result = _run(script, lambda rt, _: _finishes(rt, CHAIN, "r"))
    assert (result.status, result.output) == ("succeeded", 3)


PARENT = _plan(
    """
    name: parent
    version: "1"
    steps:
      - {id: sub, type: subflow, workflow: sim_child, input: {x: 1}}
    output: "{{ steps.sub.output }}"
    """
)


@pytest.mark.parametrize("fault", [Fault.BEFORE, Fault.AFTER])
def test_a_child_run_whose_creation_fails_for_a_moment_is_created_again(fault: Fault) -> None:
    """Store unavailable while the child run was created (before or after it was written):
    the parent's step failed with ChildRunFailed as if the child's workflow did not exist
    (and a child written all the same stayed pending for ever)."""

    async def body(rt: Runtime, store: SimMemoryStore) -> tuple[RunResult, str]:
        await rt.register(CHILD)
        result = await _finishes(rt, PARENT, "p")
        return result, (await store.get_run("p.sub")).status

    result, child = _run({("store.create_runs", 2): fault}, body)
    assert (result.status, result.output, child) == ("succeeded", 3, "succeeded")


def test_recovery_that_cannot_load_a_run_for_a_moment_does_not_skip_it() -> None:
    """Recovery skipped a run it could not load (store unavailable for a moment): nothing
    else dispatches its attempts while the engine runs, so it hung until the next
    restart. The start fails instead (the process is started again)."""
    register_functions()
    loop = VirtualLoop()
    faults = Scripted({})
    store = SimMemoryStore(faults)
    nap = _plan(  # an attempt in flight at the restart: recovery must load the run
        """
        name: nap
        version: "1"
        steps:
          - {id: a, type: python, function: sim.hang, timeout: 30s, on_error: continue}
          - {id: b, type: python, function: sim.work, input: {x: 1}, depends_on: [a]}
        output: "{{ steps.b.output }}"
        """
    )

    def runtime(clock: SimClock) -> Runtime:
        return Runtime(store=store, bus=SimBus(faults, clock), clock=clock, gc_threshold=None)

    async def main() -> RunResult:
        clock = SimClock(loop)
        async with runtime(clock) as first:
            await first.start_run(nap, run_id="n")
            await asyncio.sleep(10)
        faults.script[("store.load_run", faults.counts.get("store.load_run", 0) + 1)] = Fault.BEFORE
        broken = runtime(clock)
        with pytest.raises(StoreUnavailable):
            await broken.start()
        await broken.close()
        async with runtime(clock) as second:
            return await second.wait("n", timeout=86_400)

    result = loop.run_to_end(main())
    assert (result.status, result.output) == ("succeeded", 2)
