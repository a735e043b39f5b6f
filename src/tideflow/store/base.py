"""The Store port: the source of truth for definitions, runs and their history.

One ``commit`` per batch of applied events: it appends the events and the
transitions they caused to each run's history, saves the runs' new state,
records the event ids as processed and keeps the resulting commands in the
outbox until ``mark_relayed``. Backends implement these few methods; everything
else (queries a person makes) builds on them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tideflow.model.commands import Command
from tideflow.model.events import Event, Transition
from tideflow.model.plan import Plan
from tideflow.model.run import RunState


@dataclass(slots=True, kw_only=True)
class AppliedEvent:
    """One event applied by the core, ready to be committed."""

    event: Event
    state: RunState
    transitions: list[Transition]
    commands: list[Command]


@dataclass(frozen=True, slots=True, kw_only=True)
class HistoryEntry:
    run_id: str
    seq: int
    time: float
    kind: str
    """``event`` (what happened) or ``transition`` (what it changed)."""
    subject: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSummary:
    run_id: str
    workflow: str
    version: str
    status: str
    created_at: float
    finished_at: float | None


class Store(ABC):
    """Abstract store. All methods are coroutines; a backend may batch inside ``commit``."""

    async def open(self) -> None:
        """Connect and check the schema version."""
        return None

    async def close(self) -> None:
        return None

    @abstractmethod
    async def save_definition(self, plan: Plan) -> bool:
        """Register a plan. True when new; no-op for identical content; DefinitionConflict
        when (name, version) exists with different content."""

    @abstractmethod
    async def get_definition(self, name: str, version: str | None = None) -> Plan:
        """The plan by (name, version), or the latest registered version; NotFound otherwise."""

    @abstractmethod
    async def get_plan(self, plan_hash: str) -> Plan:
        """The plan a run pinned, by content hash."""

    @abstractmethod
    async def create_run(self, state: RunState, idempotency_key: str | None = None) -> RunState:
        """Store a new run; with an idempotency key already used, return that run instead."""

    @abstractmethod
    async def load_run(self, run_id: str) -> RunState:
        """The run's current state; NotFound otherwise."""

    @abstractmethod
    async def commit(self, batch: Sequence[AppliedEvent]) -> None:
        """Persist a batch of applied events atomically."""

    @abstractmethod
    async def history(self, run_id: str) -> list[HistoryEntry]:
        """Everything that happened to a run, in order."""

    @abstractmethod
    async def list_runs(
        self, *, status: str | None = None, workflow: str | None = None, limit: int = 100
    ) -> list[RunSummary]:
        """Runs, newest first."""

    @abstractmethod
    async def unfinished_runs(self) -> list[str]:
        """Ids of every run that is not in a terminal state (for recovery)."""
