"""What an idle cluster costs: 10,000 runs waiting on a signal and a 30-day timer.

A cluster (1 `tideflow server`, 1 `tideflow worker`) on PostgreSQL and Redis or NATS,
as bench/cluster.py starts it. A client (``Client.connect``, one ``client.start`` per
run) creates ``--runs`` runs of a definition whose steps wait for a signal (``go``)
and sleep 30 days; once the server has applied every start (all runs ``running``) and
``--settle`` seconds have passed, the client is closed and the cluster is left alone
for ``--idle`` seconds. Over that window the script reports:

- **SQL statements** the server sent, counted on the wire: the server's store URL
  points at a small TCP proxy in this script, in front of PostgreSQL, which reads the
  frontend protocol and counts every simple ``Query`` and every extended-protocol
  ``Execute`` (the statement text of its ``Parse``). No server setting is changed
  (pg_stat_statements is not preloaded on this machine; pg_stat_database counts the
  whole shared database). The worker has no store.
- **Bus commands** of the server and the worker, counted the same way on a proxy in
  front of the broker: Redis commands (RESP arrays, by command name) or NATS client
  protocol operations (PUB/HPUB by subject shape, SUB, PING, …).
- **CPU seconds** of the server and the worker processes: utime + stime from
  /proc/<pid>/stat, before and after the window.

Usage:
    python bench/idle.py                       # Redis, 10,000 runs, 60 s idle
    python bench/idle.py --bus nats --idle 30 --runs 2000 --json
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import re
import struct
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from cluster import BUSES, POSTGRES, Cluster, cluster, interruptible  # noqa: E402

from tideflow.client import Client  # noqa: E402
from tideflow.dsl import compile_definition  # noqa: E402

WAITING: dict[str, Any] = {
    "name": "idle-waiting",
    "version": "1",
    "steps": [
        {"id": "hold", "type": "wait", "signal": "go"},
        {"id": "nap", "type": "sleep", "duration": "30d"},
    ],
}
CLK_TCK = os.sysconf("SC_CLK_TCK")


# -- counting what crosses the wire --------------------------------------------------


class Counter:
    """Counts the messages a client sends (one parser per connection)."""

    def __init__(self) -> None:
        self.total = 0
        self.by: collections.Counter[str] = collections.Counter()

    def count(self, what: str) -> None:
        self.total += 1
        self.by[what] += 1

    def snapshot(self) -> tuple[int, collections.Counter[str]]:
        return self.total, collections.Counter(self.by)


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
                self.counter.count(_sql(body.split(b"\0", 1)[0]))
            elif kind == b"P":
                name, rest = body.split(b"\0", 1)
                self.statements[name] = _sql(rest.split(b"\0", 1)[0])
            elif kind == b"B":
                _portal, rest = body.split(b"\0", 1)
                self.bound = self.statements.get(rest.split(b"\0", 1)[0], "?")
            elif kind == b"E":
                self.counter.count(self.bound)


def _sql(text: bytes) -> str:
    return re.sub(r"\s+", " ", text.decode(errors="replace")).strip()[:90]


class RespParser:
    """Redis commands: RESP arrays of bulk strings, named by their first element."""

    def __init__(self, counter: Counter) -> None:
        self.counter = counter
        self.buf = b""

    def feed(self, data: bytes) -> None:
        self.buf += data
        while self.buf:
            parsed = self._one()
            if parsed is None:
                return
            name, used = parsed
            self.buf = self.buf[used:]
            self.counter.count(name)

    def _one(self) -> tuple[str, int] | None:
        end = self.buf.find(b"\r\n")
        if end < 0:
            return None
        if not self.buf.startswith(b"*"):  # an inline command
            return self.buf[:end].split(b" ", 1)[0].decode().upper(), end + 2
        items = int(self.buf[1:end])
        pos, name = end + 2, ""
        for i in range(items):
            end = self.buf.find(b"\r\n", pos)
            if end < 0:
                return None
            size = int(self.buf[pos + 1 : end])
            start = end + 2
            if len(self.buf) < start + size + 2:
                return None
            if i == 0:
                name = self.buf[start : start + size].decode(errors="replace").upper()
            pos = start + size + 2
        return name, pos


class NatsParser:
    """NATS client protocol operations; PUB/HPUB named by the shape of their subject."""

    def __init__(self, counter: Counter) -> None:
        self.counter = counter
        self.buf = b""

    def feed(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n")
            if end < 0:
                return
            words = self.buf[:end].decode(errors="replace").split()
            verb = words[0].upper() if words else ""
            used = end + 2
            if verb in ("PUB", "HPUB"):
                used += int(words[-1]) + 2
                if len(self.buf) < used:
                    return
                verb = f"{verb} {_subject(words[1])}"
            self.buf = self.buf[used:]
            self.counter.count(verb)


def _subject(subject: str) -> str:
    """``$JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer>`` -> ``$JS.API.CONSUMER.MSG.NEXT``,
    ``$JS.ACK.…`` -> ``$JS.ACK``, ``<prefix>.events.3`` -> ``*.events.*``."""
    parts = subject.split(".")
    if subject.startswith("$JS.API."):
        return ".".join(parts[:5] if parts[2] == "CONSUMER" else parts[:4])
    if subject.startswith("$JS.ACK"):
        return "$JS.ACK"
    if subject.startswith("$KV."):
        return "$KV." + parts[1].split("_")[-1]
    if subject.startswith("_INBOX"):
        return "_INBOX"
    return "*." + ".".join(parts[1:2]) + ".*"


@dataclass
class Proxy:
    """A TCP proxy to ``upstream`` that feeds what clients send to a parser."""

    upstream: tuple[str, int]
    parser: Callable[[Counter], Any]
    counter: Counter = field(default_factory=Counter)
    port: int = 0

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, feed: Any
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


def _host_port(url: str, default: int) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or default


def _via(url: str, port: int) -> str:
    """``url`` with its host and port replaced by the proxy's."""
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)
    where = f"127.0.0.1:{port}"
    return parts._replace(netloc=f"{netloc[0]}@{where}" if len(netloc) == 2 else where).geturl()


