"""What a fired timer does to its step: retry, time out, end a sleep or a wait, next loop turn."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tideflow.core import attempts
from tideflow.core import steps as kinds
from tideflow.core.retry import stable_seed
from tideflow.core.scope import iso
from tideflow.model.commands import CancelTask
from tideflow.model.events import ErrorInfo
from tideflow.model.run import StepState, TimerRef
from tideflow.model.states import StepStatus

if TYPE_CHECKING:
    from tideflow.core.decide import Decider

_RUNNING = StepStatus.RUNNING
_RETRYING = StepStatus.RETRYING
_WAITING = StepStatus.WAITING


def error_info(type_: str, message: str) -> ErrorInfo:
    return ErrorInfo(type=type_, message=message, retryable=False)


def fire_step_timer(d: Decider, st: StepState, ref: TimerRef) -> None:
    kind = ref.kind
    if kind == "retry" and st.status is _RETRYING:
        attempts.dispatch(d, st, d.plan.specs[st.step_id], None)
    elif kind == "schedule_to_start" and st.status is _RUNNING and st.attempts == ref.attempt:
        attempts.schedule_to_start_passed(d, st)
    elif kind == "attempt_timeout" and st.status is _RUNNING and st.attempts == ref.attempt:
        d.commands.append(CancelTask(run_id=d.state.run_id, step_key=st.key, attempt=st.attempts))
        timeout = d.plan.specs[st.step_id].timeout
        error = ErrorInfo(
            type="TimeoutError",
            message=f"attempt {st.attempts} exceeded its timeout of {timeout}s (counted from "
            "when a worker started it)",
        )
        d.attempt_failed(st, error, stable_seed(d.state.run_id, st.key, str(st.attempts)))
    elif kind == "deadline" and st.status in (_RUNNING, _RETRYING):
        if st.status is _RUNNING:
            d.commands.append(
                CancelTask(run_id=d.state.run_id, step_key=st.key, attempt=st.attempts)
            )
        deadline = d.plan.specs[st.step_id].deadline
        d.fail_step(
            st, error_info("DeadlineExceeded", f"the step's deadline of {deadline}s passed")
        )
    elif kind == "step_timeout" and st.status in (_RUNNING, _WAITING):
        d.stop_inner_work(st, "the step's timeout passed")
        timeout = d.plan.specs[st.step_id].timeout
        d.fail_step(st, error_info("TimeoutError", f"the step did not finish within {timeout}s"))
    elif kind == "wait_timeout" and st.status is _WAITING:
        kinds.wait_timed_out(d, st)
    elif kind == "sleep" and st.status is _WAITING:
        d.succeed(st, {"until": iso(ref.fire_at)}, "sleep finished")
    elif kind == "loop_delay" and st.status is _RUNNING:
        kinds.start_iteration(d, st, ref.attempt)
