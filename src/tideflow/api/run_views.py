"""The routes the web UI reads (any client may): a plan's drawing, a run's state by plan
step, a step's instances, the attempts, and the server-sent event streams that tell a
browser a run changed (``text/event-stream``; the browser's ``EventSource`` reconnects
by itself when a stream ends).

A stream sends the current view at once, then again each time it changed: woken by the
engine's listener (api/changes.py) or, failing that, by a read of the store every
``RECHECK`` seconds; changes closer together than ``THROTTLE`` are sent as one. A run's
stream ends after the run ended; ``max_events`` ends any stream sooner.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated, Any

import orjson
from fastapi import FastAPI, Query
from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from tideflow.api.auth_http import allow
from tideflow.api.changes import RECHECK, RunChanges
from tideflow.api.models import RunList
from tideflow.api.views import (
    AttemptList,
    PlanGraph,
    RunStateView,
    StepInstances,
    attempts_of,
    instances_of,
)
from tideflow.client import Client
from tideflow.errors import NotFound, TideflowError
from tideflow.model.states import RUN_TERMINAL, RunStatus
from tideflow.model.tokens import Action
from tideflow.runtime.result import result_of
from tideflow.store.base import RunFilter

__all__ = ["THROTTLE", "EventStream", "run_view_routes"]

THROTTLE = 0.2
"""Seconds: the least time between two events of one stream (a 10,000-step run changes
thousands of times a second; a browser needs a few frames a second)."""
READ = allow(Action.READ)
MaxEvents = Annotated[int | None, Query(ge=1, le=1_000_000, description="End after so many")]


class EventStream(StreamingResponse):
    media_type = "text/event-stream"


SSE_EVENT: dict[str, Any] = {
    "type": "object",
    "title": "ServerSentEvent",
    "required": ["data"],
    "properties": {
        "event": {"type": "string", "enum": ["run", "runs", "problem"]},
        "data": {
            "type": "string",
            "description": "JSON: a RunStateView (`run`), a RunList (`runs`), or "
            "`{detail}` (`problem`: the stream ends, the browser reconnects)",
        },
        "retry": {"type": "integer", "description": "Milliseconds before a reconnection"},
    },
}
"""One event of a stream, as schemathesis (and the OpenAPI 3.2 ``itemSchema``) sees it."""
_STREAM: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "Server-sent events (`text/event-stream`), one per change",
        "content": {"text/event-stream": {"schema": SSE_EVENT}},
    }
}


def sse(event: str, data: str) -> str:
    return f"event: {event}\ndata: {data}\n\n"


async def run_view(client: Client, run_id: str) -> RunStateView:
    state = await client.state(run_id)
    plan = await client.pinned(state)
    summary = await client.summary(run_id)
    return RunStateView.of(state, plan, summary, result_of(state, plan).output)


def run_view_routes(app: FastAPI, client: Client, changes: RunChanges) -> None:
    _read_routes(app, client)
    _stream_routes(app, client, changes)


def _read_routes(app: FastAPI, client: Client) -> None:
    @app.get("/runs/{run_id}/state", tags=["runs"], dependencies=[READ])
    async def get_run_state(run_id: str) -> RunStateView:
        """The run's state by plan step (a step's instances together, with counts by
        status) and the signals it waits for."""
        return await run_view(client, run_id)

    @app.get("/runs/{run_id}/graph", tags=["runs"], dependencies=[READ])
    async def get_run_graph(run_id: str) -> PlanGraph:
        """The drawing of the plan the run pinned: steps placed in layers, and edges."""
        return PlanGraph.of(await client.plan(run_id))

    @app.get("/runs/{run_id}/steps/{step_id}", tags=["runs"], dependencies=[READ])
    async def get_run_step(
        run_id: str,
        step_id: str,
        offset: Annotated[int, Query(ge=0)] = 0,
        limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    ) -> StepInstances:
        """One plan step's instances (a loop's iterations, a map's items), one page:
        input, output, error and attempts (sensitive fields masked)."""
        state = await client.state(run_id)
        plan = await client.pinned(state)
        if step_id not in plan.specs:
            raise NotFound(f"workflow {plan.name} {plan.version} has no step {step_id!r}")
        return instances_of(state, plan, step_id, offset, limit)

    @app.get("/runs/{run_id}/attempts", tags=["runs"], dependencies=[READ])
    async def get_run_attempts(
        run_id: str, limit: Annotated[int, Query(ge=1, le=10_000)] = 2000
    ) -> AttemptList:
        """The attempts of the run's steps, from its history: when each started and
        ended, and how (for the timeline)."""
        return attempts_of(run_id, await client.history(run_id), limit)

    @app.get("/definitions/{name}/{version}/graph", tags=["definitions"], dependencies=[READ])
    async def get_definition_graph(name: str, version: str) -> PlanGraph:
        """The drawing of a registered definition."""
        return PlanGraph.of(await client.definition(name, version))


def _stream_routes(app: FastAPI, client: Client, changes: RunChanges) -> None:
    @app.get(
        "/streams/runs/{run_id}",
        tags=["streams"],
        dependencies=[READ],
        response_class=EventStream,
        responses=_STREAM,
    )
    async def stream_run(run_id: str, max_events: MaxEvents = None) -> EventStream:
        """``event: run`` with the run's state (as ``GET /runs/{run_id}/state``) now and
        after each change, until the run ended; 404 before the stream for a run that
        does not exist."""
        first = await run_view(client, run_id)

        async def view() -> tuple[BaseModel, bool]:
            current = await run_view(client, run_id)
            return current, RunStatus(current.status) in RUN_TERMINAL

        return _stream(changes, run_id, "run", first, view, max_events)

    @app.get(
        "/streams/runs",
        tags=["streams"],
        dependencies=[READ],
        response_class=EventStream,
        responses=_STREAM,
    )
    async def stream_runs(
        status: RunStatus | None = None,
        workflow: Annotated[str | None, Query(min_length=1)] = None,
        limit: Annotated[int, Query(ge=1, le=500)] = 100,
        cursor: Annotated[str | None, Query(min_length=1)] = None,
        max_events: MaxEvents = None,
    ) -> EventStream:
        """``event: runs`` with a page of ``GET /runs`` (same filters; the first, or the
        one after ``cursor``, a ``next_cursor`` of that listing) now and after each change
        of any run; 422 before the stream for a bad cursor."""
        filter = RunFilter(status=status.value if status else None, workflow=workflow)

        async def page() -> tuple[BaseModel, bool]:
            return RunList.of(await client.list(filter, limit=limit, cursor=cursor)), False

        first, _ = await page()
        return _stream(changes, None, "runs", first, page, max_events)


def _stream(
    changes: RunChanges,
    run_id: str | None,
    event: str,
    first: BaseModel,
    read: Callable[[], Awaitable[tuple[BaseModel, bool]]],
    max_events: int | None,
) -> EventStream:
    async def events() -> AsyncIterator[str]:
        with changes.watch(run_id) as watch:
            last = first.model_dump_json()
            yield "retry: 1000\n" + sse(event, last)
            sent, ended = 1, run_id is not None and _ended(first)
            while not ended and (max_events is None or sent < max_events):
                if await watch.wait(RECHECK) and not changes.closed:
                    await asyncio.sleep(THROTTLE)  # let a burst of changes become one
                if changes.closed:  # the server stops; the browser reconnects to the next
                    return
                try:
                    current, ended = await read()
                except TideflowError as exc:  # the browser reconnects, and reads again
                    yield sse("problem", f'{{"detail": {_quoted(exc.message)}}}')
                    return
                text = current.model_dump_json()
                if text == last:
                    yield ": nothing changed\n\n"  # a keep-alive, and a check the reader is there
                    continue
                last, sent = text, sent + 1
                yield sse(event, text)

    return EventStream(events(), headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})


def _ended(view: BaseModel) -> bool:
    return isinstance(view, RunStateView) and RunStatus(view.status) in RUN_TERMINAL


def _quoted(text: str) -> str:
    return orjson.dumps(text).decode()
