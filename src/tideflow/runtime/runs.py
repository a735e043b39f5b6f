"""The scheduler's working set: live run states, loaded from the store on demand and
evicted when idle (a bounded LRU), so memory follows the active runs, not the stored ones.

A run that is not cached is loaded as its latest snapshot plus the events after
it, replayed through the pure core (replay only rebuilds state; the commands
those events produced were carried out when they were first applied).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
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

    def known(self, plan_hash: str) -> Plan | None:
        """The plan if it was fetched already (no await on the hot path)."""
        return self._plans.get(plan_hash)

    async def get(self, plan_hash: str) -> Plan:
        plan = self._plans.get(plan_hash)
        if plan is None:
            plan = self._plans[plan_hash] = await self._store.get_plan(plan_hash)
        return plan


DEFAULT_RUN_CACHE_SIZE = 10_000
"""How many idle runs an engine keeps in memory (``Runtime(run_cache_size=…)``)."""


class RunCache:
    """Live run states, least recently used first. Beyond ``size`` runs the idle ones
    are evicted (they load again from the store when an event arrives for them); a run
    that ``busy`` says is in flight (being applied or committed) is never evicted."""

    def __init__(
        self,
        store: Store,
        plans: Plans,
        *,
        size: int = DEFAULT_RUN_CACHE_SIZE,
        busy: Callable[[str], bool] = lambda run_id: False,
    ) -> None:
        if size < 1:
            raise ValueError(f"the run cache size must be at least 1, got {size}")
        self._store = store
        self._plans = plans
        self._size = size
        self._busy = busy
        self._live: OrderedDict[str, LiveRun] = OrderedDict()

    def __contains__(self, run_id: str) -> bool:
        return run_id in self._live

    def __len__(self) -> int:
        return len(self._live)

    def add(self, state: RunState) -> LiveRun:
        live = self._live[state.run_id] = LiveRun(state, 0)
        self.trim()
        return live

    def evict(self, run_id: str) -> None:
        self._live.pop(run_id, None)

    def evict_where(self, gone: Callable[[str], bool]) -> int:
        """Evict every cached run ``gone`` says (a partition given up); how many."""
        victims = [run_id for run_id in self._live if gone(run_id)]
        for run_id in victims:
            del self._live[run_id]
        return len(victims)

    def cached(self) -> list[LiveRun]:
        return list(self._live.values())

    def hit(self, run_id: str) -> LiveRun | None:
        """The run if it is cached (counted as used), without an await."""
        live = self._live.get(run_id)
        if live is not None:
            self._live.move_to_end(run_id)
        return live

    async def get(self, run_id: str) -> LiveRun:
        live = self._live.get(run_id)
        if live is not None:
            self._live.move_to_end(run_id)
            return live
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
            self.trim()
        return live

    def trim(self) -> None:
        """Evict the least recently used idle runs beyond the size (the newest stays).
        Also called after each batch: the runs a batch loaded could not be evicted while
        it was in flight."""
        excess = len(self._live) - self._size
        if excess <= 0:
            return
        newest = next(reversed(self._live))
        victims: list[str] = []
        for run_id in self._live:  # oldest first; stops after a few in the usual case
            if run_id == newest or len(victims) == excess:
                break
            if not self._busy(run_id):
                victims.append(run_id)
        for run_id in victims:
            del self._live[run_id]
