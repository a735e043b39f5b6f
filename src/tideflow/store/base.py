"""The Store port: the source of truth for definitions, runs and their history.

A run is stored event-sourced: its history (every event that changed it, with
the transitions it caused) is append-only, and a *snapshot* of the full run
state is written now and then (always when the run ends). Loading a run is its
latest snapshot plus the events after it, which the runtime replays through the
pure core. Each commit therefore writes O(events) rows, never the whole state of
a large run per event, and the snapshot cadence (the runtime's choice) keeps
replay short.

``commit`` is one transaction per batch: history rows, the runs' summary columns
(status, output, error, last sequence number), snapshots, processed event ids
(history's unique ``event_id``), outbox rows for effects that cannot be
re-derived from state (finished runs, child runs, emitted events), and the
deletion of outbox rows already relayed, and the indexed rows an engine reads instead
of loading runs (``store/indexrows.py``): each run's armed timers (``due_timers``),
its attempts in flight with their leases (``claim_task``, ``extend_task``,
``expired_tasks``) and the signal names it waits for (``runs_waiting_for``).
Optimistic concurrency: each run's
``last_seq`` must still be what the applier loaded, or the whole commit fails
with ``ConcurrencyConflict`` and nothing is written.

A failed commit says why, so the runtime can react: ``StoreUnavailable`` (the
store is down or busy: try again later), ``UnstorableData`` (a value of the
batch cannot be stored: it never will be), ``ConcurrencyConflict`` (reload and
apply again).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# The store's errors live in the one tree (tideflow.errors); importable from here too.
from tideflow.errors import ConcurrencyConflict as ConcurrencyConflict
from tideflow.errors import StoreError as StoreError
from tideflow.errors import StoreUnavailable as StoreUnavailable
from tideflow.errors import UnstorableData as UnstorableData
from tideflow.model.commands import (
    CancelChildRun,
    Command,
    EmitEvent,
    RunFinished,
    StartChildRun,
)
from tideflow.model.events import Event, Transition
from tideflow.model.plan import Plan, Priority
from tideflow.model.quick import quick_init
from tideflow.model.run import RunState
from tideflow.model.schedules import ScheduleRow
from tideflow.model.tokens import ApiToken

GATEWAY_STATUSES = ("delivered", "buffered", "unmatched")
"""What the event gateway recorded of an event (``duplicate`` is only ever an answer)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GatewayEvent:
    """An event the gateway answered, as recorded (``Store.keep_event``)."""

    key: str
    """Its identity: derived from (``source``, ``id``) (api/events.py ``signal_id``)."""
    source: str
    id: str
    type: str
    run_id: str | None
    """The run its ``tideflowrunid`` names; None for an event routed by content."""
    payload: Any
    status: str
    """One of ``GATEWAY_STATUSES``."""
    received_at: float
    buffer_until: float
    """When its buffer ends (``received_at`` for an event that was never buffered)."""
    delivered_to: tuple[str, ...] = ()
    started: tuple[str, ...] = ()
    reason: str | None = None

    def unmatched(self, now: float) -> bool:
        """Whether it is in the dead letter at ``now``: unmatched, or buffered past its
        buffer and handed to no run."""
        return self.status == "unmatched" or (
            self.status == "buffered" and self.buffer_until <= now and not self.delivered_to
        )


OUTBOX_COMMANDS = (RunFinished, StartChildRun, CancelChildRun, EmitEvent)
"""Commands kept in the outbox until relayed. The others (tasks, timers, task
cancellations) are re-derived from the run state on recovery."""


@dataclass(slots=True, kw_only=True)
class AppliedEvent:
    """One event applied by the core, ready to be committed."""

    event: Event
    state: RunState
    transitions: list[Transition]
    commands: list[Command]
    seq: int
    """The run's sequence number of this event (the previous ``last_seq`` + 1)."""
    snapshot: bool = False
    """Also store the full state after this event."""

    _outbox: list[tuple[str, Command]] | None = field(
        default=None, init=False, repr=False, compare=False
    )
    """``outbox`` once computed: the store and the relay both read it, per event."""

    @property
    def outbox(self) -> list[tuple[str, Command]]:
        """Outbox entries of this event: ``(id, command)``, ids derived from the event id."""
        entries = self._outbox
        if entries is None:
            entries = self._outbox = []
            for index, command in enumerate(self.commands):
                if isinstance(command, OUTBOX_COMMANDS):
                    entries.append((f"{self.event.event_id}#{index}", command))
        return entries


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredRun:
    """What ``load_run`` returns: replay ``tail`` over ``snapshot`` to get the run state."""

    snapshot: RunState
    tail: list[Event]
    last_seq: int


