"""A real HTTP server on 127.0.0.1 (stdlib, one thread per connection) for executor tests."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import orjson
import pytest

from tideflow.worker.executors.base import StepContext


@dataclass
class ServerState:
    stop: threading.Event = field(default_factory=threading.Event)
    requests: list[dict[str, Any]] = field(default_factory=list)
    hits: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


class _Server(ThreadingHTTPServer):
    daemon_threads = False
    block_on_close = True
    state: ServerState

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # clients that give up (timeouts, size limits) break pipes on purpose


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 10  # idle keep-alive connections end even if a client forgets them
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_PUT(self) -> None:
        self._dispatch()

    def _dispatch(self) -> None:
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else b""
        state = self.server.state
        with state.lock:
            state.requests.append(
                {
                    "method": self.command,
                    "path": url.path,
                    "query": query,
                    "headers": {k.lower(): v for k, v in self.headers.items()},
                    "body": body,
                }
            )
            state.hits[url.path] = state.hits.get(url.path, 0) + 1
            hits = state.hits[url.path]
        route = url.path.strip("/").split("/")
        getattr(self, f"route_{route[0]}")(route[1:], query, body, hits)

    def _send(self, status: int, body: bytes, ctype: str = "text/plain", **headers: str) -> None:
        self.send_response(status)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(body)))
        for key, value in headers.items():
            self.send_header(key.replace("_", "-"), value)
        self.end_headers()
        self.wfile.write(body)

    def route_json(self, args: list[str], query: dict[str, str], body: bytes, hits: int) -> None:
        self._send(200, b'{"ok": true, "items": [1, 2]}', "application/json; charset=utf-8")

    def route_malformed(
        self, args: list[str], query: dict[str, str], body: bytes, hits: int
    ) -> None:
        self._send(200, b'{"ok": tru', "application/json")

    def route_status(self, args: list[str], query: dict[str, str], body: bytes, hits: int) -> None:
        extra = {"retry_after": query["retry_after"]} if "retry_after" in query else {}
        text = query.get("body", f"status {args[0]} body").encode()
        self._send(int(args[0]), text, **extra)

    def route_echo(self, args: list[str], query: dict[str, str], body: bytes, hits: int) -> None:
        request = self.server.state.requests[-1]
        echo = {**request, "body": body.decode()}
        self._send(200, orjson.dumps(echo), "application/json")

    def route_flaky(self, args: list[str], query: dict[str, str], body: bytes, hits: int) -> None:
        if hits == 1:
            self._send(503, b"try again")
        else:
            self._send(200, b'{"done": true}', "application/json")

    def route_cookie(self, args: list[str], query: dict[str, str], body: bytes, hits: int) -> None:
        self._send(200, b"set", set_cookie="session=abc123; Path=/")

    def route_slow(self, args: list[str], query: dict[str, str], body: bytes, hits: int) -> None:
        self.server.state.stop.wait(float(query.get("delay", "10")))
        self._send(200, b"late")

    def route_hang(self, args: list[str], query: dict[str, str], body: bytes, hits: int) -> None:
        self.server.state.stop.wait(30)  # reads the request, never answers
        self.close_connection = True

    def route_drip(self, args: list[str], query: dict[str, str], body: bytes, hits: int) -> None:
        self.send_response(200)
        self.send_header("content-length", "1000")
        self.end_headers()
        for _ in range(1000):
            if self.server.state.stop.wait(0.05):
                break
            self.wfile.write(b"x")
            self.wfile.flush()
        self.close_connection = True

    def route_bytes(self, args: list[str], query: dict[str, str], body: bytes, hits: int) -> None:
        size = int(args[0])
        chunk = b"a" * 65536
        self.send_response(200)
        self.send_header("content-type", "application/octet-stream")
        chunked = query.get("chunked") == "1"
        if chunked:
            self.send_header("transfer-encoding", "chunked")
        else:
            self.send_header("content-length", str(size))
        self.end_headers()
        sent = 0
        while sent < size:
            piece = chunk[: min(len(chunk), size - sent)]
            self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
            sent += len(piece)
        if chunked:
            self.wfile.write(b"0\r\n\r\n")


@dataclass
class LocalServer:
    url: str
    state: ServerState


@pytest.fixture
def http_server() -> Iterator[LocalServer]:
    server = _Server(("127.0.0.1", 0), _Handler)
    server.state = ServerState()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    port = server.server_address[1]
    try:
        yield LocalServer(url=f"http://127.0.0.1:{port}", state=server.state)
    finally:
        server.state.stop.set()
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture
def silent_listener() -> Iterator[str]:
    """A TCP port that completes handshakes (kernel backlog) but never accepts or answers."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/"
    finally:
        sock.close()


@pytest.fixture
def closed_port_url() -> str:
    """A URL on a port where nothing listens (connection refused)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}/"


def make_ctx(attempt: int = 1, timeout: float | None = 5.0, key: str = "run-1:step") -> StepContext:
    run_id, _, step = key.partition(":")
    return StepContext(
        run_id=run_id,
        step_id=step,
        step_key=step,
        attempt=attempt,
        idempotency_key=key,
        timeout=timeout,
    )


def http_date(seconds_from_now: float) -> str:
    return formatdate(time.time() + seconds_from_now, usegmt=True)
