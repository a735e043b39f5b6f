"""How the API writes times: one encoding, as the CLI's JSON writes them — an ISO 8601
string in UTC with milliseconds and a ``Z`` (``2026-05-04T09:30:00.250Z``, docs/api.md).

Before, the API wrote seconds since the epoch (``1777887000.25``). For one release a
client that still reads numbers asks for them: ``Tideflow-Times: epoch`` on a request has
that response write every ``Time`` field (and the times inside a history's events and
transitions) as before. Event streams (``/streams/…``) are shared by their readers and
always write ISO strings. Where the API reads a time (``created_after``…), it takes
either form.
"""

from __future__ import annotations

import math
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import Query
from pydantic import BeforeValidator, PlainSerializer, WithJsonSchema
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = [
    "EPOCH_HEADER",
    "Time",
    "TimeQuery",
    "TimesHeader",
    "iso_time",
    "parse_time",
    "shown_time",
]

EPOCH_HEADER = "tideflow-times"
"""The request header (value ``epoch``) that asks for times as before: epoch seconds."""
_EPOCH = ContextVar("tideflow_api_epoch_times", default=False)


def iso_time(seconds: float) -> str:
    """``seconds`` since the epoch as the API and the CLI write a time."""
    text = datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds")
    return text.replace("+00:00", "Z")


def shown_time(seconds: float | None) -> str | float | None:
    """A time as this response writes it: ISO 8601, or epoch seconds when the request
    asked for them (``Tideflow-Times: epoch``)."""
    if seconds is None or _EPOCH.get():
        return seconds
    return iso_time(seconds)


def parse_time(value: Any) -> Any:
    """A time read from a client or from a server of either release: an ISO 8601 string
    (UTC unless it says otherwise) or epoch seconds; epoch seconds then. Anything else is
    left for the field's own check to refuse."""
    if isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            try:
                return float(value)
            except ValueError:
                return value
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        return moment.timestamp()
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return value


Time = Annotated[
    float,
    BeforeValidator(parse_time),
    PlainSerializer(shown_time, when_used="json"),
    WithJsonSchema(
        {
            "type": "string",
            "format": "date-time",
            "description": "ISO 8601, UTC (`Tideflow-Times: epoch`: seconds since the epoch)",
        },
        mode="serialization",
    ),
]
"""A time field of an API body: epoch seconds inside, ISO 8601 on the wire."""


TimeQuery = Annotated[
    float | None,
    BeforeValidator(parse_time),
    Query(
        allow_inf_nan=False,
        description="An ISO 8601 time (UTC unless it says otherwise) or epoch seconds",
    ),
]
"""A time a query parameter gives, in either form."""


class TimesHeader:
    """ASGI middleware: a request with ``Tideflow-Times: epoch`` gets its times as epoch
    seconds (the encoding before ISO 8601, kept for one release)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        epoch = any(
            name == EPOCH_HEADER.encode() and value.strip().lower() == b"epoch"
            for name, value in scope.get("headers", ())
        )
        token = _EPOCH.set(epoch)
        try:
            await self.app(scope, receive, send)
        finally:
            _EPOCH.reset(token)
