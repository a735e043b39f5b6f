"""CloudEvents 1.0 over HTTP: reading a request into events (docs/events.md).

The content mode is decided from ``Content-Type``, as the HTTP protocol binding says:

- ``application/cloudevents+json``: structured, the body is one event in the JSON format;
- ``application/cloudevents-batch+json``: batched, the body is a JSON array of them;
- any other ``application/cloudevents…`` type: a format this gateway does not read (415);
- anything else: binary, the attributes are ``ce-*`` headers (percent-encoded), the body
  is the event's data and ``Content-Type`` its ``datacontenttype``.

Why not the official SDK (``cloudevents``, which the tests use as the sending client):
its reader fills in a missing ``id``, ``time`` and ``specversion`` (a sender's mistake
would become a new event on every redelivery, defeating deduplication), takes a body
that is not JSON under a JSON ``Content-Type`` as text, reads no batch and raises errors
that do not say which attribute of which event is wrong. This reader refuses all of
that with `EventRefused`, which names each field (``body[2].source``, ``header ce-id``).

Pure: no HTTP framework, no I/O.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal
from urllib.parse import unquote

import orjson

from tideflow.model import storable

__all__ = [
    "BATCH",
    "STRUCTURED",
    "CloudEvent",
    "EventRefused",
    "FieldProblem",
    "Mode",
    "read_events",
]

STRUCTURED = "application/cloudevents+json"
BATCH = "application/cloudevents-batch+json"
SPECVERSION = "1.0"
REQUIRED = ("id", "source", "specversion", "type")
OPTIONAL = ("datacontenttype", "dataschema", "subject", "time")
RUN_ID_EXTENSION = "tideflowrunid"
"""The extension attribute that names the run an event is for."""

Mode = Literal["structured", "batch", "binary"]

_EXTENSION_NAME = re.compile(r"[a-z0-9]{1,20}")
_RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})")
_JSON_MEDIA = re.compile(r"(application|text)/([a-z0-9!#$&^_.-]+\+)?json")
_INT32 = (-(2**31), 2**31 - 1)


@dataclass(frozen=True, slots=True)
class FieldProblem:
    field: str
    message: str


class EventRefused(Exception):
    """A request that holds no valid CloudEvents: ``status`` (400, or 415 for a format
    this gateway does not read), what is wrong, and each field at fault."""

    def __init__(self, status: int, detail: str, problems: list[FieldProblem]) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.problems = problems


@dataclass(frozen=True, slots=True, kw_only=True)
class CloudEvent:
    """One event read from a request: its context attributes (the four required ones,
    the optional ones it has, its extensions) and its data."""

    attributes: Mapping[str, Any]
    data: Any = None
    has_data: bool = False
    data_base64: str | None = None
    """Data that is neither JSON nor UTF-8 text, base64-encoded."""
    where: str = "body"
    """How errors name this event: ``body``, ``body[3]``, ``headers``."""

    @property
    def id(self) -> str:
        return str(self.attributes["id"])

    @property
    def source(self) -> str:
        return str(self.attributes["source"])

    @property
    def type(self) -> str:
        return str(self.attributes["type"])

    @property
    def run_id(self) -> str | None:
        """The run the ``tideflowrunid`` extension names, if it has one."""
        value = self.attributes.get(RUN_ID_EXTENSION)
        return None if value is None else str(value)

    def payload(self) -> dict[str, Any]:
        """The signal payload the event becomes: its attributes, with ``data`` (or
        ``data_base64``) when it has data."""
        payload = dict(self.attributes)
        if self.has_data:
            payload["data"] = self.data
        if self.data_base64 is not None:
            payload["data_base64"] = self.data_base64
        return payload


def media_type(content_type: str | None) -> str:
    return (content_type or "").split(";", 1)[0].strip().lower()


def read_events(
    content_type: str | None, headers: Mapping[str, str], body: bytes
) -> tuple[Mode, list[CloudEvent]]:
    """The content mode (``structured``, ``batch`` or ``binary``) and the events of a
    request; `EventRefused` naming what is wrong. ``headers`` have lower-case names."""
    media = media_type(content_type)
    if media == STRUCTURED:
        return "structured", [_structured(_json(body), "body")]
    if media == BATCH:
        return "batch", _batch(_json(body))
    if media.startswith("application/cloudevents"):
        raise EventRefused(
            415,
            f"Content-Type {media} is a CloudEvents format this gateway does not read: "
            f"send {STRUCTURED}, {BATCH}, or an event in binary mode (ce-* headers)",
            [FieldProblem("header content-type", f"{media} is not supported")],
        )
    return "binary", [_binary(content_type, headers, body)]


def _json(body: bytes) -> Any:
    try:
        return storable.loads(body)
    except orjson.JSONDecodeError as exc:
        raise EventRefused(
            400, "malformed JSON", [FieldProblem("body", f"malformed JSON: {exc}")]
        ) from None


def _batch(value: Any) -> list[CloudEvent]:
    if not isinstance(value, list):
        raise EventRefused(
            400,
            f"a {BATCH} body is a JSON array of events, not {_kind(value)}",
            [FieldProblem("body", f"expected a JSON array, got {_kind(value)}")],
        )
    problems: list[FieldProblem] = []
    events: list[CloudEvent] = []
    for index, item in enumerate(value):
        try:
            events.append(_structured(item, f"body[{index}]"))
        except EventRefused as exc:
            problems.extend(exc.problems)
    if problems:
        raise EventRefused(400, _summary(problems), problems)
    return events


def _structured(value: Any, where: str) -> CloudEvent:
    if not isinstance(value, dict):
        raise EventRefused(
            400,
            f"an event in the JSON format is a JSON object, not {_kind(value)}",
            [FieldProblem(where, f"expected a JSON object, got {_kind(value)}")],
        )
    members = {k: v for k, v in value.items() if v is not None}  # null: absent
    problems: list[FieldProblem] = []
    has_data, data = "data" in members, members.pop("data", None)
    encoded = members.pop("data_base64", None)
    if has_data and encoded is not None:
        problems.append(
            FieldProblem(f"{where}.data_base64", "an event has data or data_base64, not both")
        )
    elif encoded is not None and not _is_base64(encoded):
        problems.append(FieldProblem(f"{where}.data_base64", "not a base64 string"))
    attributes = _attributes(members, lambda name: f"{where}.{name}", problems, typed=True)
    if problems:
        raise EventRefused(400, _summary(problems), problems)
    return CloudEvent(
        attributes=attributes,
        data=data,
        has_data=has_data,
        data_base64=encoded,
        where=where,
    )


def _binary(content_type: str | None, headers: Mapping[str, str], body: bytes) -> CloudEvent:
    problems: list[FieldProblem] = []
    found: dict[str, Any] = {}
    for name, value in headers.items():
        if not name.startswith("ce-"):
            continue
        if name[3:] in found:  # which one counts would be a guess (and not what was signed)
            problems.append(FieldProblem(f"header {name}", "sent more than once: send it once"))
            continue
        try:
            found[name[3:]] = unquote(value, errors="strict")
        except UnicodeDecodeError:
            problems.append(FieldProblem(f"header {name}", "not percent-encoded UTF-8"))
            found[name[3:]] = value  # present, if wrong: not reported missing as well
    if not found:
        media = media_type(content_type) or "none"
        raise EventRefused(
            400,
            f"no CloudEvent in this request: Content-Type is {media} and there is no ce-* "
            f"header; send one event as {STRUCTURED}, a batch as {BATCH}, or the event's "
            "data with its attributes in ce-id, ce-source, ce-specversion and ce-type headers",
            [FieldProblem(f"header ce-{name}", "missing") for name in REQUIRED],
        )
    found.pop("datacontenttype", None)  # binary mode: Content-Type is the datacontenttype
    if content_type:
        found["datacontenttype"] = content_type
    attributes = _attributes(found, lambda name: f"header ce-{name}", problems, typed=False)
    data, encoded = _binary_data(content_type, body, problems)
    if problems:
        raise EventRefused(400, _summary(problems), problems)
    return CloudEvent(
        attributes=attributes,
        data=data,
        has_data=bool(body) and encoded is None,
        data_base64=encoded,
        where="headers",
    )


def _binary_data(
    content_type: str | None, body: bytes, problems: list[FieldProblem]
) -> tuple[Any, str | None]:
    """The data of a binary-mode event: JSON when its type says so, else UTF-8 text, else
    bytes (base64)."""
    if not body:
        return None, None
    if _JSON_MEDIA.fullmatch(media_type(content_type) or "application/json"):
        try:
            return storable.loads(body), None
        except orjson.JSONDecodeError as exc:
            problems.append(FieldProblem("body", f"malformed JSON (Content-Type says JSON): {exc}"))
            return None, None
    try:
        return body.decode("utf-8"), None
    except UnicodeDecodeError:
        return None, base64.b64encode(body).decode("ascii")


def _attributes(
    members: dict[str, Any],
    name_of: Callable[[str], str],
    problems: list[FieldProblem],
    *,
    typed: bool,
) -> dict[str, Any]:
    for required in REQUIRED:
        if required not in members:
            problems.append(
                FieldProblem(name_of(required), f"the required attribute {required} is missing")
            )
    attributes: dict[str, Any] = {}
    for name, value in members.items():
        message = _attribute_problem(name, value, typed)
        if message:
            problems.append(FieldProblem(name_of(name), message))
        else:
            attributes[name] = value
    return attributes


def _attribute_problem(name: str, value: Any, typed: bool) -> str | None:
    if name in REQUIRED or name in OPTIONAL:
        if not isinstance(value, str):
            return f"{name} is a string, not {_kind(value)}"
        if name == "specversion" and value != SPECVERSION:
            return (
                f'specversion is {value!r}: this gateway reads CloudEvents 1.0 (specversion "1.0")'
            )
        if not value:
            return f"{name} cannot be empty"
        if name == "time" and not _is_timestamp(value):
            return f"time {value!r} is not an RFC 3339 timestamp (2026-01-31T12:00:00Z)"
        return None
    if not _EXTENSION_NAME.fullmatch(name):
        return (
            f"{name!r} is not a CloudEvents attribute name: an extension's name is 1 to 20 "
            "lower-case ASCII letters or digits"
        )
    if isinstance(value, bool | str):
        return None
    if typed and isinstance(value, int) and _INT32[0] <= value <= _INT32[1]:
        return None
    return f"extension {name} is {_kind(value)}: an extension's value is a string, a boolean or a 32-bit integer"


def _is_timestamp(text: str) -> bool:
    if not _RFC3339.fullmatch(text):
        return False
    try:
        datetime.fromisoformat(text.upper().replace("Z", "+00:00"))
    except ValueError:
        return False
    return True


def _is_base64(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    try:
        base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return False
    return True


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer" if -(2**31) <= value < 2**31 else "an integer out of the 32-bit range"
    return {
        float: "a number",
        str: "a string",
        list: "an array",
        dict: "an object",
    }.get(type(value), type(value).__name__)


def _summary(problems: list[FieldProblem]) -> str:
    """One line saying what is wrong: the first problem, and how many more."""
    first = problems[0]
    more = f" (and {len(problems) - 1} more, in errors)" if len(problems) > 1 else ""
    return f"{first.field}: {first.message}{more}"
