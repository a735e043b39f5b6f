"""tideflow at scale: a burst of N runs (default 100,000 x 10-step chain = 1,000,000
``python`` no-op steps) and 200 runs of the 300-node DAG at once, on a cluster of real
`tideflow server` and `tideflow worker` processes (bench/cluster.py's), sampled while it
drains.

Isolation: for each bus the script starts its own broker (``redis-server`` without
persistence, or ``nats-server -js`` with a monitoring port) on free loopback ports in a
temporary directory, so the broker's memory is the bench's alone, and creates a scratch
PostgreSQL database ``tideflow_scale_<pid>_<bus>``; the cluster's schema is in it.
Processes, broker, data directory and database are removed at the end, also after an
error, SIGTERM or Ctrl-C.

For each bus, in order:

1. **W1 on the same cluster** (bench/cluster.py's W1: 1,000 runs x 10-step chain, after a
   warm-up of 50): the reference rate. RSS of every process is read after it ("after
   warm-up"), and the broker's memory ("idle").
2. **Burst**: ``--runs`` runs of the 10-step chain submitted by one client
   (``Client.connect(store, bus)``, one ``client.start`` per run, ``--concurrency``
   starts in flight): the way W1 submits, so the ratio compares like with like. A
   sampler task reads, every ``--sample-interval`` seconds, runs finished so far, the
   RSS of every server and worker (``/proc/<pid>/statm``), the broker's memory (Redis
   ``INFO memory`` used_memory; NATS JetStream bytes from ``/jsz`` and the nats-server's
   RSS) and the database's size (``pg_database_size``).
3. **DAG burst**: ``--dag-runs`` runs of bench/run.py's 300-node DAG (seed 42) at once.

Reported per bus: submit rate; drain seconds (first start -> the last run's
``finished_at``), steps/s and its ratio to W1's; run latency p50 of the first 1% of the
runs submitted; runs by status; dispatch latency p50/p99 (bench/cluster.py's definition,
from the histories read after the drain) in the first, middle and last third of the
drain; sweep repairs during the drain (``tideflow_sweep_repairs_total`` from every
server's ``/metrics``, before and after); RSS after warm-up vs after the drain per
process; broker memory idle / peak / after; database size; PostgreSQL statements slower
than 10 ms (see below); the DAG burst's dispatch p50/p99 over the first and the last 10%
of its dispatches (by start time).

PostgreSQL statement durations: ``pg_stat_statements`` needs ``shared_preload_libraries``
(not set on the development machine, and changing it means restarting a shared server),
so the script sets, on its scratch database only (``ALTER DATABASE … SET``, superuser),
``log_min_duration_statement`` = 10 ms (every slower statement is logged) and
``log_min_duration_sample`` = 0 with ``log_statement_sample_rate`` = ``--pg-sample``
(1% of all statements are logged), and reads the server's log (``--pg-log``) between the
drain's start and end: the count of statements >= 10 ms is exact, the p99 is estimated
from the sample (each sampled statement under 10 ms weighs 1/rate). Lines of other
databases are ignored (the log line prefix names the database); the bench's own reads
turn both settings off for their session.

Usage:
    python bench/scale.py                                   # 100,000 runs, Redis and NATS
    python bench/scale.py --runs 2000 --bus redis           # a quick check
    python bench/scale.py --runs 20000 --servers 2 --workers 4 --json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from cluster import (  # noqa: E402
    POSTGRES,
    TIDEFLOW,
    Cluster,
    Row,
    cluster,
    dispatches,
    execute_or_say,
    measure,
    quantile,
    run_interruptible,
)
from run import chain, random_dag  # noqa: E402

from tideflow.client import Client  # noqa: E402
from tideflow.model.plan import Plan  # noqa: E402
from tideflow.store.sqlbase import history_entry  # noqa: E402
from tideflow.testing.brokers import PrivateBroker, free_port  # noqa: E402

KINDS = ("redis", "nats")
PG_LOG = "/var/log/postgresql/postgresql-15-main.log"
SLOW_MS = 10.0
MIN_LOGGED = 100
"""Logged statements (sampled under 10 ms, and every slower one) a p99 is estimated from,
at least."""
MIB = 2**20
PAGE = os.sysconf("SC_PAGE_SIZE")
TERMINAL = ("succeeded", "failed", "cancelled", "timed_out")
QUIET = {"log_min_duration_statement": "-1", "log_min_duration_sample": "-1"}
"""The bench's own sessions: none of their statements in the log it reads."""


