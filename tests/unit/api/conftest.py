"""What the event gateway's tests share: the API served by a real uvicorn on a free
loopback port, events made and encoded by the official CloudEvents SDK, and signing."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import uvicorn
from cloudevents.core.bindings.http import to_binary_event, to_structured_event
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent

from tideflow.api import create_app
from tideflow.api.event_sources import EventSources, sign
from tideflow.client import Client

BATCH = "application/cloudevents-batch+json"


@contextlib.asynccontextmanager
async def served(
    client: Client, sources: EventSources | None = None, max_body: int = 1 << 20
) -> AsyncIterator[httpx.AsyncClient]:
    """An httpx client on the API served over TCP by uvicorn on a free port."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()  # connections wait in the backlog until uvicorn accepts them
    port = listener.getsockname()[1]
    app = create_app(client, max_body=max_body, event_sources=sources)
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, lifespan="off"))
    serving = asyncio.create_task(server.serve(sockets=[listener]))
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as api:
            yield api
    finally:
        server.should_exit = True
        await serving
        listener.close()


def event(type: str, source: str, data: Any = None, **attributes: Any) -> CloudEvent:
    """An event made by the SDK."""
    return CloudEvent(attributes={"type": type, "source": source, **attributes}, data=data)


def structured(ce: CloudEvent) -> tuple[dict[str, str], bytes]:
    message = to_structured_event(ce)
    return dict(message.headers), message.body


def binary(ce: CloudEvent) -> tuple[dict[str, str], bytes]:
    message = to_binary_event(ce)
    return dict(message.headers), message.body


def batch(*events: CloudEvent) -> tuple[dict[str, str], bytes]:
    """A batch: the SDK writes each event in the JSON format (it has no batch writer)."""
    members = [orjson.loads(JSONFormat().write(e)) for e in events]
    return {"content-type": BATCH}, orjson.dumps(members)


def signed(
    secret: str, headers: dict[str, str], body: bytes, at: float | None = None
) -> dict[str, str]:
    timestamp = str(int(time.time() if at is None else at))
    return {
        **headers,
        "x-tideflow-timestamp": timestamp,
        "x-tideflow-signature": sign(secret, timestamp, body),
    }


PAYMENTS = "https://pay.example.com/webhooks"
APPROVALS = "urn:approvals:"
PAY_SECRET = "pay-secret-0123456789abcdef"
APPROVALS_TOKEN = "approvals-token-0123456789"
SOURCES = EventSources.of(  # any type, by run id too: the gateway's tests before policies
    {
        "sources": [
            {
                "source": PAYMENTS,
                "auth": "hmac",
                "secret_env": "PAY_SECRET",
                "types": ["*"],
                "address_runs": True,
            },
            {
                "source": APPROVALS + "*",
                "auth": "bearer",
                "token_env": "APPROVALS_TOKEN",
                "types": ["*"],
                "address_runs": True,
            },
        ]
    },
    {"PAY_SECRET": PAY_SECRET, "APPROVALS_TOKEN": APPROVALS_TOKEN},
)
BEARER = {"authorization": f"Bearer {APPROVALS_TOKEN}"}

PAID = "com.example.payment.succeeded"
ORDER = {
    "name": "order",
    "version": "1",
    "input": {
        "type": "object",
        "required": ["order_id"],
        "properties": {"order_id": {"type": "string"}},
    },
    "steps": [
        {
            "id": "paid",
            "type": "wait",
            "signal": PAID,
            "match": "{{ signal.data.order_id == inputs.order_id }}",
        }
    ],
    "output": "{{ steps.paid.output }}",
}
