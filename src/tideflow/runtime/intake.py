"""What the event gateway does with an event: nothing answered 2xx is lost (docs/events.md).

Every event the gateway answers is recorded in the store (``Store.keep_event``), keyed by
its (``source``, ``id``), with what became of it:

- ``delivered``: handed to the runs it names or whose `wait` takes it now, or starting
  runs by a trigger;
- ``buffered``: routed by content, no run waits for it yet, and some registered `wait` on
  its type keeps early events (its ``buffer``): it is kept until its buffer ends, under
  the wait rows a run's wait would be found by (its type, and ``type · path · value`` for
  each path a wait on it correlates by). A run whose wait starts looks them up
  (``hand_buffered``, from the relay after the commit) and takes them;
- ``unmatched``: the dead letter: no run took it and no trigger started, now or before its
  buffer ended. It is listed (``Store.unmatched_events``) and can be replayed
  (``Intake.replay``), until the retention prunes it.

A redelivery finds the record and is answered ``duplicate``, whatever happened to the
first delivery; two deliveries at the same moment both hand the event over (each run
applies its signal id once) and the one that records second is answered ``duplicate``.

An event is buffered first and looked for a second time after (a run that reached its
wait in between looked the buffer up before the event was in it); a run's wait is
recorded before it looks the buffer up: so whichever comes second sees the other.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

from tideflow.errors import NotFound, UnknownSignal
from tideflow.model.events import SignalReceived, Transition
from tideflow.model.run import RunState
from tideflow.model.states import StepStatus
from tideflow.runtime.correlate import Correlator
from tideflow.store.base import GatewayEvent, Store

if TYPE_CHECKING:
    from tideflow.bus.base import Bus
    from tideflow.client import Client

__all__ = [
    "DEFAULT_RETENTION",
    "MAX_BUFFERED",
    "MAX_BUFFERED_PER_RUN",
    "Inbound",
    "Intake",
    "Outcome",
    "hand_buffered",
    "hand_waiting",
    "waits_started",
]

log = logging.getLogger("tideflow.intake")

DEFAULT_RETENTION = 7 * 24 * 3600.0
"""Seconds an event's record is kept after its buffer ended (or it was answered): the
dead letter's retention, and how long a redelivery is answered ``duplicate``."""
MAX_BUFFERED = 100_000
"""Events buffered at once in all; past it an early event is unmatched (dead letter)."""
MAX_BUFFERED_PER_RUN = 100
"""Events buffered at once for one run (under one correlation key: ``order_id`` o-42)."""