# -- isolation: a broker and a database of the bench's own --------------------------


@dataclass
class Broker(PrivateBroker):
    """A private broker set up like a benchmark's: Redis keeps nothing on disk (as the
    machine's shared one), NATS serves its monitoring endpoint (``/jsz``)."""

    monitor: int = field(default_factory=free_port)

    def command(self) -> list[str]:
        if self.kind == "redis":
            path = super().command()[0]
            return [
                *(path, "--port", str(self.port), "--bind", "127.0.0.1"),
                *("--appendonly", "no", "--save", "", "--dir", str(self.data)),
            ]
        return [*super().command(), "-m", str(self.monitor)]

    def jsz(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.monitor}/jsz", timeout=5) as r:
            data: dict[str, Any] = json.load(r)
            return data


def _database_url(base: str, name: str) -> str:
    return urlsplit(base)._replace(path=f"/{name}").geturl()


@contextlib.asynccontextmanager
async def scratch_database(base: str, name: str, sample_rate: float) -> AsyncIterator[str]:
    """A fresh database ``name`` beside ``base``'s, logging its slow statements and a
    sample of all; dropped on exit (``WITH (FORCE)``: even with sessions left)."""
    import asyncpg

    admin = await asyncpg.connect(base)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        for setting, value in (
            ("log_min_duration_statement", f"{SLOW_MS:g}"),
            ("log_min_duration_sample", "0"),
            ("log_statement_sample_rate", f"{sample_rate:g}"),
        ):
            await admin.execute(f'ALTER DATABASE "{name}" SET {setting} = {value}')
    finally:
        await admin.close()
    try:
        yield _database_url(base, name)
    finally:
        await execute_or_say(
            base, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)', f"could not drop {name}"
        )


