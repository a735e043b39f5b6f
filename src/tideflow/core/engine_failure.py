"""``EngineFailed``: the engine could not apply or store one of a run's events.

The run ends at once (``failed``, or ``compensation_failed`` when it was already
compensating) with the engine's error: everything it runs is stopped, nothing new
starts and no compensation begins, because more of this run's events may hit the
same problem. Other runs never wait on it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tideflow.model.events import EngineFailed
from tideflow.model.states import STEP_TERMINAL, RunStatus

if TYPE_CHECKING:
    from tideflow.core.decide import Decider


def fail_by_engine(d: Decider, event: EngineFailed) -> None:
    state = d.state
    if state.is_terminal:
        return
    cause = f"{event.error.type}: {event.error.message}"
    state.error = event.error
    if state.status is RunStatus.COMPENSATING:
        d.finish_run(RunStatus.COMPENSATION_FAILED, cause)
        return
    top = state.scopes.get("")
    if top is not None:
        top.closing = True
        for key in top.keys:
            st = state.steps[key]
            if st.status not in STEP_TERMINAL:
                d.cancel_step(st, cause)
    d.finish_run(RunStatus.FAILED, cause)
