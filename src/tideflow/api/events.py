"""The event gateway: ``POST /events`` takes CloudEvents 1.0 over HTTP (docs/events.md).

A request is read (api/cloudevent.py: structured, batched or binary mode, by its
``Content-Type``), authorised (an API token that may signal, else each event's source
by its rule in api/event_sources.py, whose signature covers what routes the event and
whose policy allows its type and its naming a run), then each event becomes a signal:

- name: the event's ``type``; payload: its attributes and its ``data``
  (`CloudEvent.payload`), so a `wait` matches on ``signal.data.order_id``;
- to the run its ``tideflowrunid`` extension names (``Client.signal``; a run not at its
  `wait` yet keeps the signal for it), else to every run whose `wait` for that signal
  matches it (``Client.deliver_event``, correlation);
- its id in each run is derived from (``source``, ``id``) (`signal_id`), so a
  redelivery, even one that arrives at the same time as the first, is applied once;
- what became of it is recorded (runtime/intake.py): delivered, buffered for a run whose
  `wait` starts later, or unmatched (the dead letter, api/unmatched.py); a redelivery is
  answered ``duplicate``.

A refused request (400 malformed, 401 not authorised, 403 a role that may not signal or
an event its source may not send, 413 too large, 415 a format not read) changes
nothing: every event of it is read and every source authorised before the first is
delivered.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Literal

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from tideflow.api.auth import PREFIX as API_TOKEN_PREFIX
from tideflow.api.auth import authenticate, require
from tideflow.api.cloudevent import (
    BATCH,
    STRUCTURED,
    CloudEvent,
    EventRefused,
    FieldProblem,
    Mode,
    read_events,
)
from tideflow.api.event_signatures import SIGNATURE_HEADER, TIMESTAMP_HEADER
from tideflow.api.event_sources import EventRequest, EventSources, SourceRefused, SourceRule
from tideflow.api.problems import FieldError, Problem, problem_response
from tideflow.api.unmatched import unmatched_routes
from tideflow.client import Client
from tideflow.errors import (
    Forbidden,
    InputValidationError,
    StepError,
    Unauthenticated,
)
from tideflow.model import storable
from tideflow.model.tokens import Action
from tideflow.observability.tracing import TRACEPARENT, TRACESTATE, joined, received
from tideflow.runtime.intake import Inbound, Intake

__all__ = ["EventOutcome", "EventsAccepted", "event_routes", "signal_id"]

log = logging.getLogger("tideflow.api.events")

CHALLENGE = 'Bearer realm="tideflow-events"'
REFUSED_DETAIL = (
    "the request is not authorised for the source of its events: send the source's bearer "
    "token or its HMAC signature, or an API token that may signal (docs/events.md)"
)

Status = Literal["delivered", "buffered", "unmatched", "duplicate"]


class EventOutcome(BaseModel):
    """What became of one event."""

    id: str
    source: str
    type: str
    status: Status = Field(
        description=(
            "delivered: handed to the runs in delivered_to, or starting those in started; "
            "buffered: no run waits for it yet, kept for a run whose wait starts within the "
            "wait's buffer; unmatched: no run takes it (reason says why), kept in the dead "
            "letter (GET /events/unmatched); duplicate: this (source, id) was answered "
            "already, nothing changed"
        )
    )
    delivered_to: list[str] = Field(description="The runs the event went to.")
    started: list[str] = Field(
        default_factory=list,
        description="The runs it started (or had started: a redelivery starts nothing new): "
        "one per workflow with a trigger on its type that matches (docs/dsl.md, Triggers)",
    )
    reason: str | None = Field(None, description="Why an event is unmatched.")


class EventsAccepted(BaseModel):
    mode: Mode
    events: list[EventOutcome]
    """One per event, in the order of the request."""


def signal_id(source: str, event_id: str) -> str:
    """The id the event (``source``, ``id``) has as a signal in every run it reaches: the
    same for every delivery of it, and for no other event."""
    digest = hashlib.sha256(orjson.dumps([source, event_id])).hexdigest()
    return f"ce:{digest[:40]}"


_HEADERS: dict[str, str] = {
    "ce-id": "Binary mode: the event's id (with ce-source, what identifies it).",
    "ce-source": "Binary mode: the event's source; its credentials are this source's.",
    "ce-specversion": 'Binary mode: "1.0".',
    "ce-type": "Binary mode: the event's type, the name of the signal it becomes.",
    "ce-subject": "Binary mode: the event's subject (optional).",
    "ce-time": "Binary mode: when it happened, RFC 3339 (optional).",
    "ce-dataschema": "Binary mode: the schema of its data (optional).",
    "ce-tideflowrunid": "Binary mode: send to this run only (a source needs address_runs).",
    "ce-traceparent": "Binary mode: the event's W3C trace context (optional).",
    TIMESTAMP_HEADER: "An hmac source: when the request was signed, unix seconds.",
    SIGNATURE_HEADER: (
        "An hmac source: space-separated signatures, each v2=<hex> (the canonical "
        "request: method, path, Content-Type, every ce-* header, the body's SHA-256) or, "
        "in structured and batched mode only, sha256=<hex> (timestamp.body). "
        "docs/events.md, Signatures."
    ),
}
"""The headers ``POST /events`` reads (other ``ce-*`` headers are extension attributes)."""

_BODY: dict[str, Any] = {
    "parameters": [
        {
            "name": name,
            "in": "header",
            "required": False,
            "description": description,
            "schema": {"type": "string"},
        }
        for name, description in _HEADERS.items()
    ],
    "requestBody": {
        "required": True,
        "description": (
            "One event (structured mode), a JSON array of events (batched mode), or an "
            "event's data with its attributes in ce-* headers (binary mode: any other "
            "Content-Type)."
        ),
        "content": {
            STRUCTURED: {"schema": {"$ref": "#/components/schemas/CloudEventJSON"}},
            BATCH: {
                "schema": {
                    "type": "array",
                    "items": {"$ref": "#/components/schemas/CloudEventJSON"},
                }
            },
            "*/*": {"schema": {"title": "Event data (binary mode)"}},
        },
    },
}

_CLOUDEVENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "title": "CloudEventJSON",
    "description": "A CloudEvent in the JSON event format (CloudEvents 1.0).",
    "required": ["id", "source", "specversion", "type"],
    "properties": {
        "id": {"type": "string", "minLength": 1},
        "source": {"type": "string", "minLength": 1},
        "specversion": {"type": "string", "enum": ["1.0"]},
        "type": {"type": "string", "minLength": 1},
        "subject": {"type": "string", "minLength": 1},
        "time": {"type": "string", "format": "date-time"},
        "datacontenttype": {"type": "string", "minLength": 1},
        "dataschema": {"type": "string", "minLength": 1},
        "tideflowrunid": {"type": "string", "description": "Send to this run only."},
        "data": {},
        "data_base64": {"type": "string", "contentEncoding": "base64"},
    },
    "additionalProperties": {"type": ["string", "integer", "boolean"]},
}

_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": Problem, "description": description}
    for status, description in {
        400: "Not a CloudEvent: malformed JSON, a missing or wrong attribute (named in `errors`)",
        401: "Not authorised for the source of an event",
        403: "An API token whose role may not signal, or an event its source may not "
        "send (a type outside its `types`, a tideflowrunid without `address_runs`)",
        413: "Body too large",
        415: "A CloudEvents format other than JSON",
    }.items()
}


def event_routes(
    app: FastAPI,
    client: Client,
    sources: EventSources,
    *,
    now: Callable[[], float] = time.time,
    counted: Callable[[str, int], None] | None = None,
) -> None:
    """``POST /events`` on ``app``: events from ``sources`` (and from API tokens that may
    signal) become signals through ``client``. ``counted(outcome, n)`` hears what became of
    the events (delivered, buffered, unmatched, duplicate; rejected: a request refused whole,
    counted once) for the metrics."""
    app.add_exception_handler(EventRefused, _event_refused)
    app.add_exception_handler(SourceRefused, _source_refused)
    app.add_exception_handler(EventNotAllowed, _event_not_allowed)
    intake = Intake(client, now=now)
    unmatched_routes(app, client, intake, now)

    @app.post(
        "/events",
        status_code=202,
        tags=["events"],
        openapi_extra=_BODY,
        responses=_RESPONSES,
    )
    async def receive_events(request: Request) -> EventsAccepted:
        """Take CloudEvents (structured, batched or binary mode) and signal the runs they
        are for: the one their ``tideflowrunid`` names, else every run whose `wait` for
        the event's type matches it (or, none yet, the run whose wait starts within its
        buffer). 202 with what became of each event: delivered, buffered, unmatched
        (kept: GET /events/unmatched) or duplicate (a redelivery: applied once)."""
        try:
            accepted = await _receive(request)
        except (EventRefused, SourceRefused, EventNotAllowed, Forbidden):
            if counted is not None:
                counted("rejected", 1)
            raise
        if counted is not None:
            for event in accepted.events:
                counted(event.status, 1)
        return accepted

    async def _receive(request: Request) -> EventsAccepted:
        body = await request.body()
        headers = request.headers
        token = await _api_token(client, headers.get("authorization"))
        mode, events = read_events(headers.get("content-type"), headers, body)
        if not token:
            signed = EventRequest.of(
                request.method,
                request.url.path,
                headers.items(),
                body,
                self_contained=mode != "binary",
            )
            _authorise(sources, events, signed, now())
        _check_storable(events)
        delivered = await _deliver_all(client, intake, events, headers)
        return EventsAccepted(mode=mode, events=delivered)

    _document_event_schema(app)


async def _api_token(client: Client, header: str | None) -> bool:
    """True when the request carries an API token that may signal (401 for a bad one, 403
    for a role that may not); False when it carries none (a source's bearer token)."""
    scheme, _, credentials = (header or "").strip().partition(" ")
    if scheme.lower() != "bearer" or not credentials.strip().startswith(API_TOKEN_PREFIX):
        return False
    try:
        principal = await authenticate(client.store, header)
    except Unauthenticated as exc:
        raise SourceRefused(f"API token: {exc.message}") from None
    require(principal, Action.SIGNAL)
    return True


class EventNotAllowed(Exception):
    """Events their sources may not send (a type, or naming a run): each field at fault."""

    def __init__(self, problems: list[FieldProblem]) -> None:
        super().__init__(problems[0].message)
        self.problems = problems


def _authorise(
    sources: EventSources, events: list[CloudEvent], request: EventRequest, now: float
) -> None:
    """`SourceRefused` unless the request carries the credentials of every event's
    source, then `EventNotAllowed` unless every event is inside its source's policy (a
    batch is refused whole)."""
    rules: dict[str, SourceRule] = {}
    for source in dict.fromkeys(event.source for event in events):
        rule = sources.rule_for(source)
        if rule is None:
            raise SourceRefused(f"source {source!r} is not in the event sources and no API token")
        rule.check(request, now)
        rules[source] = rule
    problems = [
        FieldProblem(_field(event, attribute), message)
        for event in events
        for attribute, message in rules[event.source].not_allowed(
            event.type, event.run_id is not None
        )
    ]
    if problems:
        raise EventNotAllowed(problems)


def _field(event: CloudEvent, attribute: str) -> str:
    """How a problem names an event's attribute: ``body[2].type``, ``header ce-type``."""
    return f"header ce-{attribute}" if event.where == "headers" else f"{event.where}.{attribute}"


def _check_storable(events: list[CloudEvent]) -> None:
    """Every payload can be stored, checked before the first is delivered; an integer
    out of range (model/storable.py, the rule of every edge) is named by its field."""
    problems: list[tuple[str, str]] = []
    for event in events:
        payload = event.payload()
        found = storable.integer_problem(payload)
        if found is not None:
            problems.append((_field_of(event, found[0]), f"event {event.id!r}: {found[1]}"))
            continue
        try:
            storable.check(payload, f"event {event.id!r}")
        except StepError as exc:
            problems.append((event.where, exc.message))
    if problems:
        fields = [FieldProblem(where, message) for where, message in problems]
        raise EventRefused(400, f"{fields[0].field}: {fields[0].message}", fields)


def _field_of(event: CloudEvent, path: storable.Path) -> str:
    """Where a value of an event's payload was sent: ``body.data.n``, ``body[2].data.n``,
    or, in binary mode (the body is the data), ``body.n``."""
    if event.where == "headers":  # only the data can hold a number in binary mode
        return storable.format_path(path[1:], "body")
    return storable.format_path(path, event.where)


async def _deliver_all(
    client: Client, intake: Intake, events: list[CloudEvent], headers: Mapping[str, str]
) -> list[EventOutcome]:
    outcomes: list[EventOutcome] = []
    seen: set[tuple[str, str]] = set()
    for event in events:
        key = (event.source, event.id)
        if key in seen:  # the same event twice in one batch: applied once
            outcomes.append(_outcome(event, "duplicate", [], "it comes earlier in this batch"))
            continue
        seen.add(key)
        with (
            joined(client.tracing, _trace_of(event, headers)),
            received(client.tracing, f"event {event.type}", _span_attributes(event)),
        ):
            outcomes.append(await _deliver(intake, event))
    return outcomes


def _span_attributes(event: CloudEvent) -> dict[str, str]:
    return {
        "cloudevents.event_id": event.id,
        "cloudevents.event_source": event.source,
        "cloudevents.event_type": event.type,
    }


def _trace_of(event: CloudEvent, headers: Mapping[str, str]) -> Mapping[str, str]:
    """The event's trace context: its ``traceparent`` / ``tracestate`` attributes (the
    CloudEvents distributed-tracing extension), else the request's W3C headers."""
    attributes = event.attributes
    if isinstance(attributes.get(TRACEPARENT), str):
        found = {TRACEPARENT: attributes[TRACEPARENT]}
        if isinstance(attributes.get(TRACESTATE), str):
            found[TRACESTATE] = attributes[TRACESTATE]
        return found
    return headers


async def _deliver(intake: Intake, event: CloudEvent) -> EventOutcome:
    inbound = Inbound(
        key=signal_id(event.source, event.id),
        source=event.source,
        id=event.id,
        type=event.type,
        payload=event.payload(),
        run_id=event.run_id,
    )
    try:
        outcome = await intake.take(inbound)
    except InputValidationError as exc:
        raise EventRefused(400, exc.message, []) from None
    return _outcome(
        event, outcome.status, outcome.delivered_to, outcome.reason, started=outcome.started
    )


def _outcome(
    event: CloudEvent,
    status: Status,
    runs: list[str],
    reason: str | None = None,
    *,
    started: list[str] | None = None,
) -> EventOutcome:
    return EventOutcome(
        id=event.id,
        source=event.source,
        type=event.type,
        status=status,
        delivered_to=runs,
        started=started or [],
        reason=reason,
    )


async def _event_refused(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, EventRefused)
    kind = "unsupported-media-type" if exc.status == 415 else "event-invalid"
    fields = [FieldError(field=p.field, message=p.message) for p in exc.problems]
    return problem_response(exc.status, kind, request.url.path, exc.detail, fields)


async def _event_not_allowed(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, EventNotAllowed)
    log.warning("POST %s refused: %s", request.url.path, exc)
    fields = [FieldError(field=p.field, message=p.message) for p in exc.problems]
    more = f" (and {len(fields) - 1} more, in errors)" if len(fields) > 1 else ""
    detail = f"{fields[0].field}: {fields[0].message}{more}"
    return problem_response(403, "forbidden", request.url.path, detail, fields)


async def _source_refused(request: Request, exc: Exception) -> JSONResponse:
    log.warning("POST %s refused: %s", request.url.path, exc)
    return problem_response(
        401,
        "unauthenticated",
        request.url.path,
        REFUSED_DETAIL,
        headers={"WWW-Authenticate": CHALLENGE},
    )


def _document_event_schema(app: FastAPI) -> None:
    document = app.openapi

    def openapi() -> dict[str, Any]:
        schema = document()
        schema.setdefault("components", {}).setdefault("schemas", {})["CloudEventJSON"] = (
            _CLOUDEVENT_SCHEMA
        )
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
