"""The REST API: an ASGI app over a `Client` (everything goes through the client).

::

    app = create_app(runtime.client)        # serve with uvicorn, or call with httpx

Routes (docs/api.md): ``/health``, ``/ready``; ``/definitions`` (validate, register,
list, get by name and version); ``/runs`` (start, list, get, history, cancel, retry,
signals); ``/schedules`` (list, get, pause, resume, trigger, delete:
api/schedule_routes.py); ``/events``, the CloudEvents gateway (api/events.py, docs/events.md). Bodies
are JSON, a definition may also be YAML (``application/yaml``), and a request that changes
something says so in its Content-Type, body or no body; a request for a Host the app does
not answer to is refused (api/browsers.py); every error is a problem (api/problems.py). Every route but ``/health``, ``/ready`` and ``/events`` (and the OpenAPI
document) needs an API token whose role allows its action (``allow`` on the route,
api/auth_http.py); ``auth=False`` serves without (loopback only, `--no-auth`). ``/events``
authenticates each event's source itself (or an API token that may signal), always.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any, Protocol

import orjson
from fastapi import FastAPI, Query, Request, Response
from fastapi.exceptions import RequestValidationError

from tideflow.api import auth_http, browsers, problems
from tideflow.api.auth_http import allow
from tideflow.api.browsers import YAML_TYPES, AllowedHosts, MediaTypes
from tideflow.api.changes import RunChanges
from tideflow.api.compiling import DefinitionCompiler, InProcess
from tideflow.api.docs_pages import docs_pages
from tideflow.api.event_sources import EventSources
from tideflow.api.events import event_routes
from tideflow.api.models import (
    CompiledDefinition,
    DefinitionActivity,
    DefinitionList,
    DefinitionRow,
    Health,
    History,
    QueueList,
    QueueRow,
    Ready,
    Reason,
    RunList,
    RunStatusView,
    RunView,
    SendSignal,
    SignalSent,
    StartedRun,
    StartRun,
    StoredDefinition,
    WhyView,
    WorkerList,
    WorkerRow,
)
from tideflow.api.problems import Problem
from tideflow.api.run_views import run_view_routes
from tideflow.api.schedule_routes import schedule_routes
from tideflow.api.stream_slots import (
    DEFAULT_MAX_STREAMS,
    DEFAULT_MAX_STREAMS_PER_TOKEN,
    StreamSlots,
)
from tideflow.api.times import TimeQuery, TimesHeader
from tideflow.bus.base import unserved
from tideflow.client import Client
from tideflow.errors import NotFound
from tideflow.model import storable
from tideflow.model.states import RunStatus
from tideflow.model.tokens import Action
from tideflow.observability.tracing import joined
from tideflow.store.base import RunFilter
from tideflow.ui.app import ui_app
from tideflow.ui.sessions import Sessions

__all__ = ["Metrics", "create_app"]


class Metrics(Protocol):
    """What ``GET /metrics`` serves and the gateway counts into
    (tideflow.observability.metrics.EngineMetrics)."""

    content_type: str

    async def exposition(self) -> bytes:
        """The Prometheus text of a scrape, levels read now."""
        ...

    def gateway_outcome(self, outcome: str, count: int = 1) -> None:
        """The gateway took ``count`` events with this ``outcome``."""


DEFAULT_MAX_BODY = 1 << 20

_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": Problem, "description": description}
    for status, description in {
        400: "Malformed JSON",
        404: "Not found",
        409: "Conflict with what is stored",
        413: "Body too large",
        422: "A field of the request is wrong (named in `errors`)",
        503: "The store, bus, engine or definition compiler cannot be reached",
    }.items()
}

_DEFINITION_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": {"type": "object", "title": "Definition"}},
            "application/yaml": {"schema": {"type": "string", "title": "Definition (YAML)"}},
        },
    }
}


_PROBLEM = {
    "content": {problems.PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}}
}
READ, START, CANCEL = allow(Action.READ), allow(Action.START), allow(Action.CANCEL)
SIGNAL, RETRY, DEFINITIONS = allow(Action.SIGNAL), allow(Action.RETRY), allow(Action.DEFINITIONS)


def create_app(
    client: Client,
    *,
    auth: bool = True,
    max_body: int = DEFAULT_MAX_BODY,
    event_sources: EventSources | None = None,
    changes: RunChanges | None = None,
    sessions: Sessions | None = None,
    ui: bool = True,
    metrics: Metrics | None = None,
    max_streams: int = DEFAULT_MAX_STREAMS,
    max_streams_per_token: int = DEFAULT_MAX_STREAMS_PER_TOKEN,
    allowed_hosts: Iterable[str] | None = None,
    compiler: DefinitionCompiler | None = None,
) -> FastAPI:
    """The API over ``client``; request bodies over ``max_body`` bytes are refused (413).
    With ``auth`` (the default) a request needs an API token of ``client.store`` whose
    role allows the route's action; ``auth=False`` checks none (serve it on loopback).
    ``POST /events`` takes events from the sources ``event_sources`` lists, and from API
    tokens that may signal (none: API tokens only), with or without ``auth``.

    The web UI is served under ``/ui`` unless not ``ui``; its browser sessions are
    ``sessions`` (default: logging in with an API token, or none without ``auth``;
    ``Sessions.local()`` for `tideflow ui`). ``changes`` is the hub the engine tells of
    run changes (api/changes.py), which the event streams wait on (without it they read
    the store every few seconds).

    ``metrics``: serve them on ``GET /metrics`` (role viewer) and count the gateway's
    events into them; without, ``/metrics`` answers 404.

    The event streams (``/streams/...``) open at once are at most ``max_streams``, and
    ``max_streams_per_token`` per API token (without ``auth``, all are one holder's):
    past either, a 429 (api/stream_slots.py). ValueError for a cap under 1.

    Browsers (api/browsers.py): a request that changes something without a JSON (or,
    on the definition routes, YAML) Content-Type is a 415, ``POST /events`` excepted; a
    request whose Host header names none of ``allowed_hosts`` (any port; the loopback
    names always count) is a 421. ``allowed_hosts`` None: any host with ``auth``, the
    loopback names only without; ``["*"]``: any host (with ``auth`` only).
    ``ValueError`` for a bad name.

    ``compiler`` compiles the definitions requests carry: served, a `CompilerPool` of
    processes (api/compiling.py, what `http_api` gives), so that compiling never holds
    the event loop; without, they are compiled in this process, on the loop."""
    slots = StreamSlots(total=max_streams, per_token=max_streams_per_token)
    hosts = browsers.allowed_hosts(allowed_hosts, auth=auth)
    app = FastAPI(title="tideflow", version="1", responses=_ERRORS, docs_url=None, redoc_url=None)
    if sessions is None and auth:
        sessions = Sessions(store=client.store)
    auth_http.enable(app, client.store if auth else None, sessions)
    problems.install(app, max_body)
    app.add_middleware(TimesHeader)  # `Tideflow-Times: epoch`: times as before (api/times.py)
    app.add_middleware(MediaTypes, routes=app.router.routes)
    app.add_middleware(AllowedHosts, hosts=hosts)  # outermost: before anything else
    document = app.openapi

    def openapi() -> dict[str, Any]:
        schema = document()
        auth_http.document(app, schema, _PROBLEM)
        browsers.document(schema, _PROBLEM, hosts_checked=hosts is not None)
        # /metrics answers Prometheus text only (FastAPI also lists its default JSON)
        schema["paths"]["/metrics"]["get"]["responses"]["200"]["content"] = _METRICS_TEXT[200][
            "content"
        ]
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
    docs_pages(app)
    _service_routes(app, client)
    _metrics_route(app, metrics)
    _definition_routes(app, client, compiler or InProcess(client))
    _run_routes(app, client)
    schedule_routes(app, client)
    run_view_routes(app, client, changes or RunChanges(), slots)
    counted = metrics.gateway_outcome if metrics is not None else None
    event_routes(app, client, event_sources or EventSources(), counted=counted)
    if ui:
        app.mount("/ui", ui_app(sessions), name="ui")
    return app


_METRICS_TEXT = {
    200: {
        "description": "Prometheus text exposition format",
        "content": {"text/plain": {"schema": {"type": "string"}}},
    }
}


def _metrics_route(app: FastAPI, metrics: Metrics | None) -> None:
    @app.get(
        "/metrics",
        tags=["service"],
        dependencies=[READ],
        response_model=None,
        responses=_METRICS_TEXT,  # type: ignore[arg-type]
    )
    async def scrape() -> Response:
        """Prometheus metrics of this server's engine (docs/observability.md): a scraper
        sends a viewer token as a static bearer (`authorization` in its scrape config)."""
        if metrics is None:
            raise NotFound("this server serves no metrics (the metrics extra is not installed)")
        return Response(await metrics.exposition(), media_type=metrics.content_type)


def _service_routes(app: FastAPI, client: Client) -> None:
    @app.get("/health", tags=["service"])
    async def health() -> Health:
        """The process is alive."""
        return Health()

    @app.get("/queues", tags=["service"], dependencies=[READ])
    async def queues() -> QueueList:
        """The task queues of the bus, per queue and priority: what waits, what is held,
        the oldest one's age, the workers reading them; ``unserved`` names the queues
        with tasks and no worker."""
        rows = await client.queues()
        return QueueList(queues=[QueueRow.of(r) for r in rows], unserved=unserved(rows))

    @app.get("/workers", tags=["service"], dependencies=[READ])
    async def workers() -> WorkerList:
        """The workers reading the bus's task queues, with their last heartbeat: the live
        ones, and for a day the ones that stopped without closing (``live`` false: their
        process died; a clean stop forgets them)."""
        return WorkerList(workers=[WorkerRow.of(b) for b in await client.worker_beats()])

    @app.get("/ready", tags=["service"])
    async def ready() -> Ready:
        """The store answers (one page of one run read through the client)."""
        await client.list(limit=1)
        return Ready()


async def _definition_of(request: Request) -> Any:
    """The definition a request carries: a JSON object, or YAML text."""
    body = await request.body()
    media = request.headers.get("content-type", "application/json").split(";")[0].strip()
    if media.lower() in YAML_TYPES:
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            raise RequestValidationError(
                [{"loc": ("body",), "msg": "YAML text must be UTF-8", "type": "value_error"}]
            ) from None
        # A single line naming a file would be read from the server's disk: a YAML
        # document end marker keeps the text text (and changes neither its meaning
        # nor its line numbers).
        return text + "\n...\n"
    try:
        data = storable.loads(body)  # integers exact: the loader refuses one out of range
    except orjson.JSONDecodeError as exc:
        raise RequestValidationError(
            [{"loc": ("body",), "msg": f"malformed JSON: {exc}", "type": "json_invalid"}]
        ) from None
    if not isinstance(data, dict):
        raise RequestValidationError(
            [{"loc": ("body",), "msg": "a definition is a JSON object", "type": "dict_type"}]
        )
    return data


def _definition_routes(app: FastAPI, client: Client, compiler: DefinitionCompiler) -> None:
    @app.post(
        "/definitions/validate",
        tags=["definitions"],
        openapi_extra=_DEFINITION_BODY,
        dependencies=[READ],
    )
    async def validate_definition(request: Request) -> CompiledDefinition:
        """Compile a definition without registering it: its name, version, hash and
        steps, or a 422 listing every problem with its path (also when compiling takes
        longer than the server's limit); 503 when no compiler process is free."""
        return CompiledDefinition(**await compiler.summary(await _definition_of(request)))

    @app.post(
        "/definitions",
        status_code=201,
        tags=["definitions"],
        openapi_extra=_DEFINITION_BODY,
        dependencies=[DEFINITIONS],
    )
    async def register_definition(request: Request) -> CompiledDefinition:
        """Register a definition; the same content again changes nothing, other content
        under a registered (name, version) is a 409. Compiled as for validating."""
        plan = await compiler.compile(await _definition_of(request))
        return CompiledDefinition.of(await client.register(plan))

    @app.get("/definitions", tags=["definitions"], dependencies=[READ])
    async def list_definitions(
        name: Annotated[str | None, Query(min_length=1)] = None,
    ) -> DefinitionList:
        """Registered definitions, by name then version."""
        rows = await client.definitions(name)
        return DefinitionList(definitions=[DefinitionRow.of(r) for r in rows])

    @app.get("/definitions/{name}/{version}", tags=["definitions"], dependencies=[READ])
    async def get_definition(name: str, version: str) -> StoredDefinition:
        """One registered definition, with its normalised source."""
        return StoredDefinition.of(await client.definition(name, version))

    @app.post(
        "/definitions/{name}/{version}/activate", tags=["definitions"], dependencies=[DEFINITIONS]
    )
    async def activate_definition(name: str, version: str) -> DefinitionActivity:
        """Activate a version: it starts runs again (by name, by version, from events)."""
        changed = await client.activate(name, version, True)
        return DefinitionActivity(name=name, version=version, active=True, changed=changed)

    @app.post(
        "/definitions/{name}/{version}/deactivate", tags=["definitions"], dependencies=[DEFINITIONS]
    )
    async def deactivate_definition(name: str, version: str) -> DefinitionActivity:
        """Deactivate a version: it starts no new run (a start by name takes the highest
        active version instead); its runs go on."""
        changed = await client.activate(name, version, False)
        return DefinitionActivity(name=name, version=version, active=False, changed=changed)


def _run_routes(app: FastAPI, client: Client) -> None:
    @app.post("/runs", status_code=201, tags=["runs"], dependencies=[START])
    async def start_run(body: StartRun, request: Request, response: Response) -> StartedRun:
        """Start a run of a registered workflow, by its name (201); 200 with the existing
        run when ``idempotency_key`` was used. The name is never read as a file of the
        server: a value that is no workflow name is a 422, an unknown name a 404, whatever
        exists on disk. With tracing on, a W3C ``traceparent`` header makes the run join
        the caller's trace."""
        with joined(client.tracing, request.headers):
            run_id, created = await client.launch_registered(
                body.workflow,
                body.input,
                version=body.version,
                run_id=body.run_id,
                idempotency_key=body.idempotency_key,
                priority=body.priority,
            )
        response.status_code = 201 if created else 200
        response.headers["Location"] = f"/runs/{run_id}"
        return StartedRun(run_id=run_id, created=created)

    @app.get("/runs", tags=["runs"], dependencies=[READ])
    async def list_runs(
        status: RunStatus | None = None,
        workflow: Annotated[str | None, Query(min_length=1)] = None,
        created_after: TimeQuery = None,
        created_before: TimeQuery = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
        cursor: Annotated[str | None, Query(min_length=1)] = None,
    ) -> RunList:
        """Runs, newest first, one page at a time (``next_cursor`` for the next)."""
        filter = RunFilter(
            status=status.value if status else None,
            workflow=workflow,
            created_after=created_after,
            created_before=created_before,
        )
        return RunList.of(await client.list(filter, limit=limit, cursor=cursor))

    @app.get("/runs/{run_id}", tags=["runs"], dependencies=[READ])
    async def get_run(run_id: str) -> RunView:
        """The run's current state, finished or not (sensitive fields masked), with its
        summary's times."""
        result = await client.get(run_id)
        return RunView.of(result, await client.summary(run_id))

    @app.get("/runs/{run_id}/history", tags=["runs"], dependencies=[READ])
    async def run_history(run_id: str) -> History:
        """Everything that happened to the run, in order (sensitive fields masked)."""
        return History.of(run_id, await client.history(run_id))

    @app.get("/runs/{run_id}/why", tags=["runs"], dependencies=[READ])
    async def why_run(run_id: str) -> WhyView:
        """Why the run is where it is: what each unfinished step waits for and since when
        (a signal, a timer, a queue no worker reads, a worker gone, a child run, a join),
        effects waiting to be relayed, or no live engine for it. Changes nothing."""
        return WhyView.of(await client.why(run_id))

    @app.post("/runs/{run_id}/cancel", status_code=202, tags=["runs"], dependencies=[CANCEL])
    async def cancel_run(
        run_id: str, request: Request, body: Reason | None = None
    ) -> RunStatusView:
        """Ask a pending or running run to stop: its status as it was asked (a run that
        ended is left as it is). With tracing on, the cancel is a span in the trace of the
        request's ``traceparent``, linked to the run's."""
        reason = (body.reason if body else None) or "cancelled on request"
        with joined(client.tracing, request.headers):
            status = await client.cancel(run_id, reason)
        return RunStatusView(run_id=run_id, status=status)

    @app.post("/runs/{run_id}/retry", tags=["runs"], dependencies=[RETRY])
    async def retry_run(run_id: str, request: Request, body: Reason | None = None) -> RunStatusView:
        """Re-open a failed or timed-out run (409 for any other): its status once that is
        committed. With tracing on, the retry is a span in the trace of the request's
        ``traceparent``, linked to the run's."""
        reason = (body.reason if body else None) or "retried on request"
        with joined(client.tracing, request.headers):
            status = await client.retry(run_id, reason)
        return RunStatusView(run_id=run_id, status=status)

    @app.post("/runs/{run_id}/signals", status_code=202, tags=["runs"], dependencies=[SIGNAL])
    async def signal_run(run_id: str, body: SendSignal, request: Request) -> SignalSent:
        """Send a signal; a `wait` for ``name`` whose `match` holds receives it, now or
        within its ``buffer``. ``status`` is `unmatched`, and nothing changed, when the
        run has ended; 422 when no `wait` of the run's workflow waits for ``name``. With
        tracing on, the signal is a span in the trace of the request's ``traceparent``,
        linked to the run's."""
        with joined(client.tracing, request.headers):
            outcome = await client.signal(run_id, body.name, body.payload, signal_id=body.signal_id)
        return SignalSent(run_id=run_id, name=body.name, signal_id=body.signal_id, status=outcome)
