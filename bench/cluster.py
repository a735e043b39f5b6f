"""tideflow benchmark in cluster mode: real `tideflow server` and `tideflow worker`
processes on PostgreSQL and a real broker, ``python`` no-op steps (bench_steps:step).

One cluster per bus: a fresh PostgreSQL schema, a fresh bus prefix, 1 `tideflow server`
and ``--workers`` `tideflow worker` processes (``--path bench``). Runs are submitted the
way a client does, ``Client.connect(store, bus)`` and one ``client.start`` per run; the
script then reads the store until every run has ended. Everything it created (processes,
schema, Redis keys, NATS streams) is removed at the end, also after an error or Ctrl-C.

W1      1,000 runs x 10-step chain, all started together (throughput under load)
W1-50   500 runs x 10-step chain, 50 in flight (closed loop: the next run starts when one
        has ended, so the load is as high as 50 runs in flight make it)
W1-1k   300 runs x 10-step chain started at a fixed rate of 100 runs/s, 1,000 steps/s (open
        loop, moderate load: a third of the W1 target of 3,000 steps/s), whatever the
        cluster's speed: the dispatch latency at that load
W1-seq  100 runs x 10-step chain, one at a time (no load: per-run latency)
W2      one run: 1,000 parallel steps and a join
W3      one run: the 300-node random DAG of bench/run.py (seed 42)

Each row: steps, seconds (first start -> last run finished, the run's ``finished_at``
in the store), steps/s, us/step, run latency p50/p99 (run ``created_at`` -> ``finished_at``)
and **dispatch latency** p50/p99 over every step that has upstream steps:

    dispatch = downstream start - latest upstream completion

read from the run histories after the runs end. The upstream completion is
``TaskCompleted.time`` (the worker's clock when the step function returned); the
downstream start is the time the worker began the attempt: ``TaskStarted.time`` when
the start was reported on its own, else ``TaskCompleted.started_at`` (a quick step's
start travels folded into its outcome). So it covers: the worker publishing the
outcome, the bus, the server applying and committing it, publishing the next task, the
bus, and a worker taking it and starting it. Both times come from ``time.time()`` of
worker processes on this one machine. Root steps (no upstream) are not counted.

Usage:
    python bench/cluster.py                         # every workload, Redis and NATS
    python bench/cluster.py --bus redis --only W1 --repeat 5
    python bench/cluster.py --json --workers 2 --concurrency 32
PostgreSQL: $TIDEFLOW_BENCH_PG (default postgresql://root@127.0.0.1:5432/test);
Redis: $TIDEFLOW_BENCH_REDIS (redis://127.0.0.1:6379/0); NATS: $TIDEFLOW_BENCH_NATS
(nats://127.0.0.1:4222).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Coroutine, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from run import chain, fan, random_dag  # noqa: E402

from tideflow.client import Client  # noqa: E402
from tideflow.model.plan import Plan  # noqa: E402

TIDEFLOW = str(Path(sys.executable).with_name("tideflow"))
POSTGRES = os.environ.get("TIDEFLOW_BENCH_PG", "postgresql://root@127.0.0.1:5432/test")
BUSES = {
    "redis": os.environ.get("TIDEFLOW_BENCH_REDIS", "redis://127.0.0.1:6379/0"),
    "nats": os.environ.get("TIDEFLOW_BENCH_NATS", "nats://127.0.0.1:4222"),
}
READY_TIMEOUT = 60.0
RUN_TIMEOUT = 600.0
"""Seconds one measurement may take before the script gives up (a stuck cluster)."""


# -- the cluster ------------------------------------------------------------------


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    async def wait_log(self, needle: str, timeout: float = READY_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while needle not in self.text():
            if self.popen.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited {self.popen.returncode} before logging {needle!r}:\n"
                    f"{self.text()[-4000:]}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not log {needle!r} within {timeout:g}s")
            await asyncio.sleep(0.05)

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds."""
        if self.popen.poll() is not None:
            return
        self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(grace)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(10)