class PgLog:
    """The PostgreSQL server's log, read from an offset: the ``duration:`` lines of one
    database's statements (``execute`` of a prepared statement, or a simple ``statement``;
    the parse and bind phases are not counted)."""

    LINE = re.compile(r"duration: ([0-9.]+) ms {2}(?:statement|execute [^:]*): ?(.*)")

    def __init__(self, path: str, database: str, sample_rate: float) -> None:
        self.path, self.database, self.rate = Path(path), database, sample_rate
        self.problem: str | None = None
        try:
            with self.path.open("rb"):
                pass
        except OSError as exc:
            self.problem = f"cannot read the PostgreSQL log {path}: {exc.strerror}"

    def offset(self) -> int:
        return 0 if self.problem else self.path.stat().st_size

    def report(self, start: int) -> dict[str, Any]:
        """What was logged for the database since ``start``."""
        method = (
            f"log_min_duration_statement={SLOW_MS:g}ms (every slower statement) + "
            f"log_min_duration_sample=0 at log_statement_sample_rate={self.rate:g}, "
            f"read from {self.path}"
        )
        if self.problem:
            return {"method": method, "error": self.problem}
        tag = f"@{self.database} "
        logged: list[tuple[float, str]] = []  # (ms, the statement's first line of SQL)
        named = True  # the last statement's text is more than its leading comment
        with self.path.open("rb") as f:
            f.seek(start)
            for raw in f:
                line = raw.decode(errors="replace")
                if line.startswith("\t"):  # a multi-line statement goes on
                    text = line.strip()
                    if not named and text and not text.startswith("--"):
                        logged[-1], named = (logged[-1][0], text[:100]), True
                    continue
                found = self.LINE.search(line) if tag in line else None
                if found is None:
                    named = True  # another line: what goes on is not that statement's
                    continue
                text = found.group(2).strip()
                logged.append((float(found.group(1)), text[:100]))
                named = bool(text) and not text.startswith("--")
        fast = [ms for ms, _ in logged if ms < SLOW_MS]
        slow = [ms for ms, _ in logged if ms >= SLOW_MS]
        estimated = round(len(fast) / self.rate) + len(slow)
        p99 = self._p99(fast, slow)
        out: dict[str, Any] = {
            "method": method,
            "slow_count": len(slow),
            "sampled": len(fast),
            "statements_estimated": estimated,
            "slow_share": round(len(slow) / estimated, 5) if estimated else None,
            "p99_ms": p99,
            "p99_under_10ms": None if p99 is None else p99 < SLOW_MS,
        }
        if p99 is None:
            out["p99_note"] = (
                f"{len(fast) + len(slow)} statements logged: too few to estimate a p99 (at "
                f"least {MIN_LOGGED}; raise --pg-sample)"
            )
        by_text: dict[str, tuple[list[float], list[float]]] = {}
        for ms, text in logged:
            fast_slow = by_text.setdefault(text, ([], []))
            fast_slow[ms >= SLOW_MS].append(ms)
        out["slowest"] = [
            {
                "statement": text,
                "count": len(slow_ms),
                "max_ms": round(max(slow_ms), 1),
                "estimated": round(len(fast_ms) / self.rate) + len(slow_ms),
                "p99_ms": self._p99(fast_ms, slow_ms),
            }
            for text, (fast_ms, slow_ms) in sorted(by_text.items(), key=lambda kv: -len(kv[1][1]))
            if slow_ms
        ][:5]
        return out

    def _p99(self, fast: Sequence[float], slow: Sequence[float]) -> float | None:
        """The p99 of statements whose sample under 10 ms is ``fast`` (each standing for
        1/rate of them) and whose every one over it is ``slow``; None from too few."""
        if len(fast) + len(slow) < MIN_LOGGED:
            return None
        weight = 1 / self.rate
        rank = 0.99 * (len(fast) * weight + len(slow))
        if fast and rank <= len(fast) * weight:
            return round(sorted(fast)[min(len(fast) - 1, int(rank / weight))], 2)
        return round(sorted(slow)[min(len(slow) - 1, int(rank - len(fast) * weight))], 2)


# -- reading the cluster -----------------------------------------------------------


