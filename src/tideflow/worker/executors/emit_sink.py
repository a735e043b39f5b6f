"""Outgoing CloudEvents: building them and delivering them to webhooks, signed.

Structured mode: the body is the whole CloudEvent as JSON, with
``content-type: application/cloudevents+json``. The signature is
``X-Tideflow-Signature: sha256=<hex HMAC-SHA256 of the exact body bytes, keyed
with the sink's secret>``; ``X-Tideflow-Timestamp`` is the send time in Unix
seconds (informational; the signed body carries the event's ``id`` and
``time``, which a receiver uses to deduplicate and to reject stale events).
"""

from __future__ import annotations

import hashlib
import hmac
import time as _time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import orjson

from tideflow.worker.executors.errors import WebhookDeliveryError, snippet

if TYPE_CHECKING:
    import httpx  # imported where used: `tideflow runs list` needs no HTTP client

CLOUDEVENTS_CONTENT_TYPE = "application/cloudevents+json"
SIGNATURE_HEADER = "X-Tideflow-Signature"
TIMESTAMP_HEADER = "X-Tideflow-Timestamp"
SIGNATURE_PREFIX = "sha256="


def make_cloudevent(
    type: str,
    source: str,
    data: Any = None,
    id: str | None = None,
    time: float | datetime | str | None = None,
    *,
    subject: str | None = None,
    extensions: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A CloudEvent 1.0 as a dict; ``id`` defaults to a UUID4, ``time`` to now (RFC 3339)."""
    event: dict[str, Any] = {
        "specversion": "1.0",
        "id": id or str(uuid.uuid4()),
        "source": source,
        "type": type,
        "time": _rfc3339(time),
        "datacontenttype": "application/json",
    }
    if subject is not None:
        event["subject"] = subject
    event.update(extensions or {})
    event["data"] = data
    return event


def _rfc3339(value: float | datetime | str | None) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        value = _time.time()
    if not isinstance(value, datetime):
        value = datetime.fromtimestamp(value, tz=UTC)
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def sign(body: bytes, secret: str | bytes) -> str:
    """The signature header value for ``body``: ``sha256=<hex>``."""
    key = secret.encode() if isinstance(secret, str) else secret
    return SIGNATURE_PREFIX + hmac.new(key, body, hashlib.sha256).hexdigest()


def verify_signature(body: bytes, header: str | None, secret: str | bytes) -> bool:
    """True when ``header`` is the signature of ``body`` with ``secret`` (constant time)."""
    if not header:
        return False
    return hmac.compare_digest(sign(body, secret).encode(), header.strip().encode())


class EventSink(ABC):
    """Somewhere outgoing events are delivered."""

    @abstractmethod
    async def send(self, event: Mapping[str, Any]) -> None:
        """Deliver one CloudEvent; raise ``WebhookDeliveryError`` (or another StepError)."""

    async def __call__(self, event: Mapping[str, Any]) -> None:
        """Sinks are callables, so ``Runtime.add_event_sink(sink)`` accepts one directly."""
        await self.send(event)

    async def aclose(self) -> None:
        """Release resources owned by the sink."""
        return  # nothing to release by default


class WebhookSink(EventSink):
    """POSTs each event to ``url``, signed with ``secret``.

    Uses ``client`` when given (not closed by the sink), else a client of its own.
    A 2xx answer is delivery; 5xx, 429 and network errors raise a retryable
    ``WebhookDeliveryError``, other statuses a non-retryable one.
    """

    def __init__(
        self,
        url: str,
        secret: str | bytes,
        client: httpx.AsyncClient | None = None,
        *,
        timeout: float = 10.0,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.url = url
        self._secret = secret
        self._client = client
        self._owns_client = client is None
        self._timeout = timeout
        self._headers = dict(headers or {})

    async def send(self, event: Mapping[str, Any]) -> None:
        import httpx

        body = orjson.dumps(event)
        headers = {
            **self._headers,
            "content-type": CLOUDEVENTS_CONTENT_TYPE,
            SIGNATURE_HEADER: sign(body, self._secret),
            TIMESTAMP_HEADER: str(int(_time.time())),
        }
        try:
            response = await self._http().post(
                self.url, content=body, headers=headers, timeout=self._timeout
            )
        except httpx.HTTPError as exc:
            raise WebhookDeliveryError(
                f"POST {self.url}: event {event.get('id')!r} not delivered: "
                f"{type(exc).__name__}: {exc}",
                retryable=True,
            ) from exc
        _check(response, event)

    async def aclose(self) -> None:
        if self._client is not None and self._owns_client:
            await self._client.aclose()
            self._client = None

    def _http(self) -> httpx.AsyncClient:
        import httpx

        if self._client is None:
            self._client = httpx.AsyncClient()
        return self._client


def _check(response: httpx.Response, event: Mapping[str, Any]) -> None:
    status = response.status_code
    if 200 <= status < 300:
        return
    raise WebhookDeliveryError(
        f"POST {response.request.url}: event {event.get('id')!r} refused with HTTP {status}: "
        f"{snippet(response.text)}",
        retryable=status == 429 or status >= 500,
    )