Status = Literal["delivered", "buffered", "duplicate", "unmatched"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Inbound:
    """An event as the gateway hands it over."""

    key: str
    source: str
    id: str
    type: str
    payload: Any
    run_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    """What became of one event (the gateway's answer)."""

    status: Status
    delivered_to: list[str]
    started: list[str]
    reason: str | None = None


class Intake:
    """Takes events for the gateway: delivers, buffers, or dead-letters each, once."""

    def __init__(
        self,
        client: Client,
        *,
        now: Callable[[], float],
        max_buffered: int = MAX_BUFFERED,
        max_per_run: int = MAX_BUFFERED_PER_RUN,
    ) -> None:
        self._client = client
        self._store: Store = client.store
        self._correlator = Correlator(client.store)
        self._now = now
        self._max_buffered = max_buffered
        self._max_per_run = max_per_run

    async def take(self, event: Inbound) -> Outcome:
        """Deliver, buffer or dead-letter the event, and record which; ``duplicate`` when
        it was recorded before."""
        known = await self._store.gateway_event(event.key)
        if known is not None:
            return _duplicate(known)
        record, rows = await self._route(event)
        prior = await self._store.keep_event(record, rows)
        if prior is not None:
            return _duplicate(prior)
        if record.status == "buffered":  # a run may have reached its wait meanwhile
            record = await self._offer(record)
        return _outcome(record)

    async def replay(self, key: str) -> Outcome:
        """Deliver an event of the dead letter again, as if it arrived now (it is not
        buffered again): ``delivered`` (or ``buffered`` by the run it names, which keeps
        it for its wait), leaving the dead letter; or ``unmatched``, left in it.
        ``NotFound`` for a key that is not in it."""
        kept = await self._store.gateway_event(key)
        if kept is None or not kept.unmatched(self._now()):
            raise NotFound(f"there is no unmatched event {key!r} (GET /events/unmatched)")
        inbound = Inbound(
            key=kept.key,
            source=kept.source,
            id=kept.id,
            type=kept.type,
            payload=kept.payload,
            run_id=kept.run_id,
        )
        routed, _ = await self._route(inbound, buffer=False)
        if routed.status == "delivered":
            await self._store.settle_event(routed, kept.status)
        return _outcome(routed)

    async def _route(
        self, event: Inbound, *, buffer: bool = True
    ) -> tuple[GatewayEvent, list[str]]:
        now = self._now()
        record = GatewayEvent(
            key=event.key,
            source=event.source,
            id=event.id,
            type=event.type,
            run_id=event.run_id,
            payload=event.payload,
            status="unmatched",
            received_at=now,
            buffer_until=now,
        )
        if event.run_id is not None:
            return await self._to_run(record, event.run_id), []
        client = self._client
        run_ids = await client.deliver_event(event.type, event.payload, event_id=event.key)
        started = [t.run_id for t in await client.trigger(event.payload, key=event.key) if t.run_id]
        if run_ids or started:
            found = replace(
                record, status="delivered", delivered_to=tuple(run_ids), started=tuple(started)
            )
            return found, []
        seconds = await self._correlator.buffer(event.type) if buffer else 0.0
        if seconds <= 0:
            why = "and no registered wait on it keeps early events (buffer)" if buffer else ""
            return replace(record, reason=_no_run(event.type, why)), []
        rows = await self._correlator.rows(event.type, event.payload)
        full = await self._full(rows, now)
        if full is not None:
            return replace(record, reason=full), []
        return replace(record, status="buffered", buffer_until=now + seconds), rows

    async def _full(self, rows: list[str], now: float) -> str | None:
        """Why the buffer takes no more events for these rows, or None."""
        if await self._store.count_buffered(now) >= self._max_buffered:
            return f"no run waits for it, and the buffer holds {self._max_buffered} events"
        for row in rows[1:]:  # the correlated rows: one run's events
            if await self._store.count_buffered(now, row) >= self._max_per_run:
                return (
                    f"no run waits for it, and {self._max_per_run} events for the run it "
                    "is for are buffered already"
                )
        return None

    async def _to_run(self, record: GatewayEvent, run_id: str) -> GatewayEvent:
        """Signal the run the event names; a run that does not exist, has ended or waits
        for no such signal: unmatched, and nothing changes in a run."""
        client = self._client
        try:
            state = await client.state(run_id)
        except NotFound:
            return replace(record, reason=f"there is no run {run_id}")
        if state.is_terminal:
            return replace(record, reason=f"run {run_id} has ended ({state.status.value})")
        try:
            await client.signal(run_id, record.type, record.payload, signal_id=record.key)
        except UnknownSignal as exc:
            return replace(record, reason=exc.message)
        early = None
        if record.type not in state.waiting:  # the run keeps it (answered `buffered`)
            early = f"run {run_id} is not at a wait for it yet: it keeps it for one (buffer)"
        return replace(record, status="delivered", delivered_to=(run_id,), reason=early)

    async def _offer(self, record: GatewayEvent) -> GatewayEvent:
        """Look for a waiting run once more, after the event was buffered (the race in
        the module docstring): found, it is delivered and leaves the buffer."""
        run_ids = await self._client.deliver_event(record.type, record.payload, event_id=record.key)
        if not run_ids:
            return record
        taken = replace(record, status="delivered", delivered_to=tuple(run_ids))
        await self._store.settle_event(taken, "buffered")
        return taken


def _no_run(name: str, why: str) -> str:
    return f"no run waits for signal {name!r} with a match that holds, no active definition has a trigger on it that matches{', ' + why if why else ''}"


def _outcome(record: GatewayEvent) -> Outcome:
    """The answer: a record's status, but ``buffered`` for an event its run keeps for a
    wait it has not reached (delivered to it, with that reason)."""
    status: Status = "unmatched"
    if record.status == "buffered" or (
        record.status == "delivered" and record.run_id is not None and record.reason
    ):
        status = "buffered"
    elif record.status == "delivered":
        status = "delivered"
    return Outcome(
        status=status,
        delivered_to=list(record.delivered_to),
        started=list(record.started),
        reason=record.reason,
    )


def _duplicate(known: GatewayEvent) -> Outcome:
    return Outcome(
        status="duplicate",
        delivered_to=list(known.delivered_to),
        started=list(known.started),
        reason=f"this (source, id) was {known.status} already",
    )


# -- a run's wait starts: it takes what was buffered for it -----------------------


def waits_started(state: RunState, transitions: Sequence[Transition]) -> list[str]:
    """The wait rows of the run's `wait` steps that started in these transitions: a
    correlated wait's row, else its signal name."""
    started = {t.subject for t in transitions if t.new == StepStatus.WAITING and t.old != t.new}
    if not started:
        return []
    rows: list[str] = []
    for name, keys in state.waiting.items():
        for key in keys:
            if key in started:
                rows.append(state.correlated.get(key, name))
    return list(dict.fromkeys(rows))


async def hand_buffered(
    store: Store, bus: Bus, run_id: str, wait_rows: Sequence[str], now: float
) -> None:
    """Send the run the events buffered under its waits' rows, then record them taken
    (a failure before that sends them again: the run applies each once)."""
    found: list[tuple[str, GatewayEvent]] = []
    for row in wait_rows:
        found += [(row, kept) for kept in await store.buffered_events(row, now)]
    await _hand(store, bus, run_id, found, now)


async def hand_waiting(
    store: Store, bus: Bus, now: float, owns: Callable[[str], bool] = lambda run_id: True
) -> int:
    """The repair at an engine's start: the events buffered for runs that wait for them
    now and were not handed them (a server stopped between a commit and its relay, a
    wait reached by a command with no engine), sent to those runs ``owns`` accepts. How
    many were sent."""
    by_run: dict[str, list[tuple[str, GatewayEvent]]] = {}
    for run_id, row, kept in await store.buffered_for_waits(now):
        if owns(run_id):
            by_run.setdefault(run_id, []).append((row, kept))
    for run_id, found in by_run.items():
        await _hand(store, bus, run_id, found, now)
    return sum(len(found) for found in by_run.values())


async def _hand(
    store: Store, bus: Bus, run_id: str, found: Sequence[tuple[str, GatewayEvent]], now: float
) -> None:
    """Send each event once, then record it handed to the run. One found under a
    correlation row (the run's key is the event's: it is for this run) is taken: it leaves
    the buffer. One found under its type only (a wait whose `match` is not indexed) stays
    buffered for the other runs that reach such a wait, as an event that finds them
    waiting goes to each: this run's `match` may not hold, and the gateway cannot tell.
    Handed to a run, it is not unmatched when its buffer ends (``GatewayEvent.unmatched``)."""
    events: dict[str, GatewayEvent] = {}
    taken: dict[str, bool] = {}
    for row, kept in found:
        events.setdefault(kept.key, kept)
        taken[kept.key] = taken.get(kept.key, False) or row != kept.type
    if not events:
        return
    await bus.publish_events(
        [
            SignalReceived(
                event_id=f"{kept.key}>{run_id}",  # as Client.deliver_event: applied once
                run_id=run_id,
                time=now,
                name=kept.type,
                payload=kept.payload,
                buffer=False,
            )
            for kept in events.values()
        ]
    )
    for key, kept in events.items():
        handed = (*dict.fromkeys((*kept.delivered_to, run_id)),)
        status = "delivered" if taken[key] else "buffered"
        await store.settle_event(replace(kept, status=status, delivered_to=handed), "buffered")
    log.info("run %s was handed %d buffered event(s) at its wait", run_id, len(events))
