"""The rules of runtime/shown.py on histories as the store keeps them: an attempt lost
and run again is two rows (lost, then its outcome); an attempt still open when its run
ended takes the run's end; a step shows what its compensation made of it."""

from __future__ import annotations

from typing import Any

import pytest

from tideflow.runtime.shown import attempts_of, step_shown
from tideflow.store.base import HistoryEntry


def entry(seq: int, kind: str, event: dict[str, Any], *moves: tuple[str, str, str]) -> HistoryEntry:
    transitions = [
        {"subject": s, "old": old, "new": new, "time": float(seq), "cause": f"{kind} moved it"}
        for s, old, new in moves
    ]
    return HistoryEntry(
        run_id="r", seq=seq, time=float(seq), kind=kind, event=event, transitions=transitions
    )


def test_a_lost_attempt_run_again_is_two_rows() -> None:
    history = [
        entry(1, "task_started", {"step_key": "a", "attempt": 1, "worker": "h/1"}),
        entry(2, "task_lost", {"step_key": "a", "attempt": 1, "reason": "its worker stopped"}),
        entry(3, "task_started", {"step_key": "a", "attempt": 1, "worker": "h/2"}),
        entry(4, "task_completed", {"step_key": "a", "attempt": 1}, ("a", "running", "succeeded")),
    ]
    rows = [
        (a.attempt, a.worker, a.started_at, a.ended_at, a.outcome) for a in attempts_of(history)
    ]
    assert rows == [(1, "h/1", 1.0, 2.0, "lost"), (1, "h/2", 3.0, 4.0, "succeeded")]


@pytest.mark.parametrize(
    ("kind", "run_end", "outcome"),
    [
        ("cancel_requested", "cancelled", "cancelled"),
        ("timer_fired", "timed_out", "timed_out"),
        ("engine_failed", "failed", "lost"),
    ],
)
def test_an_attempt_open_when_its_run_ended_takes_the_runs_end(
    kind: str, run_end: str, outcome: str
) -> None:
    history = [
        entry(1, "task_started", {"step_key": "a", "attempt": 1}),
        entry(2, kind, {}, ("run", "running", run_end)),
    ]
    [attempt] = attempts_of(history)
    assert (attempt.outcome, attempt.ended_at) == (outcome, 2.0)


def test_a_step_transition_out_of_running_ends_its_attempt() -> None:
    history = [
        entry(1, "task_started", {"step_key": "a", "attempt": 1}),
        entry(2, "task_started", {"step_key": "a", "attempt": 1, "compensation": True}),
        entry(3, "timer_fired", {"timer_id": "t"}, ("a:compensate", "running", "retrying")),
        entry(4, "cancel_requested", {}, ("a", "running", "cancelled")),
    ]
    rows = [(a.compensation, a.outcome, a.ended_at) for a in attempts_of(history)]
    assert rows == [(False, "cancelled", 4.0), (True, "timed_out", 3.0)]


@pytest.mark.parametrize(
    ("status", "compensation", "shown"),
    [
        ("succeeded", None, "succeeded"),
        ("succeeded", "running", "compensating"),
        ("succeeded", "retrying", "compensating"),
        ("succeeded", "succeeded", "compensated"),
        ("succeeded", "failed", "compensation_failed"),
        ("failed", None, "failed"),
    ],
)
def test_a_step_shows_what_its_compensation_made_of_it(
    status: str, compensation: str | None, shown: str
) -> None:
    assert step_shown(status, compensation) == shown
