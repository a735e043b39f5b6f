"""Engine start: put back in motion what a stopped process left, reading only indexed rows.

A store may hold many unfinished runs, most of them waiting for a signal or a
timer far away; recovery loads none of those. It reads:

- the outbox: effects committed but not relayed (finished runs, child runs,
  emitted events) are relayed now;
- once, after an upgrade from schema 1: the runs stored before these rows existed
  (``Store.unindexed_runs``) are loaded and their rows written (``Store.index_run``);
- the runs created but never started (``status = pending``): not here; the engine's
  admitter (runtime/admission.py) starts them from the store in order, as its bound allows;
- the attempts in flight that nobody holds a lease on (``Store.expired_tasks``):
  only their runs are loaded; an attempt that was dispatched but never started is
  dispatched again (same attempt, same idempotency key, its ``schedule_to_start``
  counting again from now), one that a worker had started goes through the core as
  a ``TaskLost`` (dispatched again, or ``StepOutcomeUnknown`` for ``idempotent: false``);
- the timers: the wheel loads those due within its horizon (``TimerWheel.refill``).

Waits need nothing: an emitted event finds its waiting runs with
``Store.runs_waiting_for``, a signal loads its run when it arrives.

In a cluster a server recovers each partition it takes (``owns``: the runs of the
partitions being taken), before it applies their events. The rows are read for every
partition and filtered here by ``partition_of(run_id)``: the queries are the same as
embedded mode's; a partition-indexed column is a later refinement.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from tideflow.core.resume import lost_attempts, lost_events, resume_commands
from tideflow.core.saga import lost_compensation
from tideflow.errors import StoreUnavailable
from tideflow.model.commands import Command, DispatchTask, StartChildRun, StartTimer
from tideflow.model.plan import Plan
from tideflow.model.run import RunState
from tideflow.runtime.clock import Clock
from tideflow.runtime.relay import Relay
from tideflow.runtime.runs import Plans, RunCache
from tideflow.runtime.timers import TimerWheel
from tideflow.store.base import Store, TaskLease

log = logging.getLogger("tideflow.runtime")

Owns = Callable[[str], bool]
"""Run id -> whether this engine owns the run (its partition): what recovery and the
sweep (runtime/sweep.py) look after."""


def every_run(run_id: str) -> bool:
    """The default ``Owns``: one engine owns every run of its store."""
    return True


async def recover(
    *,
    store: Store,
    runs: RunCache,
    plans: Plans,
    timers: TimerWheel,
    relay: Relay,
    clock: Clock,
    owns: Owns = every_run,
) -> None:
    """Resume what the store says was left in motion (see the module docstring) for the
    runs ``owns`` says; effects go through the relay, so they are retried until they
    succeed."""
    now = clock.now()
    pending = [item for item in await store.pending_outbox() if owns(item.run_id)]
    await relay.relay([item.command for item in pending], dict(enumerate(i.id for i in pending)))
    await _index_unindexed(store, runs, plans, now, owns)
    await _resume_in_flight(store, runs, plans, relay, now, owns)
    await timers.refill()


async def _index_unindexed(
    store: Store, runs: RunCache, plans: Plans, now: float, owns: Owns
) -> None:
    """Write the rows of runs stored before they existed (schema 1), once."""
    while run_ids := await store.unindexed_runs():
        run_ids = [run_id for run_id in run_ids if owns(run_id)]
        if not run_ids:
            return  # the rest belongs to other servers' partitions
        for run_id in run_ids:
            try:
                state = (await runs.get(run_id)).state
                plan = await plans.get(state.plan_hash)
                await store.index_run(state, in_flight(plan, state, now))
            except Exception as exc:
                _cannot_resume(run_id, exc)
                return  # left for the next start rather than retried in a loop
            runs.evict(run_id)


def in_flight(plan: Plan, state: RunState, now: float) -> list[TaskLease]:
    """The attempts of a run in flight by its state: dispatched (re-dispatched on resume)
    or started (lost on resume)."""
    leases = [
        TaskLease(
            run_id=state.run_id,
            step_key=st.key,
            attempt=st.attempts,
            dispatched_at=now,
            started_at=st.attempt_started_at,
        )
        for st in lost_attempts(plan, state)
    ]
    compensation = lost_compensation(state)  # a started compensation attempt is a row too
    if compensation is not None:
        key, attempt, started = compensation
        leases.append(
            TaskLease(
                run_id=state.run_id,
                step_key=key,
                attempt=attempt,
                dispatched_at=now,
                started_at=started,
            )
        )
    for c in resume_commands(plan, state, now):
        if isinstance(c, DispatchTask):
            leases.append(
                TaskLease(
                    run_id=state.run_id, step_key=c.step_key, attempt=c.attempt, dispatched_at=now
                )
            )
        elif isinstance(c, StartChildRun) and c.wait:  # a sync child run is a row too
            leases.append(
                TaskLease(run_id=state.run_id, step_key=c.step_key, attempt=0, dispatched_at=now)
            )
    return leases


async def _resume_in_flight(
    store: Store, runs: RunCache, plans: Plans, relay: Relay, now: float, owns: Owns
) -> None:
    expired = await store.expired_tasks(now)
    run_ids = dict.fromkeys(lease.run_id for lease in expired if owns(lease.run_id))
    for run_id in run_ids:
        try:
            state = (await runs.get(run_id)).state
            plan = await plans.get(state.plan_hash)
        except StoreUnavailable:
            raise  # not this run's fault: skipped, it would stay as it is until a restart
        except Exception as exc:
            _cannot_resume(run_id, exc)
            continue
        commands = [c for c in resume_commands(plan, state, now) if _not_stored(state, c)]
        await store.index_run(state, in_flight(plan, state, now))  # drops rows gone stale
        await relay.relay(commands)
        await relay.send(
            lost_events(plan, state, now), "report lost attempts"
        )  # started, never finished


def _not_stored(state: RunState, command: Command) -> bool:
    """Whether a resumed command is news: an armed timer is in the store already, unless
    recovery moved it (a queued attempt's ``schedule_to_start`` counts again from now)."""
    if not isinstance(command, StartTimer):
        return True
    ref = state.timers.get(command.timer_id)
    return ref is None or ref.fire_at != command.fire_at


def _cannot_resume(run_id: str, exc: Exception) -> None:
    log.error("run %s cannot be resumed: %s: %s", run_id, type(exc).__name__, exc)


__all__ = ["recover"]
