"""Arming and naming timers.

A timer is a ``TimerRef`` kept in ``RunState.timers`` under its id, and, when it
belongs to a step instance, listed in that step's ``timers`` too (so that a step
that ends disarms all of its own). A step's ``timers`` is a tuple, replaced on every
change: most steps never arm one, and an empty tuple is one shared object where a list
was one more object per step instance for the garbage collector to track. Ids name what a timer is for: ``run_timeout``
for the run, ``<kind>:<step key>:<attempt>`` for a step's (unique while armed, and
the same on every replay).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tideflow.model.commands import CancelTimer, StartTimer
from tideflow.model.run import StepState, TimerKind, TimerRef

if TYPE_CHECKING:
    from tideflow.core.decide import Decider


def timer_id(kind: TimerKind, step_key: str = "", attempt: int = 0) -> str:
    """The id of the timer of this kind for this step instance and attempt."""
    return f"{kind}:{step_key}:{attempt}" if step_key else kind


def arm(
    d: Decider, kind: TimerKind, st: StepState | None, fire_at: float, attempt: int = 0
) -> None:
    """Arm a timer; arming one that is armed already moves it to ``fire_at``."""
    key = st.key if st is not None else ""
    tid = timer_id(kind, key, attempt)
    if st is not None and tid not in d.state.timers:
        st.timers = (*st.timers, tid)
    d.state.timers[tid] = TimerRef(kind=kind, step_key=key, attempt=attempt, fire_at=fire_at)
    d.commands.append(StartTimer(run_id=d.state.run_id, timer_id=tid, fire_at=fire_at))


def disarm(d: Decider, st: StepState, tid: str) -> None:
    if d.state.timers.pop(tid, None) is not None:
        st.timers = _without(st.timers, tid)
        d.commands.append(CancelTimer(run_id=d.state.run_id, timer_id=tid))


def disarm_all(d: Decider, st: StepState) -> None:
    """Disarm every timer of a step instance that has ended."""
    timers = d.state.timers
    for tid in st.timers:
        if timers.pop(tid, None) is not None:
            d.commands.append(CancelTimer(run_id=d.state.run_id, timer_id=tid))
    st.timers = ()


def fired(d: Decider, tid: str) -> TimerRef | None:
    """Take a timer that fired out of the state; None when it is no longer armed."""
    ref = d.state.timers.pop(tid, None)
    if ref is not None and ref.step_key:
        st = d.state.steps.get(ref.step_key)
        if st is not None and tid in st.timers:
            st.timers = _without(st.timers, tid)
    return ref


def _without(timers: tuple[str, ...], tid: str) -> tuple[str, ...]:
    return tuple(t for t in timers if t != tid)
