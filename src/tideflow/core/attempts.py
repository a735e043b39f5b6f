"""The life of one attempt of an action step: dispatched, started, finished or lost.

An attempt is *dispatched* when its task is sent to the workers and *started* when a
worker reports that it began executing it (``TaskStarted``). The two clocks an attempt
has count from those moments: ``schedule_to_start`` bounds the time between dispatch
and start (time spent queued), ``timeout`` the time from start to outcome. Being started
is a fact recorded on the running attempt (``StepState.attempt_started_at`` and a
``running -> running`` history entry), not a step state of its own.

A started execution that is *lost* (``TaskLost``: the process running it stopped, found
by recovery) is dispatched again under the same attempt number and idempotency key —
unless the step is ``idempotent: false``: then nobody knows whether its effect happened,
and the attempt fails with ``StepOutcomeUnknown`` (retried only when the step's
``retry_on`` names it). An attempt that never started lost nothing: recovery simply
dispatches it again, whatever the step's ``idempotent``.

A task the bus delivers again (its worker died and its lease expired, or the worker
handed it back) is run again by the next worker as the same attempt: its
``TaskStarted`` carries ``delivery`` > 1, and for an attempt already started it records
that fact in the history (the first start still counts for the timeout).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tideflow.core.retry import engine_error, retry_delay, stable_seed
from tideflow.core.tasks import action_task, cancel_task, render_config
from tideflow.core.timers import arm, disarm, timer_id
from tideflow.errors import ExpressionEvaluationError
from tideflow.model.events import (
    ErrorInfo,
    TaskCompleted,
    TaskFailed,
    TaskLost,
    TaskStarted,
    transition_of,
)
from tideflow.model.plan import StepSpec
from tideflow.model.run import StepState
from tideflow.model.states import StepStatus

if TYPE_CHECKING:
    from tideflow.core.decide import Decider

_RUNNING = StepStatus.RUNNING
_RUNNING_VALUE = _RUNNING.value
_RETRYING = StepStatus.RETRYING


def dispatch(d: Decider, st: StepState, spec: StepSpec, scope: dict[str, Any] | None) -> None:
    """Send the next attempt of an action step to a worker (its timeout waits for the
    worker's start)."""
    config = render_config(spec, d.state, st, d.now, scope)
    st.attempts += 1
    if st.attempts == 1 and spec.deadline is not None:
        st.deadline_at = d.now + spec.deadline
        arm(d, "deadline", st, st.deadline_at)
    d.set_step(st, _RUNNING, f"attempt {st.attempts} dispatched", st.attempts)
    d.commands.append(action_task(d.plan, d.state, st, config))
    dispatched(d, st)


def redispatch(d: Decider, st: StepState) -> None:
    """Send the current attempt again, same number and idempotency key (its execution was
    lost before it reported an outcome)."""
    config = render_config(d.plan.specs[st.step_id], d.state, st, d.now)
    d.commands.append(action_task(d.plan, d.state, st, config))
    dispatched(d, st)


def timer_ids(st: StepState) -> tuple[str, str]:
    """The ids of the current attempt's two clocks: schedule-to-start and timeout."""
    return (
        timer_id("schedule_to_start", st.key, st.attempts),
        timer_id("attempt_timeout", st.key, st.attempts),
    )


def dispatched(d: Decider, st: StepState) -> None:
    """Arm the queue clock of the attempt just dispatched (its timeout waits for the start)."""
    st.attempt_started_at = None
    st.start_delivery = 0
    limit = d.plan.specs[st.step_id].schedule_to_start
    if limit is not None:
        arm(d, "schedule_to_start", st, d.now + limit, st.attempts)


def ended(d: Decider, st: StepState, event: TaskCompleted | TaskFailed | None = None) -> None:
    """The current attempt has an outcome: record the start it carries (one the worker did
    not report on its own), stop both of the attempt's clocks."""
    if event is not None and event.started_at is not None and st.attempt_started_at is None:
        st.attempt_started_at = event.started_at
        record_fact(d, st, started_cause("attempt", st.attempts, event.worker))
    if st.timers:
        for tid in timer_ids(st):
            disarm(d, st, tid)


def record_fact(d: Decider, st: StepState, cause: str) -> None:
    """Record a fact about the attempt in flight: ``running -> running``, the one
    self-transition the table allows (no state changes, nothing to propagate)."""
    assert st.status is _RUNNING
    # as `Decider.record`, written out: an outcome carrying its start comes this way
    d.transitions.append(
        transition_of((st.key, _RUNNING_VALUE, _RUNNING_VALUE, d.now, cause, st.attempts))
    )


def redelivered_cause(what: str, attempt: int, event: TaskStarted) -> str:
    """The history cause of a started attempt whose task the bus delivered again."""
    by = f" by {event.worker}" if event.worker else ""
    return (
        f"{what} {attempt} started again{by} (delivery {event.delivery}: lease_expired, the "
        "worker that held it stopped renewing its lease or handed it back; same attempt and "
        "idempotency key)"
    )


def started_cause(what: str, attempt: int, worker: str) -> str:
    """The history cause of a start: ``attempt 2 started by host/pid``."""
    return f"{what} {attempt} started" + (f" by {worker}" if worker else "")


def _current(d: Decider, key: str, attempt: int) -> StepState | None:
    st = d.state.steps.get(key)
    if st is None or st.status is not _RUNNING or st.attempts != attempt:
        return None
    if not d.plan.specs[st.step_id].is_action:
        return None
    return st


def on_started(d: Decider, event: TaskStarted) -> None:
    st = _current(d, event.step_key, event.attempt)
    if st is None:
        return  # stale
    if st.attempt_started_at is not None:
        if event.delivery > max(st.start_delivery, 1) and d.plan.specs[st.step_id].idempotent:
            # not a duplicate: the attempt's task came to another worker, which runs it
            # again (an `idempotent: false` one is refused: its start changes nothing);
            # the same start delivered twice by the bus is recorded once
            st.start_delivery = event.delivery
            record_fact(d, st, redelivered_cause("attempt", st.attempts, event))
        return  # a duplicate: the first start counts (and its timeout clock)
    st.attempt_started_at = d.now
    st.start_delivery = event.delivery
    if st.timers:  # the timeout restarts now, even if armed at dispatch
        for tid in timer_ids(st):
            disarm(d, st, tid)
    record_fact(d, st, started_cause("attempt", st.attempts, event.worker))
    timeout = d.plan.specs[st.step_id].timeout
    if timeout is not None:
        arm(d, "attempt_timeout", st, d.now + timeout, st.attempts)


def on_lost(d: Decider, event: TaskLost) -> None:
    st = _current(d, event.step_key, event.attempt)
    if st is None or st.attempt_started_at is None:
        return  # stale, reported twice, or never started (recovery re-dispatches those)
    if event.started_at is not None and event.started_at != st.attempt_started_at:
        return  # the loss of an earlier execution, delivered again: this one is live
    ended(d, st)
    if not d.plan.specs[st.step_id].idempotent:
        error = ErrorInfo(
            type="StepOutcomeUnknown",
            message=(
                f"attempt {st.attempts} started but its outcome was never recorded "
                f"({event.reason}); the step is idempotent: false, so it is not run again "
                "blindly: check whether its effect happened, then retry or cancel the run"
            ),
            only_if_named=True,
        )
        attempt_failed(d, st, error, stable_seed(d.state.run_id, st.key, "lost", str(st.attempts)))
        return
    cause = f"attempt {st.attempts} started but its execution was lost ({event.reason})"
    record_fact(d, st, cause + ": dispatched again")
    try:
        redispatch(d, st)
    except ExpressionEvaluationError as exc:
        d.fail_step(st, engine_error("ExpressionError", exc.message))


def schedule_to_start_passed(d: Decider, st: StepState) -> None:
    """No worker started the current attempt in time: it fails, retryable (it never ran)."""
    limit = d.plan.specs[st.step_id].schedule_to_start
    message = f"no worker started attempt {st.attempts} within {limit}s of its dispatch"
    _stop_and_fail(d, st, "ScheduleToStartTimeout", message, "queued", str(st.attempts))


def timed_out(d: Decider, st: StepState) -> None:
    """The current attempt ran past its ``timeout`` (counted from its start)."""
    timeout = d.plan.specs[st.step_id].timeout
    message = (
        f"attempt {st.attempts} exceeded its timeout of {timeout}s (counted from when a "
        "worker started it)"
    )
    _stop_and_fail(d, st, "TimeoutError", message, str(st.attempts))


def _stop_and_fail(d: Decider, st: StepState, type_: str, message: str, *salt: str) -> None:
    """Cancel the current attempt's task and fail the attempt with a retryable error (its
    retry jitter seeded from the run, the step and ``salt``: no event carries a seed)."""
    d.commands.append(cancel_task(d.state, st.key, st.attempts))
    error = engine_error(type_, message, retryable=True)
    attempt_failed(d, st, error, stable_seed(d.state.run_id, st.key, *salt))


def on_completed(d: Decider, event: TaskCompleted) -> None:
    st = _current(d, event.step_key, event.attempt)
    if st is None:
        return
    ended(d, st, event)
    d.succeed(st, event.output, "task completed")


def on_failed(d: Decider, event: TaskFailed) -> None:
    st = _current(d, event.step_key, event.attempt)
    if st is None:
        return
    ended(d, st, event)
    attempt_failed(d, st, event.error, event.seed)


def attempt_failed(d: Decider, st: StepState, error: ErrorInfo, seed: int) -> None:
    """Retry the failed attempt when its policy (and its deadline) allow, else fail the step."""
    delay = retry_delay(d.plan.specs[st.step_id].retry, error, st.attempts, seed)
    if delay is not None and st.deadline_at is not None and d.now + delay >= st.deadline_at:
        error = engine_error(
            "DeadlineExceeded",
            "no retry can start before the step's deadline; last error: "
            f"{error.type}: {error.message}",
        )
    elif delay is not None:
        st.error = error
        d.set_step(
            st,
            _RETRYING,
            f"attempt {st.attempts} failed: {error.type}: {error.message}",
            st.attempts,
        )
        arm(d, "retry", st, d.now + delay, st.attempts)
        return
    d.fail_step(st, error)
