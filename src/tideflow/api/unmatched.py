"""The event gateway's dead letter (docs/events.md, Unmatched events): ``GET
/events/unmatched`` lists the events no run took and no trigger started (viewer), ``POST
/events/unmatched/{key}/replay`` delivers one again, as if it arrived now (operator:
action ``signal``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import FastAPI, Query
from pydantic import BaseModel, Field

from tideflow.api.auth_http import allow
from tideflow.client import Client
from tideflow.model.tokens import Action
from tideflow.runtime.intake import Intake
from tideflow.store.base import GatewayEvent

__all__ = ["UnmatchedEvent", "UnmatchedList", "unmatched_routes"]

READ, REPLAY = allow(Action.READ), allow(Action.SIGNAL)


class UnmatchedEvent(BaseModel):
    key: str = Field(description="What identifies it: derived from (source, id).")
    id: str
    source: str
    type: str
    run_id: str | None = Field(description="The run its tideflowrunid named, if any.")
    received_at: float = Field(description="When it arrived (epoch seconds).")
    buffered_until: float = Field(description="When its buffer ended (epoch seconds).")
    reason: str | None = Field(description="Why no run took it.")
    payload: Any = Field(description="What a run would receive: attributes and data.")


class UnmatchedList(BaseModel):
    events: list[UnmatchedEvent]
    next: str | None = Field(description="The `after` of the next page; null on the last.")


class ReplayOutcome(BaseModel):
    key: str
    status: str = Field(
        description="delivered; buffered (handed to the run it names, which keeps it for "
        "its wait); or unmatched (left in the dead letter)."
    )
    delivered_to: list[str]
    started: list[str]
    reason: str | None


def view(event: GatewayEvent) -> UnmatchedEvent:
    reason = event.reason
    if event.status == "buffered":
        reason = "no run took it while it was buffered"
    return UnmatchedEvent(
        key=event.key,
        id=event.id,
        source=event.source,
        type=event.type,
        run_id=event.run_id,
        received_at=event.received_at,
        buffered_until=event.buffer_until,
        reason=reason,
        payload=event.payload,
    )


def unmatched_routes(
    app: FastAPI, client: Client, intake: Intake, now: Callable[[], float]
) -> None:
    @app.get("/events/unmatched", tags=["events"], dependencies=[READ])
    async def list_unmatched(
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
        after: Annotated[str | None, Query(min_length=1)] = None,
    ) -> UnmatchedList:
        """The dead letter: events no run took and no trigger started (now, or before
        their buffer ended), by key, a page at a time."""
        found = await client.store.unmatched_events(now(), limit=limit + 1, after=after)
        page = found[:limit]
        more = len(found) > limit
        return UnmatchedList(events=[view(e) for e in page], next=page[-1].key if more else None)

    @app.post("/events/unmatched/{key}/replay", tags=["events"], dependencies=[REPLAY])
    async def replay_unmatched(key: str) -> ReplayOutcome:
        """Deliver an unmatched event again, as if it arrived now (it is not buffered
        again): delivered, or still unmatched; 404 for a key not in the dead letter."""
        outcome = await intake.replay(key)
        return ReplayOutcome(
            key=key,
            status=outcome.status,
            delivered_to=outcome.delivered_to,
            started=outcome.started,
            reason=outcome.reason,
        )
