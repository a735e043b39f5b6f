"""Why a run is not moving: `tideflow runs why RUN_ID`, ``GET /runs/{id}/why``.

A run that has not ended waits for something. ``diagnose`` reads what it can see and
names it, step by step, with the time it has waited since or is due at:

- ``waiting_for_signal``: a `wait` for signal X since T, with its ``match`` (and the
  signals of that name the run keeps that the match does not take);
- ``timer``: a `sleep`, a retry's backoff or a loop's delay is due at T;
  ``timer_overdue`` when T has passed by more than ``OVERDUE`` seconds with nobody firing
  it;
- ``queued``: an attempt dispatched to queue Q and not started by a worker;
  ``no_consumer`` when the bus sees no live reader of Q;
- ``on_worker``: an attempt a worker W started at T (with its timeout, when it has one,
  and W's last heartbeat); ``worker_gone`` when W's heartbeat stopped at T (its task
  reader is no longer live: ``Bus.worker_beats``), or, with no heartbeat of W on record,
  when nobody reads Q any more: W has stopped, its lease lapses and the task is
  delivered again;
- ``child_run``: a `subflow` waits for child run X (and its status);
- ``join``: steps that wait for their join on steps that are still in progress;
- ``relay_backlog``: effects of committed changes (tasks, timers, child starts) that
  wait to be relayed;
- ``no_engine``: no live engine holds the store (embedded), or no live server holds the
  run's event partition (cluster): nothing applies its events or fires its timers;
- ``ended`` / ``not_started``: the run has ended, or is stored and not started.

It reads the run's state and history, the plan, the store's leases and outbox and, when
the client has a bus, the bus's queue statistics and workers' heartbeats; it changes
nothing.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from tideflow.bus.base import QueueStats, WorkerBeat, partition_of
from tideflow.errors import NotFound
from tideflow.model.plan import Plan, StepSpec
from tideflow.model.run import RunState, StepState
from tideflow.model.states import RunStatus, StepStatus
from tideflow.store.base import ENGINE_LEASE, HistoryEntry, OutboxItem, Store

if TYPE_CHECKING:
    from tideflow.client import Client
    from tideflow.runtime.admission import AdmissionLevels

__all__ = ["OVERDUE", "STUCK", "Diagnosis", "Reason", "WhyKind", "diagnose"]

OVERDUE = 5.0
"""Seconds past its time after which an armed timer that has not fired is reported."""
SHOWN = 20
"""Step reasons of one kind (and blocked joins) named one by one; the rest are counted in
one more reason (a 10,000-step run has as many)."""

_TIMER_WAITS = {"sleep": "sleep", "retry": "retry backoff", "loop_delay": "loop delay"}
_TIMER_WAITS |= {"compensation_retry": "compensation retry backoff"}


class WhyKind(StrEnum):
    ENDED = "ended"
    NOT_STARTED = "not_started"
    NO_ENGINE = "no_engine"
    WAITING_FOR_SIGNAL = "waiting_for_signal"
    TIMER = "timer"
    TIMER_OVERDUE = "timer_overdue"
    QUEUED = "queued"
    NO_CONSUMER = "no_consumer"
    ON_WORKER = "on_worker"
    WORKER_GONE = "worker_gone"
    CHILD_RUN = "child_run"
    JOIN = "join"
    RELAY_BACKLOG = "relay_backlog"


STUCK = frozenset(
    {WhyKind.NO_ENGINE, WhyKind.NO_CONSUMER, WhyKind.WORKER_GONE, WhyKind.TIMER_OVERDUE}
)
"""Reasons that need someone to act: the run does not move on by itself."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Reason:
    kind: WhyKind
    text: str
    """One sentence for a person, with what to do where there is something to do."""
    step: str | None = None
    """The step instance's key, when the reason is a step's."""
    since: float | None = None
    at: float | None = None
    """When it is due (a timer, a timeout)."""
    data: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "text": self.text,
            "step": self.step,
            "since": self.since,
            "at": self.at,
            "data": dict(self.data),
        }

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> Reason:
        return cls(
            kind=WhyKind(data["kind"]),
            text=data["text"],
            step=data.get("step"),
            since=data.get("since"),
            at=data.get("at"),
            data=dict(data.get("data") or {}),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Diagnosis:
    run_id: str
    status: str
    checked_at: float
    reasons: tuple[Reason, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "status": self.status,
            "checked_at": self.checked_at,
            "reasons": [r.to_dict() for r in self.reasons],
        }

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> Diagnosis:
        return cls(
            run_id=data["run_id"],
            status=data["status"],
            checked_at=data["checked_at"],
            reasons=tuple(Reason.of(r) for r in data["reasons"]),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class _Seen:
    """What ``diagnose`` read, for ``reasons_of`` (pure: it reads no clock and no I/O)."""

    state: RunState
    plan: Plan
    history: Sequence[HistoryEntry]
    now: float
    queues: Sequence[QueueStats] | None
    beats: Sequence[WorkerBeat] | None
    """The bus's workers' heartbeats (None: no bus here, or it could not say)."""
    engine: Reason | None
    outbox: Sequence[OutboxItem]
    relaying: Sequence[tuple[str, int]]
    """The run's effects the engine (in this process) tries again: (what, tries)."""
    children: Mapping[str, str]
    """Child run id -> its status (``missing`` when it is not stored)."""
    queue: tuple[int, AdmissionLevels | None] | None = None
    """A pending run: how many runs are ahead of it in the admission queue, and the
    admission of the engine in this process (None: elsewhere)."""


async def diagnose(client: Client, run_id: str, *, now: float | None = None) -> Diagnosis:
    """Why the run ``run_id`` is where it is (``NotFound`` for an unknown run)."""
    state = await client.state(run_id)
    plan = await client.plan(run_id)
    at = time.time() if now is None else now
    seen = _Seen(
        state=state,
        plan=plan,
        history=await client.store.history(run_id),
        now=at,
        queues=await _queues(client),
        beats=None if state.is_terminal else await _beats(client),
        engine=None if state.is_terminal else await _engine(client, run_id),
        outbox=[] if state.is_terminal else await _outbox(client.store, run_id),
        relaying=client.relaying(run_id),
        children=await _children(client.store, state),
        queue=await _queue(client, state),
    )
    return Diagnosis(
        run_id=run_id, status=state.status.value, checked_at=at, reasons=tuple(reasons_of(seen))
    )


def reasons_of(seen: _Seen) -> list[Reason]:
    state = seen.state
    if state.is_terminal:
        return [_ended(state)]
    reasons = [seen.engine] if seen.engine is not None else []
    if state.status is RunStatus.PENDING:
        reasons.append(_not_started(state, seen.queue))
    steps: list[Reason] = []
    for key, step in state.steps.items():
        spec = seen.plan.specs.get(step.step_id)
        if spec is not None:
            steps.extend(_step_reasons(seen, key, step, spec))
    reasons.extend(_bounded(steps))
    reasons.extend(_joins(seen))
    if seen.outbox or seen.relaying:
        reasons.append(_backlog(seen))
    return reasons


def _not_started(state: RunState, queue: tuple[int, AdmissionLevels | None] | None) -> Reason:
    """A pending run: stored, waiting for its engine to admit it (runtime/admission.py)."""
    if queue is None:
        return Reason(
            kind=WhyKind.NOT_STARTED,
            text="the run is stored and not started yet: an engine starts it when it admits it",
            since=state.created_at,
        )
    ahead, engine = queue
    data: dict[str, Any] = {"ahead": ahead, "priority": state.priority.value}
    text = f"pending: {ahead:,} run(s) ahead of it"
    if engine is not None:
        data |= {
            "active": engine.active,
            "bound": engine.bound,
            "tasks": engine.tasks,
            "task_bound": engine.task_bound,
            "claimed": engine.claimed,
        }
        text += f" (admission bound {engine.bound:,}, {engine.active:,} active"
        if engine.active < engine.bound and engine.claimed:
            text += (
                f"; the active runs claim {engine.claimed:,} of the {engine.task_bound:,} "
                "attempts in flight allowed: a run is admitted when its own claim fits"
            )
        text += ")"
    return Reason(
        kind=WhyKind.NOT_STARTED,
        text=text + f"; runs are admitted by priority ({state.priority.value} here), then "
        "oldest first, as active runs end",
        since=state.created_at,
        data=data,
    )


async def _queue(client: Client, state: RunState) -> tuple[int, AdmissionLevels | None] | None:
    if state.status is not RunStatus.PENDING:
        return None
    return await client.store.count_pending(state.run_id), client.admission()


def _backlog(seen: _Seen) -> Reason:
    kinds = sorted({type(item.command).__name__ for item in seen.outbox})
    parts = []
    if seen.outbox:
        parts.append(f"{len(seen.outbox)} effect(s) in the outbox ({', '.join(kinds)})")
    parts += [f"{what} (failed {tries} time(s))" for what, tries in seen.relaying]
    return Reason(
        kind=WhyKind.RELAY_BACKLOG,
        text="effects of committed changes wait to be relayed: "
        + "; ".join(parts)
        + "; the engine tries them again with a backoff while the bus or store fails",
        data={
            "outbox": len(seen.outbox),
            "commands": kinds,
            "retrying": [{"what": what, "tries": tries} for what, tries in seen.relaying],
        },
    )


def _bounded(reasons: list[Reason]) -> list[Reason]:
    """At most ``SHOWN`` step reasons of each kind (a map of 10,000 items in flight has as
    many), the rest counted in one reason of that kind."""
    shown: list[Reason] = []
    named: Counter[WhyKind] = Counter()
    more: Counter[WhyKind] = Counter()
    for reason in reasons:
        if named[reason.kind] < SHOWN:
            named[reason.kind] += 1
            shown.append(reason)
        else:
            more[reason.kind] += 1
    for kind, count in more.items():
        shown.append(
            Reason(
                kind=kind,
                text=f"and {count} more step(s) like that ({kind.value.replace('_', ' ')})",
                data={"more": count},
            )
        )
    return shown


def _ended(state: RunState) -> Reason:
    when = f" at {_iso(state.finished_at)}" if state.finished_at else ""
    error = f": {state.error.message}" if state.error is not None else ""
    return Reason(
        kind=WhyKind.ENDED,
        text=f"the run has ended: {state.status.value}{when}{error}",
        at=state.finished_at,
    )


def _step_reasons(seen: _Seen, key: str, step: StepState, spec: StepSpec) -> list[Reason]:
    if step.status is StepStatus.WAITING and spec.wait is not None:
        return [_waiting(seen, key, step, spec)]
    if step.status in (StepStatus.WAITING, StepStatus.RETRYING) or (
        step.status is StepStatus.RUNNING and spec.type == "loop"
    ):
        return _timers(seen, key, step)
    if step.status is not StepStatus.RUNNING:
        return []
    if spec.subflow is not None and step.child_run_id is not None:
        child = seen.children.get(step.child_run_id, "missing")
        return [
            Reason(
                kind=WhyKind.CHILD_RUN,
                step=key,
                text=f"step {key} waits for its child run {step.child_run_id} ({child})",
                since=step.started_at,
                data={"child_run_id": step.child_run_id, "child_status": child},
            )
        ]
    if spec.is_action:
        return [_attempt(seen, key, step, spec)]
    return []


def _waiting(seen: _Seen, key: str, step: StepState, spec: StepSpec) -> Reason:
    assert spec.wait is not None
    signal = spec.wait.signal
    match = spec.wait.match.source if spec.wait.match is not None else None
    kept = [s for s in seen.state.signals if s.name == signal]
    text = f"step {key} waits for signal {signal!r}"
    if match is not None:
        text += f" where {match}"
    text += f" since {_iso(step.started_at)}"
    fires = _fire_at(seen.state, step, "wait_timeout")
    if fires is not None:
        text += f"; it times out at {_iso(fires)}"
    if kept:
        text += f"; {len(kept)} signal(s) {signal!r} the run keeps do not match"
    return Reason(
        kind=WhyKind.WAITING_FOR_SIGNAL,
        step=key,
        text=text,
        since=step.started_at,
        at=fires,
        data={
            "signal": signal,
            "match": match,
            "kept_unmatched": len(kept),
            "timeout_action": spec.wait.timeout_action if fires is not None else None,
        },
    )


def _timers(seen: _Seen, key: str, step: StepState) -> list[Reason]:
    reasons = []
    for timer_id in step.timers:
        ref = seen.state.timers.get(timer_id)
        if ref is None or ref.kind not in _TIMER_WAITS:
            continue
        what = _TIMER_WAITS[ref.kind]
        late = seen.now - ref.fire_at
        if late > OVERDUE:
            reasons.append(
                Reason(
                    kind=WhyKind.TIMER_OVERDUE,
                    step=key,
                    text=f"step {key}: its {what} was due at {_iso(ref.fire_at)}, "
                    f"{late:.0f} s ago, and has not fired: is an engine live on the store?",
                    at=ref.fire_at,
                    data={"timer": ref.kind},
                )
            )
        else:
            reasons.append(
                Reason(
                    kind=WhyKind.TIMER,
                    step=key,
                    text=f"step {key}: its {what} is due at {_iso(ref.fire_at)}",
                    at=ref.fire_at,
                    data={"timer": ref.kind},
                )
            )
    return reasons


def _attempt(seen: _Seen, key: str, step: StepState, spec: StepSpec) -> Reason:
    queue = [q for q in seen.queues or () if q.queue == spec.queue]
    readers = max((q.consumers for q in queue), default=0)
    data: dict[str, Any] = {"queue": spec.queue, "priority": spec.priority.value}
    data["attempt"] = step.attempts
    if seen.queues is not None:
        data |= {"consumers": readers, "depth": sum(q.depth for q in queue)}
    if step.attempt_started_at is None:
        text = f"step {key}: attempt {step.attempts} is on queue {spec.queue!r}"
        text += f" ({spec.priority.value}), not started by a worker"
        if seen.queues is not None and not readers:
            text += f"; no live worker reads {spec.queue!r}: start `tideflow worker --queues "
            text += f"{spec.queue}`"
            return Reason(kind=WhyKind.NO_CONSUMER, step=key, text=text, data=data)
        return Reason(kind=WhyKind.QUEUED, step=key, text=text, since=step.started_at, data=data)
    worker = _worker(seen.history, key, step.attempts)
    data["worker"] = worker
    started = step.attempt_started_at
    timeout = _fire_at(seen.state, step, "attempt_timeout")
    text = f"step {key}: attempt {step.attempts} runs on worker {worker or '?'}"
    text += f" since {_iso(started)}"
    if timeout is not None:
        text += f"; it times out at {_iso(timeout)}"
    beat = _beat(seen.beats, worker)
    if beat is not None:
        data["last_beat"] = beat.last_beat
        if not beat.live:
            text += f"; its heartbeat stopped at {_iso(beat.last_beat)}: that worker has "
            text += "stopped, and the task is delivered again when its lease lapses"
            return Reason(kind=WhyKind.WORKER_GONE, step=key, text=text, since=started, data=data)
        text += f"; its last heartbeat was at {_iso(beat.last_beat)}"
    elif seen.queues is not None and not readers:
        text += f"; but no live worker reads {spec.queue!r} any more: that worker has "
        text += "stopped (no heartbeat of it is on record), and the task is delivered again "
        text += "when its lease lapses"
        return Reason(kind=WhyKind.WORKER_GONE, step=key, text=text, since=started, data=data)
    return Reason(kind=WhyKind.ON_WORKER, step=key, text=text, since=started, at=timeout, data=data)


def _beat(beats: Sequence[WorkerBeat] | None, worker: str | None) -> WorkerBeat | None:
    """The worker's heartbeat: a live reader of it if it has one, else the last beat of
    those that stopped; None when none is on record (an older worker, or one trimmed)."""
    mine = [b for b in beats or () if worker and b.worker == worker]
    live = [b for b in mine if b.live]
    return max(live or mine, key=lambda b: b.last_beat, default=None)


def _joins(seen: _Seen) -> list[Reason]:
    """Pending steps whose join waits on steps in progress: the front of what is blocked
    (a step that waits only on steps that are themselves pending is left out: its wait
    follows from theirs)."""
    state = seen.state
    blocked: list[Reason] = []
    count = 0
    for key, step in state.steps.items():
        if step.status is not StepStatus.PENDING:
            continue
        spec = seen.plan.specs.get(step.step_id)
        if spec is None or not spec.depends_on:
            continue
        open_deps = [
            d
            for d in (step.scope + dep for dep in spec.depends_on)
            if (dep_state := state.steps.get(d)) is None or not _done(dep_state)
        ]
        if not open_deps or all(_status(state, d) in _NOT_BEGUN for d in open_deps):
            continue
        count += 1
        if len(blocked) < SHOWN:
            statuses = {d: _status(state, d) for d in open_deps}
            shown = ", ".join(f"{d} ({s})" for d, s in statuses.items())
            blocked.append(
                Reason(
                    kind=WhyKind.JOIN,
                    step=key,
                    text=f"step {key} waits for its join ({spec.join.kind}) on {shown}",
                    data={"join": spec.join.kind, "waiting_on": statuses},
                )
            )
    if count > len(blocked):
        blocked.append(
            Reason(
                kind=WhyKind.JOIN,
                text=f"and {count - len(blocked)} more step(s) wait for their joins",
                data={"more": count - len(blocked)},
            )
        )
    return blocked


_NOT_BEGUN = frozenset({"not started", StepStatus.PENDING.value, StepStatus.READY.value})


def _done(step: StepState) -> bool:
    return step.status in (
        StepStatus.SUCCEEDED,
        StepStatus.FAILED,
        StepStatus.SKIPPED,
        StepStatus.CANCELLED,
    )


def _status(state: RunState, key: str) -> str:
    found = state.steps.get(key)
    return "not started" if found is None else found.status.value


def _worker(history: Sequence[HistoryEntry], key: str, attempt: int) -> str | None:
    for entry in reversed(history):
        event = entry.event
        if (
            entry.kind == "task_started"
            and event.get("step_key") == key
            and event.get("attempt") == attempt
        ):
            return str(event.get("worker") or "") or None
    return None


def _fire_at(state: RunState, step: StepState, kind: str) -> float | None:
    for timer_id in step.timers:
        ref = state.timers.get(timer_id)
        if ref is not None and ref.kind == kind:
            return ref.fire_at
    return None


async def _queues(client: Client) -> list[QueueStats] | None:
    try:
        return await client.queues()
    except Exception:  # no bus here, or the bus is down: the reasons say less
        return None


async def _beats(client: Client) -> list[WorkerBeat] | None:
    try:
        return await client.worker_beats()
    except Exception:  # no bus here, or the bus is down: the reasons say less
        return None


async def _engine(client: Client, run_id: str) -> Reason | None:
    """A ``no_engine`` reason when nobody applies the run's events now, else None. Leases
    are kept in wall-clock time (runtime/lease.py), whatever the client's clock."""
    from tideflow.runtime.lease import ENGINE, is_live
    from tideflow.runtime.partitions import PARTITION, PARTITION_COUNT

    store, now = client.store, time.time()
    count = await store.lease_holder(PARTITION_COUNT)
    if count is not None:
        partition = partition_of(run_id, int(count.owner))
        holder = await store.lease_holder(f"{PARTITION}{partition}")
        if holder is not None and is_live(holder, now):
            return None
        return Reason(
            kind=WhyKind.NO_ENGINE,
            text=f"no live server holds event partition {partition} of this run: nothing "
            "applies its events or fires its timers; start `tideflow server` on this store",
            since=holder.expires_at if holder is not None else None,
            data={"partition": partition},
        )
    if client.engine_here:
        return None
    holder = await store.lease_holder(ENGINE_LEASE)
    if holder is not None and holder.kind == ENGINE and is_live(holder, now):
        return None
    return Reason(
        kind=WhyKind.NO_ENGINE,
        text="no live engine holds the store: nothing applies the run's events or fires "
        "its timers; `tideflow resume` (or a `tideflow server`) on this store carries it on",
        since=holder.expires_at if holder is not None else None,
    )


async def _outbox(store: Store, run_id: str) -> list[OutboxItem]:
    return [item for item in await store.pending_outbox(limit=10_000) if item.run_id == run_id]


async def _children(store: Store, state: RunState) -> dict[str, str]:
    found: dict[str, str] = {}
    for step in state.steps.values():
        if step.child_run_id is not None and step.status is StepStatus.RUNNING:
            try:
                found[step.child_run_id] = (await store.get_run(step.child_run_id)).status
            except NotFound:
                found[step.child_run_id] = "missing"
    return found


def _iso(timestamp: float | None) -> str:
    if timestamp is None:
        return "?"
    text = datetime.fromtimestamp(timestamp, UTC).isoformat(timespec="seconds")
    return text.replace("+00:00", "Z")
