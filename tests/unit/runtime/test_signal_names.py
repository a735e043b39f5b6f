"""Runtime.signal accepts the names the run's plan waits for (now, later, in a loop body)
and refuses any other name with UnknownSignal, recording nothing."""

from __future__ import annotations

import pytest

from tideflow.errors import UnknownSignal
from tideflow.runtime.runtime import Runtime
from tideflow.runtime.signals import declared_signals
from tideflow.testing.waiting import step_is, wait_until

TWO_WAITS = """
name: two-waits
version: "1"
steps:
  - {id: first, type: wait, signal: go}
  - {id: second, type: wait, signal: approve, depends_on: [first]}
output: "{{ steps.second.output }}"
"""

NESTED = """
name: nested
version: "1"
steps:
  - {id: first, type: wait, signal: go}
  - id: poll
    type: loop
    max_iterations: 2
    until: "{{ iteration >= 1 }}"
    depends_on: [first]
    steps:
      - {id: inner, type: wait, signal: tick}
"""

NO_WAIT = """
name: no-wait
version: "1"
steps:
  - {id: first, type: sleep, duration: 1h}
"""


async def _waiting_run(rt: Runtime, definition: str) -> str:
    run_id = await rt.start_run(await rt.register(definition))
    await wait_until(rt, run_id, step_is("first", "waiting"))
    return run_id


async def test_a_signal_for_a_later_wait_is_kept_until_that_wait_starts() -> None:
    async with Runtime() as rt:
        run_id = await _waiting_run(rt, TWO_WAITS)
        await rt.signal(run_id, "approve", {"by": "kim"})  # `second` is not active yet
        await rt.signal(run_id, "go")
        result = await rt.wait(run_id, 10)

    assert result.status == "succeeded"
    assert result.output == {"by": "kim"}


async def test_a_wait_inside_a_loop_body_declares_its_name() -> None:
    async with Runtime() as rt:
        run_id = await _waiting_run(rt, NESTED)
        await rt.signal(run_id, "tick")  # accepted: the loop's wait comes later
        state = await wait_until(rt, run_id, lambda st: bool(st.signals))
        assert [s.name for s in state.signals] == ["tick"]


async def test_an_undeclared_name_is_refused_naming_the_run_and_its_names() -> None:
    async with Runtime() as rt:
        run_id = await _waiting_run(rt, TWO_WAITS)
        before = len(await rt.history(run_id))

        with pytest.raises(UnknownSignal) as refused:
            await rt.signal(run_id, "aprove")

        assert refused.value.message == (
            f"run {run_id} (two-waits 1) does not wait for a signal named 'aprove': "
            "its wait steps take 'approve', 'go'"
        )
        assert len(await rt.history(run_id)) == before
        assert (await rt.state(run_id)).signals == []


async def test_a_run_without_waits_refuses_every_signal() -> None:
    async with Runtime() as rt:
        run_id = await _waiting_run(rt, NO_WAIT)
        with pytest.raises(UnknownSignal, match="it has no wait step"):
            await rt.signal(run_id, "go")


async def test_declared_signals_reads_every_wait_of_the_plan() -> None:
    async with Runtime() as rt:
        plan = await rt.register(NESTED)
    assert declared_signals(plan) == frozenset({"go", "tick"})
