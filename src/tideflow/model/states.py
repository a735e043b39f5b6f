"""Run and step states, and the one explicit table of legal transitions."""

from __future__ import annotations

from enum import StrEnum

from tideflow.errors import IllegalTransition


class RunStatus(StrEnum):
    """The lifecycle of one run."""

    PENDING = "pending"
    """Created, not yet started."""
    RUNNING = "running"
    """Steps are being scheduled."""
    SUCCEEDED = "succeeded"
    """Every step ended and none failed the run."""
    FAILED = "failed"
    """A step failed with `on_error: fail` (or the run input was refused)."""
    CANCELLED = "cancelled"
    """Cancelled on request."""
    TIMED_OUT = "timed_out"
    """The run-level `timeout` passed."""
    COMPENSATING = "compensating"
    """The run failed (or was cancelled or timed out under `on_failure: compensate`) and
    compensations are running in reverse completion order."""
    COMPENSATED = "compensated"
    """Every compensation succeeded."""
    COMPENSATION_FAILED = "compensation_failed"
    """A compensation exhausted its retries; an operator must look."""


class StepStatus(StrEnum):
    """The lifecycle of one step instance (a loop iteration or map item is an instance)."""

    PENDING = "pending"
    """Waiting for its dependencies."""
    READY = "ready"
    """Its join is satisfied; about to start."""
    RUNNING = "running"
    """An attempt is in flight: dispatched, and started once a worker reports it (a fact
    recorded on the running attempt, ``StepState.attempt_started_at``, not a state of its
    own); or a map, loop or subflow is in progress."""
    RETRYING = "retrying"
    """An attempt failed; the next one starts after the backoff delay."""
    WAITING = "waiting"
    """A `wait` for a signal or a `sleep` timer."""
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    """Its last attempt failed, or its `any` / `at_least` join failed (``JoinFailed``)."""
    SKIPPED = "skipped"
    """Its `when` was false, or its join can never be satisfied because of skips."""
    CANCELLED = "cancelled"


class SignalOutcome(StrEnum):
    """What became of a signal sent to one run."""

    DELIVERED = "delivered"
    """Sent to the run: a wait whose match holds takes it, now or (buffered) later."""
    UNMATCHED = "unmatched"
    """The run has ended: nothing was sent and nothing changed."""


RUN_TERMINAL = frozenset(
    {
        RunStatus.SUCCEEDED,
        RunStatus.FAILED,
        RunStatus.CANCELLED,
        RunStatus.TIMED_OUT,
        RunStatus.COMPENSATED,
        RunStatus.COMPENSATION_FAILED,
    }
)
"""Run states that end a run: nothing happens to it any more, unless FAILED moves on to
COMPENSATING in the same step, or an operator retries a FAILED or TIMED_OUT run."""

RUN_RETRYABLE = frozenset({RunStatus.FAILED, RunStatus.TIMED_OUT})
"""Run states an operator retry re-opens (core/reopen.py)."""

STEP_TERMINAL = frozenset(
    {StepStatus.SUCCEEDED, StepStatus.FAILED, StepStatus.SKIPPED, StepStatus.CANCELLED}
)

_R = RunStatus
_S = StepStatus

RUN_TRANSITIONS: dict[RunStatus, frozenset[RunStatus]] = {
    # FAILED and TIMED_OUT -> RUNNING: an operator retry (RunRetried)
    _R.PENDING: frozenset({_R.RUNNING, _R.FAILED, _R.CANCELLED}),
    _R.RUNNING: frozenset({_R.SUCCEEDED, _R.FAILED, _R.CANCELLED, _R.TIMED_OUT, _R.COMPENSATING}),
    _R.FAILED: frozenset({_R.COMPENSATING, _R.RUNNING}),
    _R.COMPENSATING: frozenset(
        {_R.COMPENSATED, _R.COMPENSATION_FAILED, _R.CANCELLED, _R.TIMED_OUT}
    ),
    _R.SUCCEEDED: frozenset(),
    _R.CANCELLED: frozenset(),
    _R.TIMED_OUT: frozenset({_R.RUNNING}),
    _R.COMPENSATED: frozenset(),
    _R.COMPENSATION_FAILED: frozenset(),
}

STEP_TRANSITIONS: dict[StepStatus, frozenset[StepStatus]] = {
    _S.PENDING: frozenset({_S.READY, _S.SKIPPED, _S.FAILED, _S.CANCELLED}),
    _S.READY: frozenset(
        {_S.RUNNING, _S.WAITING, _S.SUCCEEDED, _S.FAILED, _S.SKIPPED, _S.CANCELLED}
    ),
    # running -> running records a fact about the attempt in flight (a worker started it,
    # or its execution was lost and it is dispatched again), not a change of state.
    _S.RUNNING: frozenset({_S.RUNNING, _S.SUCCEEDED, _S.FAILED, _S.RETRYING, _S.CANCELLED}),
    _S.RETRYING: frozenset({_S.RUNNING, _S.FAILED, _S.CANCELLED}),
    _S.WAITING: frozenset({_S.SUCCEEDED, _S.FAILED, _S.CANCELLED}),
    # an operator retry runs again what did not succeed; a loop or map goes on running
    _S.SUCCEEDED: frozenset(),
    _S.FAILED: frozenset({_S.PENDING, _S.RUNNING}),
    _S.SKIPPED: frozenset({_S.PENDING}),
    _S.CANCELLED: frozenset({_S.PENDING, _S.RUNNING}),
}


def check_run_transition(old: RunStatus, new: RunStatus) -> None:
    """Raise IllegalTransition unless the table allows ``old -> new``."""
    if new not in RUN_TRANSITIONS[old]:
        raise IllegalTransition(f"run cannot go from {old} to {new}")


def check_step_transition(step: str, old: StepStatus, new: StepStatus) -> None:
    """Raise IllegalTransition unless the table allows ``old -> new``."""
    if new not in STEP_TRANSITIONS[old]:
        raise IllegalTransition(f"step '{step}' cannot go from {old} to {new}")
