"""The scheduler's working set: live run states, loaded from the store on demand.

A run that is not cached is loaded as its latest snapshot plus the events after
it, replayed through the pure core (replay only rebuilds state; the commands
those events produced were carried out when they were first applied).
"""

from __future__ import annotations

from dataclasses import dataclass

from tideflow.core.decide import decide
from tideflow.model.codec import StateFormatError
from tideflow.model.events import Event
from tideflow.model.plan import Plan
from tideflow.model.run import RunState
from tideflow.store.base import Store

SNAPSHOT_EVERY_MIN = 32
"""A run is snapshotted after at least this many events (more for larger runs)."""


@dataclass(slots=True)
class LiveRun:
    state: RunState
    last_seq: int
    since_snapshot: int = 0

    def next_seq(self) -> tuple[int, bool]:
        """Advance the sequence; also say whether this event's state should be snapshotted."""
        self.last_seq += 1
        self.since_snapshot += 1
        state = self.state
        if state.is_terminal or self.since_snapshot >= max(SNAPSHOT_EVERY_MIN, len(state.steps)):
            self.since_snapshot = 0
            return self.last_seq, True
        return self.last_seq, False


def _replay(plan: Plan, state: RunState, event: Event) -> None:
    try:
        decide(plan, state, event)
    except Exception as exc:  # a damaged history row: name it instead of a traceback
        raise StateFormatError(
            f"run {state.run_id!r}: its history cannot be replayed: event "
            f"{type(event).__name__} {event.event_id!r} fails with {type(exc).__name__}: {exc}"
        ) from exc


class Plans:
    """Plans by content hash, fetched from the store once."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._plans: dict[str, Plan] = {}

    def add(self, plan: Plan) -> None:
        self._plans[plan.hash] = plan

    async def get(self, plan_hash: str) -> Plan:
        plan = self._plans.get(plan_hash)
        if plan is None:
            plan = self._plans[plan_hash] = await self._store.get_plan(plan_hash)
        return plan


class RunCache:
    def __init__(self, store: Store, plans: Plans) -> None:
        self._store = store
        self._plans = plans
        self._live: dict[str, LiveRun] = {}

    def __contains__(self, run_id: str) -> bool:
        return run_id in self._live

    def add(self, state: RunState) -> LiveRun:
        live = self._live[state.run_id] = LiveRun(state, 0)
        return live

    def evict(self, run_id: str) -> None:
        self._live.pop(run_id, None)

    def cached(self) -> list[LiveRun]:
        return list(self._live.values())

    async def get(self, run_id: str) -> LiveRun:
        live = self._live.get(run_id)
        if live is None:
            stored = await self._store.load_run(run_id)
            state = stored.snapshot
            if stored.tail:
                plan = await self._plans.get(state.plan_hash)
                for event in stored.tail:
                    _replay(plan, state, event)
            cached = self._live.get(run_id)
            if cached is not None:  # loaded (and maybe advanced) by another caller meanwhile
                return cached
            live = LiveRun(state, stored.last_seq, len(stored.tail))
            if not state.is_terminal:
                self._live[run_id] = live
        return live


class WaitIndex:
    """Which runs have a `wait` on which signal name, so an emitted event reaches its
    listeners without looking at every run. Kept current after every commit."""

    def __init__(self) -> None:
        self._by_run: dict[str, frozenset[str]] = {}
        self._by_name: dict[str, set[str]] = {}

    def update(self, state: RunState) -> None:
        old = self._by_run.get(state.run_id, frozenset())
        if not old and not state.waiting:
            return  # the common case: nothing waits before or after
        names = frozenset(state.waiting) if not state.is_terminal else frozenset()
        if names == old:
            return
        for name in old - names:
            runs = self._by_name[name]
            runs.discard(state.run_id)
            if not runs:
                del self._by_name[name]
        for name in names - old:
            self._by_name.setdefault(name, set()).add(state.run_id)
        if names:
            self._by_run[state.run_id] = names
        else:
            self._by_run.pop(state.run_id, None)

    def waiting_for(self, name: str) -> list[str]:
        return sorted(self._by_name.get(name, ()))