def rss_mib(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return round(int(f.read().split()[1]) * PAGE / MIB, 1)
    except (OSError, IndexError, ValueError):
        return None


def _procs(running: Cluster) -> dict[str, int]:
    """``server-0``, ``worker-1``, … -> pid."""
    counts: dict[str, int] = {}
    out: dict[str, int] = {}
    for proc in running.procs:
        index = counts.get(proc.name, 0)
        counts[proc.name] = index + 1
        out[f"{proc.name}-{index}"] = proc.pid
    return out


class Sides:
    """The bench's view of one cluster: its database, broker and servers' metrics."""

    def __init__(
        self, running: Cluster, broker: Broker, db: Any, token: str, http: Sequence[int]
    ) -> None:
        self.running, self.broker, self.db, self.token, self.http = (
            running,
            broker,
            db,
            token,
            http,
        )
        self.redis: Any = None
        if broker.kind == "redis":
            import redis.asyncio as aioredis

            self.redis = aioredis.from_url(broker.url)

    async def close(self) -> None:
        if self.redis is not None:
            await self.redis.aclose()

    async def broker_memory(self) -> dict[str, float]:
        """Redis: used_memory; NATS: JetStream bytes (memory + storage) and its RSS."""
        if self.redis is not None:
            info = await self.redis.info("memory")
            return {"used_memory_mib": round(int(info["used_memory"]) / MIB, 2)}
        jsz = await asyncio.to_thread(self.broker.jsz)
        assert self.broker.process is not None
        return {
            "jetstream_mib": round((int(jsz["memory"]) + int(jsz["storage"])) / MIB, 2),
            "rss_mib": rss_mib(self.broker.process.pid) or 0.0,
        }

    async def database_mib(self) -> float:
        size = await self.db.fetchval("SELECT pg_database_size(current_database())")
        return round(int(size) / MIB, 1)

    def rss(self) -> dict[str, float | None]:
        return {name: rss_mib(pid) for name, pid in _procs(self.running).items()}

    async def sweep_repairs(self) -> dict[str, float]:
        """``tideflow_sweep_repairs_total`` by kind, summed over the servers."""
        total: dict[str, float] = {}
        for port in self.http:
            text = await asyncio.to_thread(self._metrics, port)
            for kind, value in re.findall(
                r'^tideflow_sweep_repairs_total\{kind="([^"]+)"\} ([0-9.e+]+)$', text, re.M
            ):
                total[kind] = total.get(kind, 0.0) + float(value)
        return total

    def _metrics(self, port: int) -> str:
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/metrics", headers={"Authorization": f"Bearer {self.token}"}
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            text: str = response.read().decode()
            return text

    async def finished_since(self, since: float) -> int:
        count = await self.db.fetchval("SELECT count(*) FROM runs WHERE finished_at >= $1", since)
        return int(count)


@dataclass
class Sample:
    t: float
    """Seconds since the burst's first start."""
    finished: int
    rss_mib: dict[str, float | None]
    broker: dict[str, float]
    database_mib: float


async def sample_every(
    sides: Sides, t0: float, interval: float, out: list[Sample], stop: asyncio.Event
) -> None:
    """Append a sample every ``interval`` seconds until ``stop``."""
    while not stop.is_set():
        out.append(
            Sample(
                t=round(time.time() - t0, 2),
                finished=await sides.finished_since(t0),
                rss_mib=sides.rss(),
                broker=await sides.broker_memory(),
                database_mib=await sides.database_mib(),
            )
        )
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(interval):
                await stop.wait()


# -- submitting and reading runs -----------------------------------------------------


async def submit(client: Client, plan: Plan, count: int, concurrency: int) -> list[str]:
    """Start ``count`` runs of ``plan``, ``concurrency`` starts in flight; their ids in
    the order they were submitted."""
    ids = [""] * count
    following = iter(range(count))

    async def starter() -> None:
        for index in following:
            ids[index] = await client.start(plan)

    await asyncio.gather(*(starter() for _ in range(min(concurrency, count))))
    return ids


async def wait_finished(sides: Sides, since: float, count: int, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while (done := await sides.finished_since(since)) < count:
        for proc in sides.running.procs:
            if proc.popen.poll() is not None:
                raise RuntimeError(f"{proc.name} (pid {proc.pid}) exited {proc.popen.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: {count - done} runs had not ended after {timeout:g}s")
        await asyncio.sleep(0.5)


CHUNK = 2000


async def run_rows(db: Any, ids: Sequence[str]) -> list[tuple[str, str, float, float | None]]:
    """(run_id, status, created_at, finished_at) of each run, in ``ids``' order."""
    rows: dict[str, tuple[str, str, float, float | None]] = {}
    for i in range(0, len(ids), CHUNK):
        for r in await db.fetch(
            "SELECT run_id, status, created_at, finished_at FROM runs WHERE run_id = ANY($1)",
            list(ids[i : i + CHUNK]),
        ):
            rows[r[0]] = (r[0], r[1], float(r[2]), None if r[3] is None else float(r[3]))
    return [rows[run_id] for run_id in ids if run_id in rows]


async def all_dispatches(db: Any, plan: Plan, ids: Sequence[str]) -> list[tuple[float, float]]:
    """(start time, dispatch seconds) of every step with upstream steps of the runs."""
    out: list[tuple[float, float]] = []
    for i in range(0, len(ids), CHUNK):
        by_run: dict[str, list[Any]] = {}
        for r in await db.fetch(
            "SELECT run_id, seq, time, kind, data FROM history WHERE run_id = ANY($1) "
            "AND kind IN ('task_started', 'task_completed') ORDER BY run_id, seq",
            list(ids[i : i + CHUNK]),
        ):
            by_run.setdefault(r[0], []).append(history_entry(r[0], (r[1], r[2], r[3], r[4], "[]")))
        for history in by_run.values():
            out += dispatches(plan, history)
    return out


def latency_ms(values: Sequence[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0, "p50_ms": None, "p99_ms": None}
    return {
        "n": len(values),
        "p50_ms": round(quantile(values, 50) * 1e3, 2),
        "p99_ms": round(quantile(values, 99) * 1e3, 2),
    }


def by_status(rows: Sequence[tuple[str, str, float, float | None]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for _, status, _, _ in rows:
        counts[status] = counts.get(status, 0) + 1
    return counts


# -- one bus -----------------------------------------------------------------------


async def one_bus(kind: str, args: argparse.Namespace) -> dict[str, Any]:
    name = f"tideflow_scale_{os.getpid()}_{kind}"
    async with contextlib.AsyncExitStack() as stack:
        store_db = await stack.enter_async_context(
            scratch_database(args.postgres, name, args.pg_sample)
        )
        data = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tideflow-scale-")))
        broker = Broker(kind, data / kind)
        stack.enter_context(broker)
        http = [free_port() for _ in range(args.servers)]
        prefetch = args.prefetch or 2 * args.worker_concurrency
        running = await stack.enter_async_context(
            cluster(
                kind,
                workers=args.workers,
                concurrency=args.worker_concurrency,
                prefetch=prefetch,
                keep_logs=args.keep_logs,
                servers=[["--http", f"127.0.0.1:{port}"] for port in http],
                postgres=store_db,
                broker=broker.url,
            )
        )
        if args.keep_logs:
            print(f"logs in {running.tmp}", file=sys.stderr)
        token = _viewer_token(running)
        import asyncpg

        db = await asyncpg.create_pool(  # the sampler's and the bench's reads at once
            running.store.split("?")[0],
            min_size=1,
            max_size=2,
            server_settings={**QUIET, "search_path": f'"{running.schema}"'},
        )
        stack.push_async_callback(db.close)
        sides = Sides(running, broker, db, token, http)
        stack.push_async_callback(sides.close)
        client = await stack.enter_async_context(
            Client.connect(store=running.store, bus=running.bus)
        )
        return await _measure_bus(
            kind, args, sides, client, PgLog(args.pg_log, name, args.pg_sample)
        )
    raise AssertionError("unreachable")  # pragma: no cover  (the stack does not swallow)


def _viewer_token(running: Cluster) -> str:
    done = subprocess.run(
        [TIDEFLOW, "tokens", "create", "--name", "scale-bench", "--role", "viewer", "--json"],
        env={**os.environ, "TIDEFLOW_STORE": running.store},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"tideflow tokens create failed: {done.stderr[-2000:]}")
    token: str = json.loads(done.stdout)["token"]
    return token


async def _measure_bus(
    kind: str, args: argparse.Namespace, sides: Sides, client: Client, pglog: PgLog
) -> dict[str, Any]:
    report: dict[str, Any] = {
        "bus": kind,
        "servers": args.servers,
        "workers": args.workers,
        "worker_concurrency": args.worker_concurrency,
        "client": "Client.connect (one client.start per run)",
        "concurrency": args.concurrency,
        "server_settings": {
            name: os.environ[name] for name in SERVER_SETTINGS if os.environ.get(name)
        },
    }
    # 1. W1 on this cluster: the reference, and the warm-up
    if args.w1_warmup:
        await measure(client, "W1", kind, args.w1_warmup)
    w1: Row = await measure(client, "W1", kind, args.w1_runs)
    report["w1"] = asdict(w1)
    await asyncio.sleep(args.settle)
    warm_rss = sides.rss()
    idle_broker = await sides.broker_memory()
    db_before = await sides.database_mib()
    repairs_before = await sides.sweep_repairs()

    # 2. the burst
    plan = chain(10, "python")
    await client.register(plan)
    samples: list[Sample] = []
    stop = asyncio.Event()
    log_start = pglog.offset()
    t0 = time.time()
    sampler = asyncio.create_task(sample_every(sides, t0, args.sample_interval, samples, stop))
    try:
        ids = await submit(client, plan, args.runs, args.concurrency)
        submitted = time.time() - t0
        await wait_finished(sides, t0, args.runs, args.timeout, "the burst")
    finally:
        stop.set()
        await sampler
    log_end_report = pglog.report(log_start)
    rows = await run_rows(sides.db, ids)
    statuses = by_status(rows)
    ends = [f for _, _, _, f in rows if f is not None]
    drain = max(ends) - t0
    steps = len(plan.specs) * args.runs
    first = rows[: max(1, len(rows) // 100)]
    first_latency = [f - c for _, _, c, f in first if f is not None]
    latencies = [f - c for _, _, c, f in rows if f is not None]
    windows: dict[str, Any] = {}
    found = await all_dispatches(sides.db, plan, ids)
    third = drain / 3
    for label, lo, hi in (
        ("first_third", 0.0, third),
        ("middle_third", third, 2 * third),
        ("last_third", 2 * third, float("inf")),
    ):
        windows[label] = latency_ms([d for s, d in found if lo <= s - t0 < hi])
    report["burst"] = {
        "runs": args.runs,
        "steps": steps,
        "submit_seconds": round(submitted, 2),
        "submit_runs_per_s": round(args.runs / submitted),
        "drain_seconds": round(drain, 2),
        "steps_per_s": round(steps / drain),
        "ratio_to_w1": round(steps / drain / w1.steps_per_s, 3),
        "first_1pct_runs": len(first),
        "first_1pct_run_p50_s": round(quantile(first_latency, 50), 2) if first_latency else None,
        "run_p50_s": round(quantile(latencies, 50), 2) if latencies else None,
        "run_p99_s": round(quantile(latencies, 99), 2) if latencies else None,
        "statuses": statuses,
        "all_succeeded": statuses.get("succeeded", 0) == args.runs,
        "dispatch": windows,
    }
    # the state the drain left: after --settle seconds
    await asyncio.sleep(args.settle)
    repairs_after = await sides.sweep_repairs()
    report["sweep_repairs"] = {
        kind_: int(repairs_after.get(kind_, 0) - repairs_before.get(kind_, 0))
        for kind_ in sorted(set(repairs_before) | set(repairs_after))
    }
    drained_rss = sides.rss()
    report["rss"] = [
        {
            "process": proc,
            "after_warmup_mib": warm_rss.get(proc),
            "peak_mib": max((s.rss_mib.get(proc) or 0.0 for s in samples), default=None),
            "after_drain_mib": drained_rss.get(proc),
            "within_20pct": _within(warm_rss.get(proc), drained_rss.get(proc), 1.2),
        }
        for proc in drained_rss
    ]
    after_broker = await sides.broker_memory()
    report["broker"] = {
        measure_: {
            "idle": idle_broker[measure_],
            "peak": max(s.broker[measure_] for s in samples),
            "after": after_broker[measure_],
            "after_under_2x_idle": after_broker[measure_] <= 2 * idle_broker[measure_],
        }
        for measure_ in idle_broker
    }
    db_after = await sides.database_mib()
    report["database"] = {
        "before_mib": db_before,
        "after_mib": db_after,
        "bytes_per_step": round((db_after - db_before) * MIB / steps),
    }
    report["pg_statements"] = log_end_report

    # 3. the DAG burst
    if args.dag_runs:
        report["dag"] = await _dag_burst(args, sides, client)
    report["samples"] = [asdict(s) for s in samples]
    return report


def _within(before: float | None, after: float | None, factor: float) -> bool | None:
    if not before or after is None:
        return None
    return after <= before * factor


async def _dag_burst(args: argparse.Namespace, sides: Sides, client: Client) -> dict[str, Any]:
    plan = random_dag(300, "python")
    await client.register(plan)
    t0 = time.time()
    ids = await submit(client, plan, args.dag_runs, args.concurrency)
    await wait_finished(sides, t0, args.dag_runs, args.timeout, "the DAG burst")
    rows = await run_rows(sides.db, ids)
    statuses = by_status(rows)
    seconds = max(f for _, _, _, f in rows if f is not None) - t0
    found = sorted(await all_dispatches(sides.db, plan, ids))
    tenth = max(1, len(found) // 10)
    steps = len(plan.specs) * args.dag_runs
    return {
        "runs": args.dag_runs,
        "steps": steps,
        "seconds": round(seconds, 2),
        "steps_per_s": round(steps / seconds),
        "statuses": statuses,
        "all_succeeded": statuses.get("succeeded", 0) == args.dag_runs,
        "dispatch_first_10pct": latency_ms([d for _, d in found[:tenth]]),
        "dispatch_last_10pct": latency_ms([d for _, d in found[-tenth:]]),
        "dispatch_all": latency_ms([d for _, d in found]),
    }


# -- the report ----------------------------------------------------------------------


def _ms(window: dict[str, Any]) -> str:
    if not window["n"]:
        return "-"
    return f"p50 {window['p50_ms']} / p99 {window['p99_ms']} ms (n={window['n']})"


SERVER_SETTINGS = (
    "TIDEFLOW_MAX_ACTIVE_RUNS",
    "TIDEFLOW_MAX_TASKS_IN_FLIGHT",
    "TIDEFLOW_BATCH_SIZE",
)
"""Variables the servers read that change what is measured (they inherit the bench's
environment): the report names those set, e.g. the latency profile
``TIDEFLOW_MAX_TASKS_IN_FLIGHT=128 TIDEFLOW_BATCH_SIZE=128``."""


def show(report: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(report), flush=True)
        return
    b, w1 = report["burst"], report["w1"]
    lines = [
        f"== {report['bus']}: {report['servers']} server(s), {report['workers']} worker(s) "
        f"(--concurrency {report['worker_concurrency']}), client {report['client']}, "
        f"{report['concurrency']} starts in flight; server settings "
        + (" ".join(f"{k}={v}" for k, v in report["server_settings"].items()) or "the defaults"),
        f"W1 (same cluster)    {w1['steps_per_s']} steps/s ({w1['steps']} steps in "
        f"{w1['seconds']} s), dispatch p50 {w1['dispatch_p50_ms']} / p99 "
        f"{w1['dispatch_p99_ms']} ms",
        f"submit               {b['runs']} runs in {b['submit_seconds']} s "
        f"({b['submit_runs_per_s']} runs/s)",
        f"drain                {b['steps']} steps in {b['drain_seconds']} s: "
        f"{b['steps_per_s']} steps/s = {b['ratio_to_w1']:.2f} x W1",
        f"first 1% of runs     run latency p50 {b['first_1pct_run_p50_s']} s "
        f"({b['first_1pct_runs']} runs); all runs p50 {b['run_p50_s']} s / p99 {b['run_p99_s']} s",
        f"runs by status       {b['statuses']} (every run succeeded: {b['all_succeeded']})",
    ]
    for label, window in b["dispatch"].items():
        lines.append(f"dispatch {label:<12} {_ms(window)}")
    lines.append(f"sweep repairs        {report['sweep_repairs']} (during the drain)")
    for p in report["rss"]:
        lines.append(
            f"RSS {p['process']:<16} after warm-up {p['after_warmup_mib']} MiB, peak "
            f"{p['peak_mib']}, after drain {p['after_drain_mib']} MiB "
            f"(within 20%: {p['within_20pct']})"
        )
    for what, m in report["broker"].items():
        lines.append(
            f"broker {what:<14} idle {m['idle']}, peak {m['peak']}, after {m['after']} "
            f"(after < 2x idle: {m['after_under_2x_idle']})"
        )
    d = report["database"]
    lines.append(
        f"database             {d['before_mib']} -> {d['after_mib']} MiB "
        f"({d['bytes_per_step']} bytes/step)"
    )
    pg = report["pg_statements"]
    if "error" in pg:
        lines.append(f"PG statements        not measured: {pg['error']}")
    else:
        p99 = (
            f"p99 {pg['p99_ms']} ms (under 10 ms: {pg['p99_under_10ms']})"
            if pg["p99_ms"] is not None
            else pg["p99_note"]
        )
        lines.append(
            f"PG statements        {pg['slow_count']} >= {SLOW_MS:g} ms of "
            f"~{pg['statements_estimated']}; {p99}"
        )
        for slow in pg["slowest"][:3]:
            lines.append(
                f"    {slow['count']} of ~{slow['estimated']} >= {SLOW_MS:g} ms (max "
                f"{slow['max_ms']} ms, p99 {slow['p99_ms']}): {slow['statement'][:60]}"
            )
    if "dag" in report:
        g = report["dag"]
        lines += [
            f"DAG burst            {g['runs']} x 300 nodes: {g['steps']} steps in "
            f"{g['seconds']} s ({g['steps_per_s']} steps/s); {g['statuses']}",
            f"DAG dispatch first10% {_ms(g['dispatch_first_10pct'])}",
            f"DAG dispatch last10%  {_ms(g['dispatch_last_10pct'])}",
        ]
    step = max(1, len(report["samples"]) // 12)
    lines.append("samples (t s: finished, RSS MiB, broker, database MiB):")
    for s in report["samples"][::step]:
        rss = " ".join(f"{k}={v}" for k, v in s["rss_mib"].items())
        lines.append(
            f"  {s['t']:>8}: {s['finished']:>7} runs  {rss}  {s['broker']}  {s['database_mib']}"
        )
    print("\n".join(lines), flush=True)


async def bench(args: argparse.Namespace) -> int:
    for kind in args.bus:
        show(await one_bus(kind, args), args.json)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--bus", choices=[*KINDS, "both"], default="both", help="default: both, one after the other"
    )
    parser.add_argument("--runs", type=int, default=100_000, help="burst runs (default 100,000)")
    parser.add_argument(
        "--dag-runs", type=int, default=200, help="300-node DAG runs at once (default 200; 0: none)"
    )
    parser.add_argument("--servers", type=int, choices=(1, 2), default=1)
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument(
        "--worker-concurrency", type=int, default=32, help="each worker's --concurrency (32)"
    )
    parser.add_argument("--prefetch", type=int, default=None, help="each worker's --prefetch (2x)")
    parser.add_argument(
        "--concurrency", type=int, default=64, help="the client's starts in flight (default 64)"
    )
    parser.add_argument("--w1-runs", type=int, default=None, help="W1's runs (default its 1,000)")
    parser.add_argument("--w1-warmup", type=int, default=50, help="W1 warm-up runs (default 50)")
    parser.add_argument(
        "--sample-interval", type=float, default=1.5, help="seconds between samples (1.5)"
    )
    parser.add_argument(
        "--settle", type=float, default=5.0, help="seconds before reading a state after (5)"
    )
    parser.add_argument(
        "--timeout", type=float, default=7200.0, help="seconds a drain may take (default 7200)"
    )
    parser.add_argument("--postgres", default=POSTGRES, help="PostgreSQL to create the db in")
    parser.add_argument("--pg-log", default=PG_LOG, help=f"PostgreSQL's log (default {PG_LOG})")
    parser.add_argument(
        "--pg-sample", type=float, default=0.01, help="share of statements logged (0.01)"
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per bus")
    parser.add_argument("--keep-logs", action="store_true", help="keep the processes' logs")
    args = parser.parse_args(argv)
    args.bus = list(KINDS) if args.bus == "both" else [args.bus]
    if min(args.runs, args.workers, args.worker_concurrency, args.concurrency) < 1:
        parser.error("--runs, --workers, --worker-concurrency and --concurrency must be >= 1")
    if args.dag_runs < 0 or args.w1_warmup < 0 or (args.w1_runs is not None and args.w1_runs < 1):
        parser.error("--dag-runs and --w1-warmup must be 0 or more, --w1-runs at least 1")
    if not 0 < args.pg_sample <= 1 or args.sample_interval <= 0 or args.settle < 0:
        parser.error("--pg-sample must be in (0, 1], --sample-interval > 0, --settle >= 0")
    return run_interruptible(
        bench(args), "interrupted: processes, broker, data and database removed"
    )


if __name__ == "__main__":
    sys.exit(main())