@dataclass
class Cluster:
    bus_kind: str
    store: str
    bus: str
    schema: str
    prefix: str
    tmp: Path
    postgres: str = POSTGRES
    """The PostgreSQL database the schema is in."""
    broker: str = ""
    """The broker's own URL (the bus URL without the prefix and any proxy): where the
    prefix is deleted from at the end."""
    procs: list[Proc] = field(default_factory=list)

    def spawn(self, name: str, args: list[str]) -> Proc:
        log = self.tmp / f"{name}-{len(self.procs)}.log"
        env = {**os.environ, "TIDEFLOW_STORE": self.store, "TIDEFLOW_BUS": self.bus}
        env.pop("TIDEFLOW_FAULT", None)
        with log.open("wb") as out:
            popen = subprocess.Popen(
                [TIDEFLOW, *args], env=env, stdout=out, stderr=subprocess.STDOUT, cwd=self.tmp
            )
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        return proc

    async def server(self, store: str | None = None, extra: Sequence[str] = ()) -> Proc:
        """A `tideflow server` (on ``store``, another URL of the same store, if given;
        ``extra``: more of its options, such as ``--http``)."""
        args = ["server"] + (["--store", store] if store else []) + list(extra)
        proc = self.spawn("server", args)
        await proc.wait_log("serving:")
        if "--http" in extra:
            await proc.wait_log("HTTP API listening on")
        return proc

    async def worker(self, concurrency: int, prefetch: int) -> Proc:
        proc = self.spawn(
            "worker",
            [
                "worker",
                "--path",
                str(HERE),
                "--concurrency",
                str(concurrency),
                "--prefetch",
                str(prefetch),
            ],
        )
        await proc.wait_log("taking tasks from")
        return proc

    def stop(self) -> None:
        for proc in reversed(self.procs):  # workers first, then the server
            proc.stop()


def _bus_url(kind: str, base: str, prefix: str) -> str:
    return f"{base}{'&' if '?' in base else '?'}prefix={prefix}"


async def execute_or_say(dsn: str, sql: str, failed: str) -> None:
    """``sql`` on a connection of its own; an error is said on stderr after ``failed``,
    not raised (a cleanup step: the next ones still run)."""
    import asyncpg

    try:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()
    except Exception as exc:
        print(f"{failed}: {exc}", file=sys.stderr)


async def _drop(cluster: Cluster) -> None:
    """Drop the schema and the bus prefix (each step on its own: one failing does not
    leave the others behind)."""
    await execute_or_say(
        cluster.postgres,
        f'DROP SCHEMA IF EXISTS "{cluster.schema}" CASCADE',
        f"could not drop schema {cluster.schema}",
    )
    try:
        if cluster.bus_kind == "redis":
            import redis.asyncio as aioredis

            client = aioredis.from_url(cluster.broker or BUSES["redis"])
            try:
                keys = [k async for k in client.scan_iter(match=f"{cluster.prefix}:*", count=1000)]
                for i in range(0, len(keys), 1000):
                    await client.delete(*keys[i : i + 1000])
            finally:
                await client.aclose()
        else:
            from tideflow.bus import open_bus
            from tideflow.bus.backends.nats import NatsBus
            from tideflow.testing.nats import delete_prefix

            bus = open_bus(cluster.bus)
            assert isinstance(bus, NatsBus)
            await bus.open()
            try:
                await delete_prefix(bus)
            finally:
                await bus.close()
    except Exception as exc:
        print(f"could not delete bus prefix {cluster.prefix}: {exc}", file=sys.stderr)


INTERRUPTED = "interrupted: processes stopped, schema and bus prefix removed"


async def interruptible(work: Coroutine[Any, Any, int], said: str = INTERRUPTED) -> int:
    """``work``, cancelled (and so cleaned up) by SIGTERM as by Ctrl-C; 130 then."""
    task = asyncio.ensure_future(work)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        return await task
    except asyncio.CancelledError:
        print(said, file=sys.stderr)
        return 130
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


