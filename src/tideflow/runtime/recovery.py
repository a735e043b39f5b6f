"""Recovery: put every unfinished run of a store back in motion when an engine starts.

Effects still in the outbox are relayed again (and acknowledged once they succeed);
runs created but never started are started; for every other unfinished run the pure
core lists what to redo (``resume_commands``: timers, attempts dispatched but never
started, a running compensation, a sync child run) and the attempts a worker had
started but whose outcome was never recorded go through the core as ``TaskLost``
(dispatched again, or ``StepOutcomeUnknown`` for an ``idempotent: false`` step).
"""

from __future__ import annotations

import logging

from tideflow.core.resume import lost_events, resume_commands
from tideflow.model.states import RunStatus
from tideflow.runtime.catalog import started_event
from tideflow.runtime.clock import Clock
from tideflow.runtime.relay import Relay
from tideflow.runtime.runs import Plans, RunCache, WaitIndex
from tideflow.store.base import Store

log = logging.getLogger("tideflow.runtime")


async def recover(
    *, store: Store, runs: RunCache, plans: Plans, waits: WaitIndex, relay: Relay, clock: Clock
) -> None:
    """Resume every unfinished run in ``store`` (a damaged run is logged and skipped)."""
    pending = await store.pending_outbox()
    await relay.relay([item.command for item in pending], dict(enumerate(i.id for i in pending)))
    for run_id in await store.unfinished_runs():
        try:
            state = (await runs.get(run_id)).state
            waits.update(state)
            if state.status is RunStatus.PENDING:
                await relay.send([started_event(state, clock.now())], "start run")
                continue
            plan = await plans.get(state.plan_hash)
        except Exception as exc:  # a damaged run must not keep the others from resuming
            log.error("run %s cannot be resumed: %s: %s", run_id, type(exc).__name__, exc)
            continue
        await relay.relay(resume_commands(plan, state, clock.now()))
        await relay.send(lost_events(plan, state, clock.now()), "report lost attempts")
