"""Outgoing CloudEvents: the event shape, the webhook sink against a real server, signatures."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import orjson
import pytest

from tideflow.worker.executors.emit_sink import (
    WebhookSink,
    make_cloudevent,
    sign,
    verify_signature,
)
from tideflow.worker.executors.errors import WebhookDeliveryError

SECRET = "whsec-test-0123"


class _Receiver(ThreadingHTTPServer):
    daemon_threads = False
    block_on_close = True
    received: list[tuple[dict[str, str], bytes]]
    status: int


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 10
    server: _Receiver

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"]))
        self.server.received.append(({k.lower(): v for k, v in self.headers.items()}, body))
        reply = b"accepted" if self.server.status < 300 else b"nope"
        self.send_response(self.server.status)
        self.send_header("content-length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)


@pytest.fixture
def receiver() -> Iterator[_Receiver]:
    server = _Receiver(("127.0.0.1", 0), _Handler)
    server.received, server.status = [], 202
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as shared:
        yield shared


def _url(server: _Receiver) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}/hooks"


def test_make_cloudevent() -> None:
    event = make_cloudevent("order.shipped", "tideflow/run/1", {"id": 7}, "evt-1", 0.0)
    assert event == {
        "specversion": "1.0",
        "id": "evt-1",
        "source": "tideflow/run/1",
        "type": "order.shipped",
        "time": "1970-01-01T00:00:00Z",
        "datacontenttype": "application/json",
        "data": {"id": 7},
    }


def test_make_cloudevent_defaults() -> None:
    event = make_cloudevent("t", "s", None, subject="run-1", extensions={"tideflowrun": "r1"})
    uuid.UUID(event["id"])
    assert datetime.fromisoformat(event["time"]).tzinfo is not None
    assert event["subject"] == "run-1"
    assert event["tideflowrun"] == "r1"
    naive = make_cloudevent("t", "s", time=datetime(2024, 5, 1, 12, 0))
    assert naive["time"] == "2024-05-01T12:00:00Z"
    aware = make_cloudevent("t", "s", time=datetime(2024, 5, 1, 12, 0, tzinfo=UTC))
    assert aware["time"] == "2024-05-01T12:00:00Z"


async def test_webhook_delivers_a_signed_structured_cloudevent(
    receiver: _Receiver, client: httpx.AsyncClient
) -> None:
    event = make_cloudevent("order.paid", "tideflow/test", {"amount": 12.5}, "evt-42")
    sink = WebhookSink(_url(receiver), SECRET, client)
    await sink.send(event)
    await sink.aclose()
    assert not client.is_closed  # a client handed in belongs to the caller
    [(headers, body)] = receiver.received
    assert headers["content-type"] == "application/cloudevents+json"
    assert orjson.loads(body) == event
    assert verify_signature(body, headers["x-tideflow-signature"], SECRET)
    assert headers["x-tideflow-signature"] == sign(body, SECRET)
    assert headers["x-tideflow-signature"].startswith("sha256=")
    assert abs(int(headers["x-tideflow-timestamp"]) - time.time()) < 60


def test_verify_signature_rejects_tampering() -> None:
    body = b'{"id":"1"}'
    header = sign(body, SECRET)
    assert verify_signature(body, header, SECRET.encode())
    assert not verify_signature(body + b" ", header, SECRET)
    assert not verify_signature(body, header, "other-secret")
    assert not verify_signature(body, None, SECRET)
    assert not verify_signature(body, "sha256=" + "0" * 64, SECRET)


@pytest.mark.parametrize(("status", "retryable"), [(500, True), (429, True), (400, False)])
async def test_refused_delivery(
    receiver: _Receiver, client: httpx.AsyncClient, status: int, retryable: bool
) -> None:
    receiver.status = status
    with pytest.raises(WebhookDeliveryError) as caught:
        await WebhookSink(_url(receiver), SECRET, client).send(make_cloudevent("t", "s", id="e1"))
    assert caught.value.retryable is retryable
    assert f"HTTP {status}" in caught.value.message
    assert "'e1'" in caught.value.message


async def test_unreachable_webhook_is_retryable() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    sink = WebhookSink(f"http://127.0.0.1:{port}/", SECRET)
    try:
        with pytest.raises(WebhookDeliveryError) as caught:
            await sink.send(make_cloudevent("t", "s"))
    finally:
        await sink.aclose()
    assert caught.value.retryable