# -- CPU ----------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


# -- the measurement ------------------------------------------------------------------


async def _running_count(store: str, schema: str) -> int:
    import asyncpg

    conn = await asyncpg.connect(POSTGRES)
    try:
        return int(
            await conn.fetchval(
                f'SELECT count(*) FROM "{schema}".runs WHERE status = $1', "running"
            )
        )
    finally:
        await conn.close()


async def fill(running: Cluster, runs: int, timeout: float) -> float:
    """Start ``runs`` waiting runs through a client; seconds until all are running."""
    plan = compile_definition(WAITING)
    t0 = time.monotonic()
    async with Client.connect(store=running.store, bus=running.bus) as client:
        await client.register(plan)
        gate = asyncio.Semaphore(50)  # redis-py: at most 100 connections, then an error

        async def one() -> None:
            async with gate:
                await client.start(plan)

        await asyncio.gather(*(one() for _ in range(runs)))
    deadline = time.monotonic() + timeout
    while (count := await _running_count(running.store, running.schema)) < runs:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {count} of {runs} runs running after {timeout:g}s")
        await asyncio.sleep(0.5)
    return time.monotonic() - t0


def _delta(
    before: tuple[int, collections.Counter[str]], after: tuple[int, collections.Counter[str]]
) -> dict[str, Any]:
    by = after[1] - before[1]
    return {"total": after[0] - before[0], "by": dict(by.most_common())}


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    pg = Proxy(_host_port(POSTGRES, 5432), PgParser)
    broker = BUSES[args.bus]
    bus = Proxy(
        _host_port(broker, 6379 if args.bus == "redis" else 4222),
        RespParser if args.bus == "redis" else NatsParser,
    )
    async with pg.running(), bus.running():
        server_store = _via(POSTGRES, pg.port) + "?schema={schema}"
        async with cluster(
            args.bus,
            workers=1,
            concurrency=8,
            prefetch=8,
            server_store=server_store,
            bus_base=_via(broker, bus.port),
        ) as running:
            server, worker = running.procs[0], running.procs[1]
            fill_s = await fill(running, args.runs, args.fill_timeout)
            await asyncio.sleep(args.settle)
            sql0, bus0 = pg.counter.snapshot(), bus.counter.snapshot()
            cpu0 = cpu_seconds(server.pid), cpu_seconds(worker.pid)
            t0 = time.monotonic()
            await asyncio.sleep(args.idle)
            window = time.monotonic() - t0
            sql1, bus1 = pg.counter.snapshot(), bus.counter.snapshot()
            cpu1 = cpu_seconds(server.pid), cpu_seconds(worker.pid)
    return {
        "bus": args.bus,
        "runs": args.runs,
        "fill_seconds": round(fill_s, 1),
        "idle_seconds": round(window, 1),
        "sql_statements": _delta(sql0, sql1),
        "bus_commands": _delta(bus0, bus1),
        "cpu_seconds": {
            "server": round(cpu1[0] - cpu0[0], 2),
            "worker": round(cpu1[1] - cpu0[1], 2),
        },
    }


def show(result: dict[str, Any]) -> None:
    window = result["idle_seconds"]
    print(
        f"{result['runs']} runs waiting (signal + 30-day sleep), PostgreSQL + {result['bus']}; "
        f"filled in {result['fill_seconds']} s; idle window {window} s"
    )
    sql, bus, cpu = result["sql_statements"], result["bus_commands"], result["cpu_seconds"]
    print(f"  SQL statements from the server: {sql['total']} ({sql['total'] / window:.2f}/s)")
    for text, n in sql["by"].items():
        print(f"      {n:>6}  {text}")
    print(f"  bus commands (server + worker): {bus['total']} ({bus['total'] / window:.2f}/s)")
    for name, n in bus["by"].items():
        print(f"      {n:>6}  {name}")
    print(
        f"  CPU: server {cpu['server']} s ({100 * cpu['server'] / window:.2f}% of a core), "
        f"worker {cpu['worker']} s ({100 * cpu['worker'] / window:.2f}%)"
    )


async def main_async(args: argparse.Namespace) -> int:
    for _ in range(args.repeat):
        result = await measure(args)
        if args.json:
            print(json.dumps(result), flush=True)
        else:
            show(result)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bus", choices=sorted(BUSES), default="redis")
    parser.add_argument("--runs", type=int, default=10_000, help="waiting runs (10,000)")
    parser.add_argument("--idle", type=float, default=60.0, help="idle window, seconds (60)")
    parser.add_argument(
        "--settle", type=float, default=5.0, help="seconds after the fill before the window (5)"
    )
    parser.add_argument(
        "--fill-timeout", type=float, default=600.0, help="bound on creating the runs (600 s)"
    )
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.idle <= 0 or args.repeat < 1:
        parser.error("--runs and --repeat must be at least 1, --idle positive")
    try:
        return asyncio.run(interruptible(main_async(args)))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
