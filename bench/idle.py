"""What an idle cluster costs: 10,000 runs waiting on a signal and a 30-day timer.

A cluster (1 `tideflow server`, 1 `tideflow worker`) on PostgreSQL and Redis or NATS,
as bench/cluster.py starts it. A client (``Client.connect``, one ``client.start`` per
run) creates ``--runs`` runs of a definition whose steps wait for a signal (``go``)
and sleep 30 days; once the server has applied every start (all runs ``running``) and
``--settle`` seconds have passed, the client is closed and the cluster is left alone
for ``--idle`` seconds. Over that window the script reports:

- **SQL statements** the server sent, counted on the wire: the server's store URL
  points at a small TCP proxy (tideflow.testing.wire), in front of PostgreSQL, which
  reads the frontend protocol and counts every simple ``Query`` and every
  extended-protocol ``Execute`` (the statement text of its ``Parse``). No server setting
  is changed (pg_stat_statements is not preloaded on this machine; pg_stat_database
  counts the whole shared database). The worker has no store. Beside the count, what
  the server's two periodic tasks imply for the window: the lease heartbeat (every
  TTL / 5 s, ``HEARTBEAT_STATEMENTS`` statements: one renews the server's membership
  and every partition it holds, one reads the members) and the reconciliation sweep (``STATEMENTS_PER_ROUND`` statements every
  ``--sweep-interval`` s, passed to the server as ``TIDEFLOW_SWEEP_INTERVAL``); the
  statements are grouped by which of the two sent them, and anything else is "other".
- **Bus commands** of the server and the worker, counted the same way on a proxy in
  front of the broker: Redis commands (RESP arrays, by command name) or NATS client
  protocol operations (PUB/HPUB by subject shape, SUB, PING, …).
- **CPU seconds** of the server and the worker processes: utime + stime from
  /proc/<pid>/stat, before and after the window.

Usage:
    python bench/idle.py                       # Redis, 10,000 runs, 60 s idle
    python bench/idle.py --bus nats --idle 30 --runs 2000 --json
    python bench/idle.py --sweep-interval 5    # the sweep's cost, 12 rounds a minute
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from cluster import BUSES, POSTGRES, Cluster, cluster, run_interruptible  # noqa: E402

from tideflow.client import Client  # noqa: E402
from tideflow.dsl import compile_definition  # noqa: E402
from tideflow.runtime.lease import DEFAULT_TTL, TTL_ENV  # noqa: E402
from tideflow.runtime.schedule_timers import IDLE_STATEMENTS_PER_ROUND  # noqa: E402
from tideflow.runtime.sweep import INTERVAL_ENV, STATEMENTS_PER_ROUND  # noqa: E402

PER_ROUND = STATEMENTS_PER_ROUND + IDLE_STATEMENTS_PER_ROUND
"""A round of the reconciliation sweep and one of the schedules' on a store with none."""
from tideflow.testing.wire import Counter, PgParser, Proxy, host_port, via  # noqa: E402

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


SWEEP_STATEMENTS = (
    "FROM timers WHERE fire_at",  # due timers
    "FROM outbox ORDER BY",  # unrelayed outbox rows
    "The admission queue from after",  # runs whose start was lost (Admitter.repair)
    "FROM schedules WHERE $1::text IS NULL",  # the schedules' round (runtime/schedule_timers.py)
)


HEARTBEAT_STATEMENTS = 2
"""A cluster server's lease heartbeat (runtime/partitions.py): one ``renew_leases`` and
one ``list_leases`` of the members."""


def _implied(by: dict[str, int], window: float, ttl: float, interval: float) -> dict[str, Any]:
    """The statements of the window by who sent them, against what the lease renewal
    (every ttl / 5 s) and the sweep (``PER_ROUND`` every ``interval`` s, with the schedules' round)
    allow in it at most (a periodic task fits floor(window / period) + 1 times)."""
    lease = sum(n for text, n in by.items() if "engine_leases" in text)
    sweep = sum(n for text, n in by.items() if any(s in text for s in SWEEP_STATEMENTS))
    renewals = (math.floor(window / (ttl / 5)) + 1) * HEARTBEAT_STATEMENTS
    rounds = math.floor(window / interval) + 1 if interval > 0 else 0
    return {
        "lease": lease,
        "sweep": sweep,
        "other": sum(by.values()) - lease - sweep,
        "lease_at_most": renewals,
        "sweep_rounds_at_most": rounds,
        "sweep_at_most": rounds * PER_ROUND,
        "at_most": renewals + rounds * PER_ROUND,
        "sweep_interval": interval,
        "lease_ttl": ttl,
    }


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    os.environ[INTERVAL_ENV] = repr(args.sweep_interval)  # the server's, through its env
    ttl = float(os.environ.get(TTL_ENV) or DEFAULT_TTL)
    pg = Proxy(host_port(POSTGRES, 5432), PgParser)
    broker = BUSES[args.bus]
    bus = Proxy(
        host_port(broker, 6379 if args.bus == "redis" else 4222),
        RespParser if args.bus == "redis" else NatsParser,
    )
    async with pg.running(), bus.running():
        server_store = via(POSTGRES, pg.port) + "?schema={schema}"
        async with cluster(
            args.bus,
            workers=1,
            concurrency=8,
            prefetch=8,
            server_store=server_store,
            bus_base=via(broker, bus.port),
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
    sql = _delta(sql0, sql1)
    return {
        "bus": args.bus,
        "runs": args.runs,
        "fill_seconds": round(fill_s, 1),
        "idle_seconds": round(window, 1),
        "sql_statements": sql,
        "sql_implied": _implied(sql["by"], window, ttl, args.sweep_interval),
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
        print(f"      {n:>6}  {text[:90]}")
    implied = result["sql_implied"]
    verdict = "within" if sql["total"] <= implied["at_most"] else "ABOVE"
    print(
        f"    {verdict} what the rates imply, at most {implied['at_most']}: lease heartbeat "
        f"{implied['lease']} (<= {implied['lease_at_most']}, every {implied['lease_ttl'] / 5:g} s)"
        f" + sweep {implied['sweep']} (<= {implied['sweep_rounds_at_most']} rounds x "
        f"{PER_ROUND}, every {implied['sweep_interval']:g} s) + other "
        f"{implied['other']}"
    )
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
    parser.add_argument(
        "--sweep-interval",
        type=float,
        default=30.0,
        help="the server's TIDEFLOW_SWEEP_INTERVAL, seconds (30; 0: no sweep)",
    )
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.idle <= 0 or args.repeat < 1:
        parser.error("--runs and --repeat must be at least 1, --idle positive")
    if not (math.isfinite(args.sweep_interval) and args.sweep_interval >= 0):
        parser.error("--sweep-interval must be 0 (no sweep) or a number of seconds")
    return run_interruptible(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
