"""What a waiting step waits for, as `tideflow runs show` prints it.

A `wait` step waits for a signal (its name, the `match` it must satisfy, when its
timeout fires and what happens then); a `sleep` waits until a time. Both are read
from the run state (the timers it has armed) and the plan (the step's spec).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tideflow.cli.common import iso
from tideflow.model.states import StepStatus

if TYPE_CHECKING:
    from tideflow.model.plan import Plan
    from tideflow.model.run import RunState, StepState
    from tideflow.runtime.why import Diagnosis


def waits_of(state: RunState, plan: Plan) -> dict[str, dict[str, Any]]:
    """For each waiting step instance (by key): what it waits for, as JSON data.

    A wait: ``{"signal", "match"?, "timeout_at"?, "timeout_action"?}``;
    a sleep: ``{"sleep_until"}``. Times are ISO-8601 in UTC.
    """
    found: dict[str, dict[str, Any]] = {}
    for key, st in state.steps.items():
        if st.status is not StepStatus.WAITING:
            continue
        wait = _wait_of(state, st, plan)
        if wait is not None:
            found[key] = wait
    return found


def _wait_of(state: RunState, st: StepState, plan: Plan) -> dict[str, Any] | None:
    spec = plan.specs.get(st.step_id)
    if spec is None:
        return None
    if spec.wait is not None:
        wait: dict[str, Any] = {"signal": spec.wait.signal}
        if spec.wait.match is not None:
            wait["match"] = spec.wait.match.source
        fires = _fire_at(state, st, "wait_timeout")
        if fires is not None:
            wait["timeout_at"] = iso(fires)
            wait["timeout_action"] = spec.wait.timeout_action
        return wait
    if spec.sleep is not None:
        return {"sleep_until": iso(_fire_at(state, st, "sleep"))}
    return None


def _fire_at(state: RunState, st: StepState, kind: str) -> float | None:
    for timer_id in st.timers:
        ref = state.timers.get(timer_id)
        if ref is not None and ref.kind == kind:
            return ref.fire_at
    return None


def waits_of_reasons(diagnosis: Diagnosis) -> dict[str, dict[str, Any]]:
    """``waits_of`` from what a server said of the run (``GET /runs/{id}/why``): the same
    data, so `runs show --server` prints what `runs show` does on the store."""
    from tideflow.runtime.why import WhyKind

    found: dict[str, dict[str, Any]] = {}
    for reason in diagnosis.reasons:
        if reason.step is None:
            continue
        if reason.kind is WhyKind.WAITING_FOR_SIGNAL:
            wait: dict[str, Any] = {"signal": reason.data["signal"]}
            if reason.data.get("match") is not None:
                wait["match"] = reason.data["match"]
            if reason.at is not None:
                wait["timeout_at"] = iso(reason.at)
                wait["timeout_action"] = reason.data.get("timeout_action")
            found[reason.step] = wait
        elif reason.kind in (WhyKind.TIMER, WhyKind.TIMER_OVERDUE) and (
            reason.data.get("timer") == "sleep"
        ):
            found[reason.step] = {"sleep_until": iso(reason.at)}
    return found


def wait_text(wait: dict[str, Any]) -> str:
    """One line for the steps table: ``signal 'approve' where …, times out at … (fail)``."""
    if "sleep_until" in wait:
        return f"sleeping until {wait['sleep_until']}"
    text = f"signal {wait['signal']!r}"
    if "match" in wait:
        text += f" where {wait['match']}"
    if "timeout_at" in wait:
        then = "fails" if wait["timeout_action"] == "fail" else "continues"
        text += f"; times out at {wait['timeout_at']} (then {then})"
    else:
        text += "; no timeout"
    return text


__all__ = ["wait_text", "waits_of", "waits_of_reasons"]