def run_interruptible(work: Coroutine[Any, Any, int], said: str = INTERRUPTED) -> int:
    """A bench script's exit status: ``work`` run to its end, or 130 after SIGTERM or
    Ctrl-C, once it has cleaned up (``said`` says what was removed)."""
    try:
        return asyncio.run(interruptible(work, said))
    except KeyboardInterrupt:
        print(said, file=sys.stderr)
        return 130


@contextlib.asynccontextmanager
async def cluster(
    bus_kind: str,
    *,
    workers: int,
    concurrency: int,
    prefetch: int,
    server_store: str | None = None,
    bus_base: str | None = None,
    keep_logs: bool = False,
    servers: Sequence[Sequence[str]] = ((),),
    postgres: str = POSTGRES,
    broker: str | None = None,
) -> AsyncIterator[Cluster]:
    """A running cluster in a fresh schema and bus prefix, removed on exit.
    ``server_store``: the server's own store URL, ``{schema}`` in it replaced by the
    cluster's schema; ``bus_base``: the broker's URL for every process (both: proxies
    in front of PostgreSQL and the broker, for bench/idle.py). ``servers``: one server
    per item, each with those options besides (``--http``); ``postgres``/``broker``: the database and broker instead of $TIDEFLOW_BENCH_*
    (bench/scale.py's own)."""
    token = f"{os.getpid()}_{uuid.uuid4().hex[:8]}"
    schema, prefix = f"cbench_{token}", f"cbench_{token}"
    store = f"{postgres}{'&' if '?' in postgres else '?'}schema={schema}"
    tmp = Path(tempfile.mkdtemp(prefix="tideflow-cbench-"))
    broker = broker or BUSES[bus_kind]
    running = Cluster(
        bus_kind=bus_kind,
        store=store,
        bus=_bus_url(bus_kind, bus_base or broker, prefix),
        schema=schema,
        prefix=prefix,
        tmp=tmp,
        postgres=postgres,
        broker=broker,
    )
    failed = True
    try:
        for extra in servers:
            await running.server(
                server_store.format(schema=schema) if server_store else None, extra
            )
        for _ in range(workers):
            await running.worker(concurrency, prefetch)
        yield running
        failed = False
    finally:
        running.stop()
        if failed or keep_logs:
            for proc in running.procs:
                tail = proc.text()[-2000:]
                if tail and failed:
                    print(f"--- {proc.name} (pid {proc.pid}) log tail:\n{tail}", file=sys.stderr)
        await _drop(running)
        if not keep_logs:
            _remove_logs(running)


def _remove_logs(running: Cluster) -> None:
    for proc in running.procs:
        proc.log.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        running.tmp.rmdir()


# -- measuring -------------------------------------------------------------------


@dataclass
class Row:
    workload: str
    bus: str
    steps: int
    seconds: float
    steps_per_s: float
    us_per_step: float
    p50_ms: float | None = None
    p99_ms: float | None = None
    dispatch_p50_ms: float | None = None
    dispatch_p99_ms: float | None = None
    dispatch_max_ms: float | None = None
    dispatch_n: int = 0
    repeats: int = 1
    median_steps_per_s: float | None = None
    median_dispatch_p99_ms: float | None = None


@dataclass(frozen=True)
class Workload:
    plan: Plan
    runs: int
    in_flight: int
    """Runs in flight at once (closed loop: the next starts when one has ended)."""
    rate: float | None = None
    """Runs started per second, whatever is in flight (open loop), instead."""


WORKLOADS: dict[str, Workload] = {}
"""name -> workload; filled by ``workloads``."""


def workloads() -> dict[str, Workload]:
    if not WORKLOADS:
        WORKLOADS.update(
            {
                "W1": Workload(chain(10, "python"), 1000, 1000),
                "W1-50": Workload(chain(10, "python"), 500, 50),
                "W1-1k": Workload(chain(10, "python"), 300, 300, rate=100.0),
                "W1-seq": Workload(chain(10, "python"), 100, 1),
                "W2": Workload(fan(1000, "python"), 1, 1),
                "W3": Workload(random_dag(300, "python"), 1, 1),
            }
        )
    return WORKLOADS


