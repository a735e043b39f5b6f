"""Wait for a run to reach a condition, on the runtime's own notifications (no sleeps)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from tideflow.model.events import Transition
from tideflow.model.run import RunState
from tideflow.runtime.runtime import Runtime


async def wait_until(
    rt: Runtime, run_id: str, predicate: Callable[[RunState], bool], timeout: float = 10.0
) -> RunState:
    """Return the run's state once ``predicate(state)`` holds after a committed change."""
    reached = asyncio.Event()
    latest: dict[str, RunState] = {}

    def listener(state: RunState, transitions: Sequence[Transition]) -> None:
        if state.run_id == run_id and predicate(state):
            latest["state"] = state
            reached.set()

    rt.add_listener(listener)
    try:
        state = await rt.state(run_id)
        if predicate(state):
            return state
        async with asyncio.timeout(timeout):
            await reached.wait()
        return latest["state"]
    finally:
        rt.remove_listener(listener)


def step_is(key: str, *statuses: str) -> Callable[[RunState], bool]:
    """A predicate: step instance ``key`` is in one of ``statuses``."""

    def check(state: RunState) -> bool:
        st = state.steps.get(key)
        return st is not None and st.status.value in statuses

    return check