@dataclass(frozen=True, slots=True, kw_only=True)
class HistoryEntry:
    run_id: str
    seq: int
    time: float
    kind: str
    """The event kind (``run_started``, ``task_completed``, …)."""
    event: dict[str, Any]
    transitions: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "time": self.time,
            "kind": self.kind,
            "event": self.event,
            "transitions": self.transitions,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSummary:
    run_id: str
    workflow: str
    version: str
    status: str
    created_at: float
    updated_at: float
    finished_at: float | None
    parent_run_id: str | None = None
    output: Any = None
    error: dict[str, Any] | None = None
    title: str | None = None
    """The ``title:`` of the run's definition: filled by the client that reads the run
    (``Client.list``, ``Client.summary``), never stored with it; not in ``to_dict``."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "workflow": self.workflow,
            "version": self.version,
            "status": self.status,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "finished_at": self.finished_at,
            "parent_run_id": self.parent_run_id,
            "output": self.output,
            "error": self.error,
        }


PRIORITY_RANK: Mapping[Priority, int] = {Priority.HIGH: 0, Priority.NORMAL: 1, Priority.LOW: 2}
"""A run's priority as stored (``runs.priority``): the admission queue's first key."""
RANK_PRIORITY: Mapping[int, Priority] = {rank: p for p, rank in PRIORITY_RANK.items()}


@dataclass(frozen=True, slots=True, kw_only=True, order=True)
class PendingRun:
    """A run in the admission queue (``Store.pending_runs``): ordered as admitted, by
    priority (high first), then age, then run id."""

    rank: int
    """``PRIORITY_RANK`` of the run's priority."""
    created_at: float
    run_id: str

    @property
    def priority(self) -> Priority:
        return RANK_PRIORITY[self.rank]


@dataclass(frozen=True, slots=True, kw_only=True)
class RunPage:
    runs: list[RunSummary]
    next_cursor: str | None
    """Pass to ``list_runs(cursor=…)`` for the next page; None on the last page."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DefinitionSummary:
    name: str
    version: str
    hash: str
    created_at: float
    active: bool = True
    """An inactive version starts no new run (``Store.set_definition_active``)."""
    title: str | None = None
    """The definition's ``title:`` (``Plan.title``), if it has one."""


@dataclass(frozen=True, slots=True, kw_only=True)
class OutboxItem:
    id: str
    run_id: str
    command: Command


@dataclass(frozen=True, slots=True, kw_only=True)
class DueTimer:
    """An armed timer as stored: ``due_timers`` returns them soonest first."""

    run_id: str
    timer_id: str
    fire_at: float


