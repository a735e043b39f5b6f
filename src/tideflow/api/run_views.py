"""The routes the web UI reads (any client may): a plan's drawing, a run's state by plan
step, a step's instances, the attempts, and the server-sent event streams that tell a
browser a run changed (``text/event-stream``; the browser's ``EventSource`` reconnects
by itself when a stream ends).

A stream sends the current view at once, then again each time it changed. The view is
kept by a feed (api/feeds.py) that every stream of the same view shares: one read of the
store per change (changes closer together than ``THROTTLE`` are one read), however many
browsers watch it, woken by the engine's listener (api/changes.py) or, failing that, by a
read every ``RECHECK`` seconds. A run's stream ends after the run ended; ``max_events``
ends any stream sooner. Each stream holds a slot (api/stream_slots.py): past the caps
per API token and in all, a 429 with ``Retry-After`` before the stream starts; a stream
that ends (its reader gone included) gives its slot back at once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Hashable, Sequence
from typing import Annotated, Any

import orjson
from fastapi import FastAPI, Query
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from tideflow.api.auth import Principal
from tideflow.api.auth_http import allow
from tideflow.api.changes import RunChanges
from tideflow.api.feeds import KEEP_ALIVE, Feeds, Read, Reader
from tideflow.api.models import RunList
from tideflow.api.problems import Problem
from tideflow.api.step_logs import StepLogList, step_logs_of
from tideflow.api.stream_slots import RETRY_AFTER, StreamSlots
from tideflow.api.views import (
    AttemptList,
    PlanGraph,
    RunStateView,
    StepInstances,
    attempts_of,
    instances_of,
)
from tideflow.client import Client
from tideflow.errors import NotFound
from tideflow.model.states import RUN_TERMINAL, RunStatus
from tideflow.model.tokens import Action
from tideflow.runtime.result import result_of
from tideflow.runtime.steplogs import matches
from tideflow.store.base import RunFilter

__all__ = ["EventStream", "run_view_routes", "stream_slots"]

READ = allow(Action.READ)
MaxEvents = Annotated[int | None, Query(ge=1, le=1_000_000, description="End after so many")]
_SLOTS = "tideflow_stream_slots"


class EventStream(StreamingResponse):
    """A ``text/event-stream`` response; ``on_close`` is called when it ends, however it
    ends (its reader disconnected, the stream ended, it never started)."""

    media_type = "text/event-stream"

    def __init__(
        self,
        content: AsyncIterator[str],
        status_code: int = 200,  # FastAPI documents the route's status by this default
        *,
        headers: dict[str, str] | None = None,
        on_close: Sequence[Callable[[], None]] = (),
    ) -> None:
        super().__init__(content, status_code, headers=headers)
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            for close in self._on_close:
                close()


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
    },
    429: {
        "model": Problem,
        "description": "As many event streams are open as may be, with this API token or "
        "on the server (`too-many-streams`): close one, or retry after `Retry-After` seconds",
        "headers": {
            "Retry-After": {
                "description": f"Seconds to wait before trying again ({RETRY_AFTER})",
                "schema": {"type": "integer"},
            }
        },
    },
}


def sse(event: str, data: str) -> str:
    return f"event: {event}\ndata: {data}\n\n"


async def run_view(client: Client, run_id: str) -> RunStateView:
    state = await client.state(run_id)
    plan = await client.pinned(state)
    summary = await client.summary(run_id)
    return RunStateView.of(state, plan, summary, result_of(state, plan).output)


def run_view_routes(
    app: FastAPI, client: Client, changes: RunChanges, slots: StreamSlots | None = None
) -> None:
    """The routes on ``app``; the streams wait on ``changes`` and hold ``slots`` (default:
    the default caps), which ``stream_slots(app)`` hands back."""
    slots = slots or StreamSlots()
    setattr(app.state, _SLOTS, slots)
    _read_routes(app, client)
    _stream_routes(app, client, Feeds(changes), slots)


def stream_slots(app: FastAPI) -> StreamSlots:
    """The caps and counts of the event streams of an app ``create_app`` made."""
    slots: StreamSlots = getattr(app.state, _SLOTS)
    return slots


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

    @app.get("/runs/{run_id}/logs", tags=["runs"], dependencies=[READ])
    async def get_run_logs(
        run_id: str,
        step: Annotated[
            str | None,
            Query(
                max_length=1000,
                description="A step instance's key (`items[2]/charge`) or a plan step's id "
                "(`charge`: every instance); every step when absent",
            ),
        ] = None,
    ) -> StepLogList:
        """What each ended attempt of the run's steps wrote: stdout, stderr and `logging`
        records, the last 64 KiB of each per attempt (`truncated`: bytes dropped before),
        secrets the attempt resolved masked."""
        answer = step_logs_of(run_id, step, await client.history(run_id))
        if step is not None and not answer.attempts:
            state = await client.state(run_id)
            plan = await client.pinned(state)
            if step not in plan.specs and not any(matches(key, step) for key in state.steps):
                raise NotFound(
                    f"run {run_id} has no step {step!r}: name a step key or one of the "
                    f"plan's steps ({', '.join(sorted(plan.specs))})"
                )
        return answer

    @app.get("/definitions/{name}/{version}/graph", tags=["definitions"], dependencies=[READ])
    async def get_definition_graph(name: str, version: str) -> PlanGraph:
        """The drawing of a registered definition."""
        return PlanGraph.of(await client.definition(name, version))


def _stream_routes(app: FastAPI, client: Client, feeds: Feeds, slots: StreamSlots) -> None:
    @app.get(
        "/streams/runs/{run_id}",
        tags=["streams"],
        response_class=EventStream,
        responses=_STREAM,
    )
    async def stream_run(
        principal: Annotated[Principal | None, READ], run_id: str, max_events: MaxEvents = None
    ) -> EventStream:
        """``event: run`` with the run's state (as ``GET /runs/{run_id}/state``) now and
        after each change, until the run ended; 404 before the stream for a run that
        does not exist. Every stream of one run shares its reads; 429 past the caps on
        open streams."""

        async def view() -> tuple[str, bool]:
            current = await run_view(client, run_id)
            return current.model_dump_json(), RunStatus(current.status) in RUN_TERMINAL

        return await _open(
            feeds, slots, principal, ("run", run_id), run_id, view, "run", max_events
        )

    @app.get(
        "/streams/runs",
        tags=["streams"],
        response_class=EventStream,
        responses=_STREAM,
    )
    async def stream_runs(
        principal: Annotated[Principal | None, READ],
        status: RunStatus | None = None,
        workflow: Annotated[str | None, Query(min_length=1)] = None,
        limit: Annotated[int, Query(ge=1, le=500)] = 100,
        cursor: Annotated[str | None, Query(min_length=1)] = None,
        max_events: MaxEvents = None,
    ) -> EventStream:
        """``event: runs`` with a page of ``GET /runs`` (same filters; the first, or the
        one after ``cursor``, a ``next_cursor`` of that listing) now and after each change
        of any run; 422 before the stream for a bad cursor. Every stream of the same
        filters, cursor and limit shares one read per change; 429 past the caps on open
        streams."""
        filter = RunFilter(status=status.value if status else None, workflow=workflow)

        async def page() -> tuple[str, bool]:
            runs = await client.list(filter, limit=limit, cursor=cursor)
            return RunList.of(runs).model_dump_json(), False

        key = ("runs", filter.status, filter.workflow, limit, cursor)
        return await _open(feeds, slots, principal, key, None, page, "runs", max_events)


async def _open(
    feeds: Feeds,
    slots: StreamSlots,
    principal: Principal | None,
    key: Hashable,
    run_id: str | None,
    read: Read,
    event: str,
    max_events: int | None,
) -> EventStream:
    """The stream of the view ``key`` names, once it has a slot (``TooManyStreams``
    before anything is read) and its first view (that read's error, before it starts)."""
    slot = slots.take(principal)
    try:
        reader = await feeds.join(key, run_id, read)
    except BaseException:
        slot.release()
        raise
    return EventStream(
        _events(reader, event, max_events),
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        on_close=(reader.close, slot.release),
    )


async def _events(reader: Reader, event: str, max_events: int | None) -> AsyncIterator[str]:
    yield "retry: 1000\n" + sse(event, reader.take())
    sent = 1
    while max_events is None or sent < max_events:
        text = await reader.next(KEEP_ALIVE)
        if text is not None:
            sent += 1
            yield sse(event, text)
        elif reader.problem is not None:  # the browser reconnects, and reads again
            yield sse("problem", f'{{"detail": {_quoted(reader.problem)}}}')
            return
        elif reader.over:  # the run ended, or the server stops (the browser reconnects)
            return
        else:
            yield ": nothing changed\n\n"  # a keep-alive, and a check the reader is there


def _quoted(text: str) -> str:
    return orjson.dumps(text).decode()
