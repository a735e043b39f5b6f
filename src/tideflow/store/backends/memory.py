"""The in-memory store: the embedded default until a durable store is chosen, and the
reference for the contract tests. Nothing survives the process."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from tideflow.errors import DefinitionConflict, NotFound
from tideflow.model.events import EVENT_KINDS, Event, Transition
from tideflow.model.plan import Plan
from tideflow.model.run import RunState
from tideflow.model.versions import latest
from tideflow.store.base import AppliedEvent, HistoryEntry, RunSummary, Store


class MemoryStore(Store):
    def __init__(self) -> None:
        self._definitions: dict[tuple[str, str], Plan] = {}
        self._plans: dict[str, Plan] = {}
        self._runs: dict[str, RunState] = {}
        self._idempotency: dict[str, str] = {}
        self._log: dict[str, list[tuple[Event, list[Transition]]]] = {}
        self._processed: set[str] = set()

    async def save_definition(self, plan: Plan) -> bool:
        key = (plan.name, plan.version)
        existing = self._definitions.get(key)
        if existing is not None:
            if existing.hash != plan.hash:
                raise DefinitionConflict(
                    f"{plan.name} {plan.version} is already registered with different content; "
                    "give the changed definition a new version"
                )
            return False
        self._definitions[key] = plan
        self._plans[plan.hash] = plan
        return True

    async def get_definition(self, name: str, version: str | None = None) -> Plan:
        version = version or latest(v for n, v in self._definitions if n == name)
        plan = self._definitions.get((name, version or ""))
        if plan is None:
            known = ", ".join(sorted({n for n, _ in self._definitions})) or "none"
            which = f"{name!r} version {version}" if version else repr(name)
            raise NotFound(f"no definition {which} (registered: {known})")
        return plan

    async def get_plan(self, plan_hash: str) -> Plan:
        try:
            return self._plans[plan_hash]
        except KeyError:
            raise NotFound(f"no plan with hash {plan_hash}") from None

    async def create_run(self, state: RunState, idempotency_key: str | None = None) -> RunState:
        if idempotency_key is not None:
            existing = self._idempotency.get(idempotency_key)
            if existing is not None:
                return self._runs[existing]
            self._idempotency[idempotency_key] = state.run_id
        self._runs[state.run_id] = state
        self._log[state.run_id] = []
        return state

    async def load_run(self, run_id: str) -> RunState:
        try:
            return self._runs[run_id]
        except KeyError:
            raise NotFound(f"no run {run_id!r}") from None

    async def commit(self, batch: Sequence[AppliedEvent]) -> None:
        processed = self._processed
        for applied in batch:
            event = applied.event
            if event.event_id in processed:
                continue
            processed.add(event.event_id)
            self._runs[event.run_id] = applied.state
            # Kept as objects; turned into HistoryEntry rows only when someone reads them.
            self._log.setdefault(event.run_id, []).append((event, applied.transitions))

    async def history(self, run_id: str) -> list[HistoryEntry]:
        await self.load_run(run_id)
        entries: list[HistoryEntry] = []
        for event, transitions in self._log.get(run_id, ()):
            entries.append(
                HistoryEntry(
                    run_id=run_id,
                    seq=len(entries) + 1,
                    time=event.time,
                    kind="event",
                    subject=EVENT_KINDS[type(event)],
                    data=_event_data(event),
                )
            )
            for tr in transitions:
                entries.append(
                    HistoryEntry(
                        run_id=run_id,
                        seq=len(entries) + 1,
                        time=tr.time,
                        kind="transition",
                        subject=tr.subject,
                        data={
                            "old": tr.old,
                            "new": tr.new,
                            "cause": tr.cause,
                            "attempt": tr.attempt,
                        },
                    )
                )
        return entries

    async def list_runs(
        self, *, status: str | None = None, workflow: str | None = None, limit: int = 100
    ) -> list[RunSummary]:
        out = [
            RunSummary(
                run_id=s.run_id,
                workflow=s.workflow,
                version=s.version,
                status=s.status.value,
                created_at=s.created_at,
                finished_at=s.finished_at,
            )
            for s in self._runs.values()
            if (status is None or s.status.value == status)
            and (workflow is None or s.workflow == workflow)
        ]
        out.sort(key=lambda r: r.created_at, reverse=True)
        return out[:limit]

    async def unfinished_runs(self) -> list[str]:
        return [run_id for run_id, s in self._runs.items() if not s.is_terminal]


def _event_data(event: Any) -> dict[str, Any]:
    data = asdict(event)
    data.pop("run_id", None)
    return data
