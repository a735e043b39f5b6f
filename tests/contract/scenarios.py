"""Real runs for the contract suite: events come from the pure core through
``CoreHarness`` and are committed the way the runtime commits them (one live state
object per run, a sequence number per run, snapshots now and then, batches that
mix runs)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tideflow.core.decide import Decision, decide
from tideflow.dsl import compile_definition
from tideflow.model import codec
from tideflow.model.events import Event
from tideflow.model.plan import Plan, Priority
from tideflow.model.run import RunState
from tideflow.store.base import AppliedEvent, Store
from tideflow.testing.harness import CoreHarness

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z

ORDER: dict[str, Any] = {
    "name": "order",
    "version": "1",
    "steps": [
        {"id": "fetch", "type": "noop"},
        {
            "id": "charge",
            "type": "noop",
            "depends_on": ["fetch"],
            "retry": {"max_attempts": 3, "backoff": "1s"},
        },
        {
            "id": "announce",
            "type": "emit",
            "depends_on": ["charge"],
            "event": {"type": "order.charged", "data": {"n": 1}},
        },
        {"id": "invoice", "type": "subflow", "depends_on": ["charge"], "workflow": "invoicing"},
        {"id": "pause", "type": "sleep", "duration": "5s", "depends_on": ["announce"]},
        {"id": "approval", "type": "wait", "signal": "approve", "depends_on": ["invoice"]},
        {"id": "ship", "type": "noop", "depends_on": ["pause", "approval"]},
    ],
}
"""Tasks, a retry after a failure, a timer, an emitted event, a child run, a signal."""

SHORT: dict[str, Any] = {"name": "short", "version": "1", "steps": [{"id": "only", "type": "noop"}]}


def order_plan() -> Plan:
    return compile_definition(ORDER)


def short_plan() -> Plan:
    return compile_definition(SHORT)


Action = Callable[[], Any]
_EVENT_ID_BLOCKS = itertools.count(1)


def order_script(h: CoreHarness) -> list[Action]:
    """Every step of an ``order`` run, to the end (9 events)."""
    return [
        lambda: h.start({"order": h.run_id}),
        lambda: h.complete("fetch", {"ok": True}),
        lambda: h.fail("charge"),
        lambda: h.advance(2),
        lambda: h.complete("charge", {"amount": 5}),
        lambda: h.signal("approve", {"by": "ann"}),
        lambda: h.child_finished("invoice", output={"invoice": 7}),
        lambda: h.advance(10),
        lambda: h.complete("ship", {"shipped": True}),
    ]


def short_script(h: CoreHarness) -> list[Action]:
    return [lambda: h.start(), lambda: h.complete("only", {"done": h.run_id})]


@dataclass
class Driver:
    store: Store
    batch_size: int = 1
    snapshot_every: int = 0
    """Flag every n-th event of a run for a snapshot (0: only when the run ends)."""
    harnesses: dict[str, CoreHarness] = field(default_factory=dict)
    seqs: dict[str, int] = field(default_factory=dict)
    pending: list[AppliedEvent] = field(default_factory=list)
    committed: list[AppliedEvent] = field(default_factory=list)
    relayed: list[str] = field(default_factory=list)
    """Outbox ids to forget with the next commit."""

    async def new_run(
        self,
        plan: Plan,
        run_id: str,
        *,
        now: float = T0,
        key: str | None = None,
        priority: Priority = Priority.NORMAL,
    ) -> CoreHarness:
        h = CoreHarness(plan, run_id=run_id, now=now)
        h.state.priority = priority
        # event ids are unique across runs, as the runtime's are (the harness counts per run)
        h._ids = itertools.count(1000 * next(_EVENT_ID_BLOCKS) + 1)
        h.on_decision = lambda event, decision: self._record(h, event, decision)
        self.harnesses[run_id] = h
        assert await self.store.create_run(h.state, key) == (run_id, True)
        return h

    def _record(self, h: CoreHarness, event: Event, decision: Decision) -> None:
        if not decision.changed:
            return
        seq = self.seqs[h.run_id] = self.seqs.get(h.run_id, 0) + 1
        every = self.snapshot_every
        snapshot = h.state.is_terminal or bool(every and seq % every == 0)
        self.pending.append(
            AppliedEvent(
                event=event,
                state=h.state,
                transitions=decision.transitions,
                commands=decision.commands,
                seq=seq,
                snapshot=snapshot,
            )
        )

    async def flush(self) -> None:
        if self.pending:
            await self.store.commit(self.pending, self.relayed)
            self.committed.extend(self.pending)
            self.pending, self.relayed = [], []

    async def play(self, *scripts: list[Action]) -> None:
        """Run the scripts' actions interleaved, committing whenever a batch is full."""
        for index in range(max(len(s) for s in scripts)):
            for script in scripts:
                if index < len(script):
                    script[index]()
                    if len(self.pending) >= self.batch_size:
                        await self.flush()
        await self.flush()