def quantile(values: Sequence[float], q: int) -> float:
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def dispatch_latencies(plan: Plan, history: Sequence[Any]) -> list[float]:
    """Seconds from the latest upstream completion to the start, for each step of one run
    with upstream steps (first attempts only; the bench's steps never fail)."""
    return [latency for _, latency in dispatches(plan, history)]


def dispatches(plan: Plan, history: Sequence[Any]) -> list[tuple[float, float]]:
    """(start time, dispatch latency in seconds) of each step of one run with upstream
    steps: ``dispatch_latencies`` with the time each dispatch ended, for windows."""
    completed: dict[str, float] = {}
    started: dict[str, float] = {}
    for entry in history:
        event = entry.event
        kind = entry.kind
        if event.get("compensation") or event.get("attempt", 1) != 1:
            continue
        key = event.get("step_key")
        if kind == "task_started":
            started.setdefault(key, float(event["time"]))
        elif kind == "task_completed":
            completed[key] = float(event["time"])
            if event.get("started_at") is not None:
                started.setdefault(key, float(event["started_at"]))
    out: list[tuple[float, float]] = []
    for step_id, spec in plan.specs.items():
        if not spec.depends_on or step_id not in started:
            continue
        ready = max(completed[d] for d in spec.depends_on)
        out.append((started[step_id], started[step_id] - ready))
    return out