@quick_init  # one per dispatched attempt, built by every commit that dispatches
@dataclass(frozen=True, slots=True, kw_only=True)
class TaskLease:
    """An attempt in flight (dispatched, no outcome recorded yet) and who holds it."""

    run_id: str
    step_key: str
    attempt: int
    dispatched_at: float
    started_at: float | None = None
    """When a worker reported the start (``TaskStarted``), if it did."""
    owner: str | None = None
    """Who claimed it (``claim_task``); None while nobody has."""
    lease_until: float = 0.0
    """Until when ``owner`` holds it; 0 when nobody does."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunFilter:
    status: str | None = None
    workflow: str | None = None
    created_after: float | None = None
    created_before: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Lease:
    """Who holds a store lease (the engine lease of embedded mode: ``ENGINE_LEASE``)."""

    name: str
    owner: str
    """A unique id per holder (one per process run)."""
    kind: str
    """``engine`` (runs steps, holds it while it lives) or ``client`` (a command that applies
    one event while no engine is live, for a moment)."""
    host: str
    pid: int
    address: str | None
    """Where the holder is notified of new inbox events (``udp://…``, ``postgres:…``)."""
    acquired_at: float
    expires_at: float
    """Epoch seconds; once passed, another process may take the lease over."""


NewRun = tuple[RunState, str | None]
"""A run to create and its idempotency key (``Store.create_runs``)."""
Created = tuple[str, bool]
"""``(run_id, created)``: the run's id, or that of the run its idempotency key named."""

ENGINE_LEASE = "engine"
"""The lease of embedded mode's one engine (and of a client's moment, runtime/lease.py)."""
MEMBER_LEASES = "server:"
"""Prefix of a cluster's membership leases, one per live `tideflow server`."""
PARTITION_LEASES = "partition:"
"""Prefix of a cluster's partition leases, ``partition:<n>`` (runtime/partitions.py)."""

InboxListener = Callable[[], None]
"""Called (on the event loop) when another process has put events into the inbox."""

Archive = Callable[[dict[str, Any]], None]
"""Receives each pruned run as ``{"run": RunSummary dict, "history": [HistoryEntry dicts]}``."""


class Store(ABC):
    """Abstract store; every method is a coroutine. Backends: memory, sqlite, postgres."""

    url: str = "memory://"
    compile_plan: Callable[[Mapping[str, Any]], Plan] | None = None
    """How a SQL store turns a stored definition back into a Plan (the runtime sets it:
    the store itself never imports the DSL)."""

    async def open(self) -> None:
        """Connect, apply missing migrations when allowed, refuse a newer schema."""
        return

    async def close(self) -> None:
        return

    # -- definitions ------------------------------------------------------------

    @abstractmethod
    async def save_definition(self, plan: Plan) -> bool:
        """Register a plan. True when new; False for identical content already there;
        DefinitionConflict when (name, version) exists with different content."""

    @abstractmethod
    async def get_definition(self, name: str, version: str | None = None) -> Plan:
        """The plan by (name, version), or the highest *active* version; NotFound, or
        ``DefinitionInactive`` when every version of ``name`` is deactivated."""

    @abstractmethod
    async def set_definition_active(self, name: str, version: str, active: bool) -> bool:
        """Activate or deactivate a registered version: whether that changed anything;
        ``NotFound``. Runs of a deactivated version go on; it starts no new one."""

    @abstractmethod
    async def triggered_by(self, event: str) -> list[DefinitionSummary]:
        """The active definition versions with a trigger on the event type ``event``, by
        name then version (``Plan.triggers``, indexed when the definition is saved)."""

    @abstractmethod
    async def get_plan(self, plan_hash: str) -> Plan:
        """The plan a run pinned, by content hash; NotFound."""

    @abstractmethod
    async def list_definitions(self, name: str | None = None) -> list[DefinitionSummary]:
        """Registered definitions, by name then version."""

    # -- runs -------------------------------------------------------------------

    async def create_run(
        self, state: RunState, idempotency_key: str | None = None
    ) -> tuple[str, bool]:
        """Store a new (pending) run: ``(run_id, True)``. With an idempotency key already
        used, nothing is written and the existing run's id comes back: ``(id, False)``;
        ``RunExists`` (nothing written) for a run id that is stored already."""
        (created,) = await self.create_runs([(state, idempotency_key)])
        if isinstance(created, Exception):
            raise created
        return created

    @abstractmethod
    async def create_runs(self, runs: Sequence[NewRun]) -> list[Created | Exception]:
        """``create_run`` for many runs in one transaction (a burst of starts is one
        commit): for each, in order, ``(run_id, True)``, ``(the id of the run that has
        its idempotency key, False)`` (a key taken before, or by an earlier run of the
        same batch), or the error of that run alone (``RunExists``, a state that cannot
        be stored), which writes nothing of it and leaves the others be. Raises only
        when nothing could be written (the store is down)."""

    @abstractmethod
    async def load_run(self, run_id: str) -> StoredRun:
        """The run's latest snapshot and the events after it; NotFound."""

    @abstractmethod
    async def commit(self, batch: Sequence[AppliedEvent], relayed: Sequence[str] = ()) -> None:
        """Persist a batch of applied events and forget relayed outbox ids, atomically."""

    @abstractmethod
    async def history(self, run_id: str) -> list[HistoryEntry]:
        """Everything that happened to a run, in order; NotFound."""

    @abstractmethod
    async def get_run(self, run_id: str) -> RunSummary:
        """The run's summary row; NotFound."""

    @abstractmethod
    async def list_runs(
        self, filter: RunFilter | None = None, *, limit: int = 100, cursor: str | None = None
    ) -> RunPage:
        """Runs, newest first, by indexed queries, one page at a time."""

    @abstractmethod
    async def unfinished_runs(self) -> list[str]:
        """Ids of every run that is not in a terminal state (for recovery)."""

    @abstractmethod
    async def pending_runs(self, limit: int, after: PendingRun | None = None) -> list[PendingRun]:
        """The admission queue: up to ``limit`` pending runs in the order they are admitted
        (``PendingRun``), from just after ``after`` (None: from the head); indexed
        (``runs_pending``)."""

    @abstractmethod
    async def count_pending(self, ahead_of: str | None = None) -> int:
        """How many runs are pending; with ``ahead_of``, how many of them come before that
        run in the admission queue (0 for a run that is not stored)."""

    # -- timers, task leases, waits (rows kept current by ``commit``) -------------

    @abstractmethod
    async def due_timers(
        self, before: float, limit: int = 1000, *, after: float | None = None
    ) -> list[DueTimer]:
        """Armed timers with ``after < fire_at <= before``, soonest first (then by run
        and timer id), at most ``limit``."""

    # -- schedules (model/schedules.py, runtime/schedules.py) -------------------------

    @abstractmethod
    async def list_schedules(self, workflow: str | None = None) -> list[ScheduleRow]:
        """Every schedule row (deleted ones too), of ``workflow`` or of all, by workflow
        then schedule id."""

    @abstractmethod
    async def insert_schedule(self, row: ScheduleRow) -> bool:
        """Add a schedule row (its ``revision`` is 0); False when (workflow, schedule id)
        has one already (nothing changes)."""

    @abstractmethod
    async def update_schedule(self, row: ScheduleRow) -> bool:
        """Write every field of the row if the stored one is still at ``row.revision``
        (which is then bumped); False, changing nothing, when it is not (another writer
        came first: read it again) or when there is no such row."""

    @abstractmethod
    async def remove_schedule(self, workflow: str, schedule_id: str) -> bool:
        """Drop a schedule row: whether there was one."""

    @abstractmethod
    async def due_schedules(
        self, before: float, limit: int = 1000, *, after: float | None = None
    ) -> list[ScheduleRow]:
        """The live rows (neither paused nor deleted, with a ``fire_at``) whose ``fire_at``
        is in (``after``, ``before``], soonest first (index ``schedules_fire_at``)."""

    @abstractmethod
    async def runs_waiting_for(self, signal: str) -> list[str]:
        """Ids of the runs with a `wait` on ``signal`` now, sorted."""

    @abstractmethod
    async def claim_task(
        self, run_id: str, step_key: str, attempt: int, *, owner: str, now: float, until: float
    ) -> bool:
        """Take the lease of an attempt in flight until ``until``: True when it is in flight
        and nobody else holds an unexpired lease on it at ``now``."""

    @abstractmethod
    async def extend_task(
        self, run_id: str, step_key: str, attempt: int, *, owner: str, until: float
    ) -> bool:
        """Move ``owner``'s lease on to ``until`` (heartbeat); False when the lease is not
        ``owner``'s any more or the attempt is no longer in flight."""

    @abstractmethod
    async def expired_tasks(self, before: float, limit: int = 10_000) -> list[TaskLease]:
        """Attempts in flight that nobody holds at ``before``: never claimed, or whose
        lease ran out. Oldest lease first."""

    @abstractmethod
    async def tasks_in_flight(
        self, after: tuple[str, str] | None = None, limit: int = 10_000
    ) -> list[TaskLease]:
        """The attempts in flight of actions (task rows, not a sync child's, attempt 0),
        by (run id, step key) after ``after``: the busy runs (runtime/admission.py), read
        on the table's primary key."""

    @abstractmethod
    async def unindexed_runs(self, limit: int = 1000) -> list[str]:
        """Unfinished runs stored before their timer, task and wait rows existed (schema 1):
        ``index_run`` writes them."""

    @abstractmethod
    async def index_run(self, state: RunState, in_flight: Sequence[TaskLease]) -> None:
        """Rewrite a run's timer and wait rows from its state and its task rows from
        ``in_flight`` (the caller knows which steps are actions); it is indexed then."""

    @abstractmethod
    async def pending_outbox(self, limit: int = 1000) -> list[OutboxItem]:
        """Outbox entries not yet relayed, oldest first."""

    # -- the engine lease and the inbox ---------------------------------------------

    @abstractmethod
    async def acquire_lease(
        self, lease: Lease, *, now: float, take_from: str | None = None
    ) -> Lease:
        """Take ``lease.name`` for ``lease.owner`` when it is free, expired (``expires_at`` at
        or before ``now``), already this owner's, or held by owner ``take_from`` (a holder
        known to be dead); return the holder afterwards (``lease`` itself when taken)."""

    async def renew_lease(self, name: str, owner: str, expires_at: float) -> bool:
        """Move the lease's expiry on; False when ``owner`` no longer holds it."""
        return name in await self.renew_leases([name], owner, expires_at)

    @abstractmethod
    async def renew_leases(self, names: Collection[str], owner: str, expires_at: float) -> set[str]:
        """Move the expiry of every lease named that ``owner`` holds on, in one statement
        where the store can (a cluster server's membership and partitions, every
        heartbeat); the names renewed (the others ``owner`` no longer holds)."""

    @abstractmethod
    async def release_lease(self, name: str, owner: str) -> None:
        """Give the lease up (nothing happens when ``owner`` does not hold it)."""

    @abstractmethod
    async def lease_holder(self, name: str) -> Lease | None:
        """The lease row as stored (it may have expired), or None."""

    @abstractmethod
    async def list_leases(self, prefix: str) -> list[Lease]:
        """The lease rows whose name starts with ``prefix``, as stored (expired ones too),
        sorted by name: a cluster's members (``server:…``) and partitions (``partition:…``)."""

    @abstractmethod
    async def add_to_inbox(self, events: Sequence[Event]) -> Lease | None:
        """Record events for the engine (an event id already there is kept as it is) and
        return the engine lease as read in the same transaction, so the caller can notify
        its holder; a backend with a channel of its own (PostgreSQL NOTIFY) notifies here."""

    @abstractmethod
    async def inbox(self, limit: int = 1000) -> list[Event]:
        """Events in the inbox, oldest first."""

    @abstractmethod
    async def remove_from_inbox(self, event_ids: Sequence[str]) -> None:
        """Forget inbox events once applied."""

    async def listen_inbox(self, listener: InboxListener) -> str | None:
        """Call ``listener`` whenever another process adds to the inbox, through the
        backend's own channel; return that channel's address for the lease row, or None
        when the backend has none (the runtime then listens on a socket of its own).
        Closing the store stops listening."""
        return None

    # -- API tokens (their secrets' hashes only: model/tokens.py) ---------------------

    @abstractmethod
    async def create_token(self, token: ApiToken) -> None:
        """Store a new token; StoreError when its id is taken (ids are random: never
        in practice), and the row there is left as it is."""

    @abstractmethod
    async def get_token(self, token_id: str) -> ApiToken | None:
        """The token with this id, revoked or not; None when there is none."""

    @abstractmethod
    async def list_tokens(self) -> list[ApiToken]:
        """Every token, revoked ones too, oldest first (then by id)."""

    @abstractmethod
    async def record_token_use(self, token_id: str, at: float) -> None:
        """Set the token's ``last_used_at`` to ``at`` unless it is already later (nothing
        happens for an unknown id)."""

    @abstractmethod
    async def revoke_token(self, token_id: str, at: float) -> bool:
        """Mark the token revoked at ``at``: True when it was live, False when there is no
        such token or it was revoked already (its ``revoked_at`` is kept)."""

    # -- the event gateway's record (runtime/intake.py, docs/events.md) ---------------

    @abstractmethod
    async def keep_event(
        self, event: GatewayEvent, wait_rows: Sequence[str] = ()
    ) -> GatewayEvent | None:
        """Record what became of an event, found later under ``wait_rows`` while it is
        buffered: None when it was recorded, the row already there (left as it is) when its
        key was recorded before (a redelivery)."""

    @abstractmethod
    async def gateway_event(self, key: str) -> GatewayEvent | None:
        """The event recorded under ``key``; None when there is none."""

    @abstractmethod
    async def settle_event(self, event: GatewayEvent, was: str) -> bool:
        """Set the recorded event's status, ``delivered_to``, ``started`` and ``reason`` to
        ``event``'s, if its status is still ``was``: whether it was."""

    @abstractmethod
    async def buffered_events(self, wait_row: str, now: float) -> list[GatewayEvent]:
        """Events buffered under ``wait_row`` whose buffer has not ended at ``now``, oldest
        first."""

    @abstractmethod
    async def buffered_for_waits(
        self, now: float, limit: int = 1000
    ) -> list[tuple[str, str, GatewayEvent]]:
        """(run id, wait row, event) for the events buffered at ``now`` under a wait row
        some run waits under now (what a run whose wait started was not handed: a
        repair), oldest first."""

    @abstractmethod
    async def count_buffered(self, now: float, wait_row: str | None = None) -> int:
        """How many events are buffered at ``now`` (under ``wait_row`` only, when given)."""

    @abstractmethod
    async def unmatched_events(
        self, now: float, *, limit: int = 100, after: str | None = None
    ) -> list[GatewayEvent]:
        """The dead letter: events no run took and no trigger started (status
        ``unmatched``, or buffered past their buffer at ``now``), by key, after ``after``."""

    @abstractmethod
    async def prune_events(self, before: float) -> int:
        """Forget the events whose ``buffer_until`` is before ``before``: how many."""

    @abstractmethod
    async def prune(
        self, older_than: float, *, batch_size: int = 500, archive: Archive | None = None
    ) -> int:
        """Remove runs that ended before ``older_than`` (epoch seconds), in batches of
        ``batch_size`` runs per transaction, handing each to ``archive`` first.
        Returns how many runs were removed."""