async def loaded_state(store: Store, plan: Plan, run_id: str) -> RunState:
    """The run as the runtime rebuilds it: the snapshot with the tail replayed onto it.
    Every tail event must be news to the snapshot: one it already holds would be
    applied twice (decide shrugs that off, so it has to be checked here)."""
    stored = await store.load_run(run_id)
    state = stored.snapshot
    for event in stored.tail:
        assert decide(plan, state, event).changed, f"{event.event_id} is already in the snapshot"
    return state


def same_state(a: RunState, b: RunState) -> bool:
    return codec.state_to_data(a) == codec.state_to_data(b)


UNDO_SCHEMA_10 = ("DROP TABLE gateway_event_rows", "DROP TABLE gateway_events")
"""What migration 10 added (the same on SQLite and PostgreSQL): the gateway's record."""

UNDO_SCHEMA_9 = {
    "sqlite": (
        *UNDO_SCHEMA_10,
        """CREATE TABLE history_8 (
            run_id TEXT NOT NULL, seq INTEGER NOT NULL, event_id TEXT NOT NULL UNIQUE,
            kind TEXT NOT NULL, time REAL NOT NULL, data TEXT NOT NULL,
            transitions TEXT NOT NULL, PRIMARY KEY (run_id, seq))""",
        "INSERT INTO history_8 SELECT * FROM history",
        "DROP TABLE history",
        "ALTER TABLE history_8 RENAME TO history",
    ),
    "postgres": (
        *UNDO_SCHEMA_10,
        "ALTER TABLE history ADD CONSTRAINT history_event_id_key UNIQUE (event_id)",
    ),
}
"""What migrations 9 and 10 changed, undone: history with its unique index on event_id."""

UNDO_SCHEMA_8 = {
    "sqlite": (
        *UNDO_SCHEMA_9["sqlite"],
        """CREATE TABLE task_leases_7 (
            run_id TEXT NOT NULL, step_key TEXT NOT NULL, attempt INTEGER NOT NULL,
            dispatched_at REAL NOT NULL, started_at REAL, owner TEXT,
            lease_until REAL NOT NULL DEFAULT 0, PRIMARY KEY (run_id, step_key))""",
        "INSERT INTO task_leases_7 SELECT * FROM task_leases",
        "DROP TABLE task_leases",
        "ALTER TABLE task_leases_7 RENAME TO task_leases",
        "CREATE INDEX task_leases_until ON task_leases (lease_until)",
    ),
    "postgres": (
        *UNDO_SCHEMA_9["postgres"],
        "CREATE INDEX task_leases_until ON task_leases (lease_until)",
    ),
}
"""What migrations 8 and 9 changed, undone: task_leases as migration 2 made it (on SQLite a
table with a rowid), with its index on lease_until, and history as migration 1 made it."""

UNDO_SCHEMA_7 = ("DROP TABLE schedules",)
"""What migration 7 added (the same on SQLite and PostgreSQL)."""

UNDO_SCHEMA_6 = (
    *UNDO_SCHEMA_7,
    "DROP TABLE definition_triggers",
    "ALTER TABLE definitions DROP COLUMN active",
)
"""What migrations 6 and 7 added (the same on SQLite and PostgreSQL), to make a store as an
older tideflow left it."""