async def _wait_all_ended(client: Client, ids: Sequence[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    wanted = set(ids)
    while True:
        unfinished = wanted.intersection(await client.unfinished())
        if not unfinished:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(unfinished)} runs had not ended after {timeout:g}s")
        await asyncio.sleep(0.05)


async def measure(client: Client, name: str, bus: str, runs: int | None = None) -> Row:
    """One measurement of workload ``name`` (``runs``: instead of its number of runs)."""
    workload = workloads()[name]
    plan, count, in_flight = workload.plan, workload.runs, workload.in_flight
    if runs is not None:
        count, in_flight = runs, min(in_flight, runs)
    await client.register(plan)
    gate = asyncio.Semaphore(in_flight)
    ids: list[str] = []

    async def one(index: int) -> None:
        if workload.rate is not None:  # open loop: the run's own start time
            await asyncio.sleep(max(0.0, t0 + index / workload.rate - time.time()))
        async with gate:
            run_id = await client.start(plan)
            ids.append(run_id)
            if in_flight < count:  # the next run starts when this one has ended
                await client.wait(run_id, timeout=RUN_TIMEOUT)

    t0 = time.time()
    async with asyncio.timeout(RUN_TIMEOUT):
        await asyncio.gather(*(one(i) for i in range(count)))
    await _wait_all_ended(client, ids, RUN_TIMEOUT)
    summaries = [await client.summary(run_id) for run_id in ids]
    bad = [s for s in summaries if s.status != "succeeded"]
    if bad:
        raise RuntimeError(f"{len(bad)} {name} runs did not succeed (first: {bad[0].status})")
    ends = [s.finished_at or s.updated_at for s in summaries]
    seconds = max(ends) - t0
    steps = len(plan.specs) * count
    row = Row(
        workload=name,
        bus=bus,
        steps=steps,
        seconds=round(seconds, 3),
        steps_per_s=round(steps / seconds),
        us_per_step=round(seconds / steps * 1e6, 1),
    )
    if count > 1:
        runs = [end - s.created_at for s, end in zip(summaries, ends, strict=True)]
        row.p50_ms = round(quantile(runs, 50) * 1e3, 1)
        row.p99_ms = round(quantile(runs, 99) * 1e3, 1)
    dispatch: list[float] = []
    for run_id in ids:
        dispatch += dispatch_latencies(plan, await client.store.history(run_id))
    if dispatch:
        row.dispatch_p50_ms = round(quantile(dispatch, 50) * 1e3, 2)
        row.dispatch_p99_ms = round(quantile(dispatch, 99) * 1e3, 2)
        row.dispatch_max_ms = round(max(dispatch) * 1e3, 2)
        row.dispatch_n = len(dispatch)
    return row


def summarise(rows: Sequence[Row]) -> Row:
    """The best row (steps/s) with the medians of all repeats."""
    best = max(rows, key=lambda r: r.steps_per_s)
    best.repeats = len(rows)
    best.median_steps_per_s = round(statistics.median(r.steps_per_s for r in rows))
    p99s = [r.dispatch_p99_ms for r in rows if r.dispatch_p99_ms is not None]
    if p99s:
        best.median_dispatch_p99_ms = round(statistics.median(p99s), 2)
    return best


def show(row: Row, as_json: bool) -> None:
    if as_json:
        print(json.dumps(asdict(row)), flush=True)
        return
    run = f"  run p50 {row.p50_ms} p99 {row.p99_ms} ms" if row.p50_ms is not None else ""
    dispatch = (
        f"  dispatch p50 {row.dispatch_p50_ms} p99 {row.dispatch_p99_ms} ms (n={row.dispatch_n})"
        if row.dispatch_p50_ms is not None
        else ""
    )
    median = (
        f"  [median of {row.repeats}: {row.median_steps_per_s} steps/s, "
        f"dispatch p99 {row.median_dispatch_p99_ms} ms]"
        if row.repeats > 1
        else ""
    )
    print(
        f"{row.workload:<7} {row.bus:<6} {row.steps:>6} steps {row.seconds:>7.3f} s "
        f"{row.steps_per_s:>6} steps/s {row.us_per_step:>7} us/step{run}{dispatch}{median}",
        flush=True,
    )


async def bench(args: argparse.Namespace) -> int:
    names = args.only or list(workloads())
    prefetch = args.prefetch or 2 * args.concurrency
    for kind in args.bus or list(BUSES):
        async with (
            cluster(
                kind,
                workers=args.workers,
                concurrency=args.concurrency,
                prefetch=prefetch,
                keep_logs=args.keep_logs,
            ) as running,
            Client.connect(store=running.store, bus=running.bus) as client,
        ):
            if args.keep_logs:
                print(f"logs in {running.tmp}", file=sys.stderr)
            for name in names:
                if args.warmup:  # unmeasured: connections, prepared statements, caches
                    await measure(client, name, kind, min(args.warmup, args.runs or args.warmup))
                rows = [await measure(client, name, kind, args.runs) for _ in range(args.repeat)]
                show(summarise(rows), args.json)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bus", action="append", choices=sorted(BUSES), help="default: both")
    parser.add_argument(
        "--only", action="append", choices=list(workloads()), help="run just these workloads"
    )
    parser.add_argument("--repeat", type=int, default=3, help="measurements per row (default 3)")
    parser.add_argument("--json", action="store_true", help="print rows as JSON lines")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument(
        "--concurrency", type=int, default=32, help="each worker's --concurrency (default 32)"
    )
    parser.add_argument(
        "--prefetch", type=int, default=None, help="each worker's --prefetch (default 2x)"
    )
    parser.add_argument(
        "--runs", type=int, default=None, help="runs per workload instead of its own (smoke tests)"
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=50,
        help="runs of each workload before it is measured, not counted (default 50; 0: none)",
    )
    parser.add_argument(
        "--keep-logs", action="store_true", help="keep the processes' logs (path on stderr)"
    )
    args = parser.parse_args(argv)
    if min(args.repeat, args.workers, args.concurrency, args.runs or 1) < 1:
        parser.error("--repeat, --workers, --concurrency and --runs must be at least 1")
    if args.warmup < 0:
        parser.error("--warmup must be 0 or more")
    return run_interruptible(bench(args))


if __name__ == "__main__":
    sys.exit(main())
