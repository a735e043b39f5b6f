"""What the Redis Streams bus puts on the wire: JSON bodies and headers, decoded with checks.

A task or event entry holds ``b`` (``command_to_data`` / ``event_to_data`` as JSON), ``h``
(the headers as a JSON object, when there are any) and ``d`` (deliveries before it was
handed back). A control message is a JSON object with ``kind`` ``cancel`` (one without
``round`` is from a version before rounds: round 0; one without ``compensation`` names
an action's attempt); ``forget``, which versions before
rounds sent when a run was retried, has no meaning now and decodes to None.
Anything else on a stream is malformed: ``Malformed`` says what is wrong with it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from tideflow.bus.base import NO_HEADERS, CancelAttempt, Control, Headers
from tideflow.errors import StateFormatError
from tideflow.model.codec import (
    command_from_data,
    command_to_data,
    event_from_data,
    event_to_data,
)
from tideflow.model.commands import DispatchTask
from tideflow.model.events import Event


class Malformed(Exception):
    """An entry this bus cannot read (the message says why)."""


def fields_of(raw: list[Any]) -> dict[bytes, bytes]:
    """A flat ``[key, value, ...]`` reply as a dict."""
    return {raw[i]: raw[i + 1] for i in range(0, len(raw) - 1, 2)}


def encode_headers(headers: Mapping[str, str]) -> bytes:
    return orjson.dumps(dict(headers)) if headers else b""


def encode_task(task: DispatchTask) -> bytes:
    return orjson.dumps(command_to_data(task))


def encode_event(event: Event) -> bytes:
    return orjson.dumps(event_to_data(event))


def decode_task(fields: Mapping[bytes, bytes]) -> tuple[DispatchTask, Headers, int]:
    data = _body(fields)
    try:
        task = command_from_data(data)
    except (StateFormatError, KeyError, ValueError, TypeError) as exc:
        raise Malformed(f"not a task message ({exc})") from None
    if not isinstance(task, DispatchTask):
        raise Malformed(f"not a task message (a {type(task).__name__} command)")
    return task, _headers(fields), _deliveries(fields)


def decode_event(fields: Mapping[bytes, bytes]) -> tuple[Event, Headers, int]:
    data = _body(fields)
    try:
        event = event_from_data(data)
    except (StateFormatError, KeyError, ValueError, TypeError) as exc:
        raise Malformed(f"not an event message ({exc})") from None
    return event, _headers(fields), _deliveries(fields)


def encode_control(message: Control) -> bytes:
    return orjson.dumps(
        {
            "kind": "cancel",
            "run_id": message.run_id,
            "step_key": message.step_key,
            "attempt": message.attempt,
            "round": message.round,
            "compensation": message.compensation,
        }
    )


def decode_control(raw: bytes) -> Control | None:
    try:
        data = orjson.loads(raw)
        kind = data.pop("kind")
        if kind == "cancel":
            return CancelAttempt(**data)
        if kind == "forget":
            return None  # rounds do its job (see the module's docstring)
    except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError) as exc:
        raise Malformed(f"not a control message ({type(exc).__name__}: {exc})") from None
    raise Malformed(f"not a control message (unknown kind {kind!r})")


def _body(fields: Mapping[bytes, bytes]) -> dict[str, Any]:
    raw = fields.get(b"b")
    if raw is None:
        raise Malformed("no body (field 'b')")
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise Malformed(f"the body is not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise Malformed(f"the body is not a JSON object but {type(data).__name__}")
    return data


def _headers(fields: Mapping[bytes, bytes]) -> Headers:
    raw = fields.get(b"h")
    if not raw:
        return NO_HEADERS
    try:
        headers = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise Malformed(f"the headers are not JSON ({exc})") from None
    if not isinstance(headers, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
    ):
        raise Malformed("the headers are not a JSON object of strings")
    return headers


def _deliveries(fields: Mapping[bytes, bytes]) -> int:
    raw = fields.get(b"d")
    if raw is None:
        return 0
    try:
        deliveries = int(raw)
    except ValueError:
        raise Malformed(f"the delivery count {raw!r} is not a number") from None
    if deliveries < 0:
        raise Malformed(f"the delivery count {deliveries} is negative")
    return deliveries
