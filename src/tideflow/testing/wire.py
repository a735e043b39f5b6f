"""Count what a client sends a server, on the wire: a TCP proxy with a protocol parser.

For measurements that must not change the server (bench/idle.py, the sweep's cost test):
point the client's URL at ``Proxy.port`` and read ``Proxy.counter``. ``PgParser`` counts
PostgreSQL statements (every simple ``Query`` and every extended-protocol ``Execute``,
named by the text of the statement its ``Parse`` prepared); other parsers (bench/idle.py
has Redis and NATS ones) only need ``feed``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import re
import struct
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import urlsplit


class Counter:
    """Counts the messages a client sends, by what they are."""

    def __init__(self) -> None:
        self.total = 0
        self.by: collections.Counter[str] = collections.Counter()

    def count(self, what: str) -> None:
        self.total += 1
        self.by[what] += 1

    def snapshot(self) -> tuple[int, collections.Counter[str]]:
        return self.total, collections.Counter(self.by)


class Parser(Protocol):
    def feed(self, data: bytes) -> None: ...


class PgParser:
    """PostgreSQL frontend messages: a simple Query, or Parse/Bind/Execute."""

    def __init__(self, counter: Counter) -> None:
        self.counter = counter
        self.buf = b""
        self.startup = True
        self.statements: dict[bytes, str] = {}
        self.bound = ""

    def feed(self, data: bytes) -> None:
        self.buf += data
        while True:
            if self.startup:
                if len(self.buf) < 8:
                    return
                (length, code) = struct.unpack("!ii", self.buf[:8])
                if len(self.buf) < length:
                    return
                self.buf = self.buf[length:]
                if code not in (80877103, 80877104):  # SSLRequest / GSSENCRequest
                    self.startup = False
                continue
            if len(self.buf) < 5:
                return
            kind = self.buf[:1]
            (length,) = struct.unpack("!i", self.buf[1:5])
            if len(self.buf) < 1 + length:
                return
            body, self.buf = self.buf[5 : 1 + length], self.buf[1 + length :]
            if kind == b"Q":
                self.counter.count(sql_text(body.split(b"\0", 1)[0]))
            elif kind == b"P":
                name, rest = body.split(b"\0", 1)
                self.statements[name] = sql_text(rest.split(b"\0", 1)[0])
            elif kind == b"B":
                _portal, rest = body.split(b"\0", 1)
                self.bound = self.statements.get(rest.split(b"\0", 1)[0], "?")
            elif kind == b"E":
                self.counter.count(self.bound)


def sql_text(text: bytes) -> str:
    """A statement's text on one line."""
    return re.sub(r"\s+", " ", text.decode(errors="replace")).strip()


@dataclass
class Proxy:
    """A TCP proxy to ``upstream`` that feeds what clients send to a parser."""

    upstream: tuple[str, int]
    parser: Callable[[Counter], Parser]
    counter: Counter = field(default_factory=Counter)
    port: int = 0

    async def _pipe(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        feed: Callable[[bytes], None] | None,
    ) -> None:
        try:
            while data := await reader.read(65536):
                if feed is not None:
                    feed(data)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.close()
            return
        parser = self.parser(self.counter)
        with contextlib.suppress(asyncio.CancelledError):  # the proxy closing at the end
            await asyncio.gather(
                self._pipe(reader, up_writer, parser.feed), self._pipe(up_reader, writer, None)
            )

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Proxy]:
        server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        try:
            yield self
        finally:
            server.close()


def host_port(url: str, default: int) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or default


def via(url: str, port: int) -> str:
    """``url`` with its host and port replaced by the proxy's on 127.0.0.1."""
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)
    where = f"127.0.0.1:{port}"
    return parts._replace(netloc=f"{netloc[0]}@{where}" if len(netloc) == 2 else where).geturl()


__all__ = ["Counter", "Parser", "PgParser", "Proxy", "host_port", "sql_text", "via"]
