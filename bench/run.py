"""tideflow benchmark suite: no-op workloads through the embedded runtime.

Every workload runs with two kinds of step (``--steps``):

noop    the built-in ``noop`` executor (the engine's own overhead)
python  a ``python`` step calling a plain module-level sync function
        (``bench/bench_steps.py``), which is what users run: compare these rows
        with other engines

Runs are submitted the way a client does, one ``Runtime.start_run`` per run.

W1   1,000 runs x 10-step chain (started together)
W1-seq  200 runs x 10-step chain, one at a time (per-run latency)
W2   one run: 1,000 parallel steps and a join
W3   one run: deterministic 300-node random DAG (node i depends on 1-3 random
     earlier nodes, seed 42)
W3-10k  the same with 10,000 nodes (per-step cost must stay within 1.5x of W3)

Usage:
    python bench/run.py                  # all workloads, in-memory store
    python bench/run.py --only W1 --repeat 5
    python bench/run.py --json           # machine-readable rows
    python bench/run.py --steps python --store sqlite --store postgres
    python bench/run.py --machine        # first what the machine costs (bench/machine.py)

Each row reports steps/s (steps executed / wall time from first start to last
finish), per-step cost in microseconds, and p50/p99 run latency for W1.

Rows run on the event loop every ``tideflow`` command runs on (`tideflow.loop`: uvloop,
unless ``TIDEFLOW_LOOP`` says otherwise); ``--loop asyncio`` measures the standard
library's loop, which a program calling ``asyncio.run`` gets.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from machine import probe
from scratch import scratch_dir

import tideflow.loop
from tideflow.dsl import compile_definition
from tideflow.model.plan import Plan
from tideflow.runtime.runtime import Runtime


@dataclass
class Row:
    workload: str
    store: str
    step_type: str
    steps: int
    seconds: float
    steps_per_s: float
    us_per_step: float
    p50_ms: float | None = None
    p99_ms: float | None = None
    loop: str = "asyncio"


STEP_TYPES: dict[str, dict[str, Any]] = {
    "noop": {"type": "noop"},
    "python": {"type": "python", "function": "bench_steps:step"},
}
"""The step body of each ``--steps`` kind."""


def _step(kind: str, step_id: str, depends_on: list[str] | None = None) -> dict[str, Any]:
    step = {"id": step_id, **STEP_TYPES[kind]}
    if depends_on:
        step["depends_on"] = depends_on
    return step


def chain(n: int, kind: str = "noop") -> Plan:
    steps = [_step(kind, "s0")]
    steps += [_step(kind, f"s{i}", [f"s{i - 1}"]) for i in range(1, n)]
    return compile_definition({"name": f"chain-{n}-{kind}", "version": "1", "steps": steps})


def fan(n: int, kind: str = "noop") -> Plan:
    steps = [_step(kind, f"p{i}") for i in range(n)]
    steps.append(_step(kind, "join", [f"p{i}" for i in range(n)]))
    return compile_definition({"name": f"fan-{n}-{kind}", "version": "1", "steps": steps})


def random_dag(n: int, kind: str = "noop", seed: int = 42) -> Plan:
    rng = random.Random(seed)
    steps = [_step(kind, "n0")]
    for i in range(1, n):
        k = rng.randint(1, min(3, i))
        deps = sorted(rng.sample(range(i), k))
        steps.append(_step(kind, f"n{i}", [f"n{d}" for d in deps]))
    return compile_definition({"name": f"dag-{n}-{kind}", "version": "1", "steps": steps})


async def _runs(
    make_runtime: Callable[[], Runtime], plan: Plan, count: int, concurrency: int
) -> tuple[float, list[float]]:
    async with make_runtime() as rt:
        await rt.register(plan)
        latencies: list[float] = []
        gate = asyncio.Semaphore(concurrency)

        async def one() -> None:
            async with gate:
                t0 = time.perf_counter()
                result = await rt.wait(await rt.start_run(plan))
                latencies.append(time.perf_counter() - t0)
            if result.status != "succeeded":
                raise RuntimeError(f"benchmark run ended {result.status}: {result.error}")

        gc.collect()
        start = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(count)))
        return time.perf_counter() - start, latencies


def measure(
    name: str,
    workload: tuple[Plan, int, int],
    store: str,
    kind: str,
    make_runtime: Callable[[], Runtime],
    loop: str | None = None,
) -> Row:
    """One measurement, on ``loop`` (``uvloop`` or ``asyncio``; default `tideflow.loop`'s)."""
    plan, count, concurrency = workload
    loop = loop or tideflow.loop.loop_name()
    factory = tideflow.loop.loop_factory({tideflow.loop.ENV: loop})
    with asyncio.Runner(loop_factory=factory) as runner:
        seconds, latencies = runner.run(_runs(make_runtime, plan, count, concurrency))
    steps = len(plan.specs) * count
    row = Row(
        workload=name,
        store=store,
        step_type=kind,
        steps=steps,
        seconds=round(seconds, 3),
        steps_per_s=round(steps / seconds),
        us_per_step=round(seconds / steps * 1e6, 1),
        loop=loop,
    )
    if count > 1:
        qs = statistics.quantiles(latencies, n=100)
        row.p50_ms, row.p99_ms = round(qs[49] * 1e3, 1), round(qs[98] * 1e3, 1)
    return row


WORKLOADS: dict[str, Callable[[str], tuple[Plan, int, int]]] = {
    # name: step kind -> (plan, runs, runs in flight at once)
    "W1": lambda kind: (chain(10, kind), 1000, 1000),
    "W1-seq": lambda kind: (chain(10, kind), 200, 1),
    "W2": lambda kind: (fan(1000, kind), 1, 1),
    "W3": lambda kind: (random_dag(300, kind), 1, 1),
    "W3-10k": lambda kind: (random_dag(10_000, kind), 1, 1),
}


def runtime_factory(store: str) -> Callable[[], Runtime]:
    """A fresh, empty store of the given kind for every measurement."""
    if store == "memory":
        return lambda: Runtime(workers=32)
    if store == "sqlite":
        directory = scratch_dir("tideflow-bench-")
        counter = iter(range(1_000_000))
        return lambda: Runtime(workers=32, store=f"sqlite:///{directory}/bench-{next(counter)}.db")
    url = os.environ.get("TIDEFLOW_BENCH_PG", "postgresql://root@127.0.0.1:5432/test")
    return lambda: Runtime(workers=32, store=fresh_postgres(url))


def fresh_postgres(url: str) -> Any:
    """A PostgreSQL store in a new, empty schema (dropped when the process exits)."""
    from tideflow.store.backends.postgres import PostgresStore

    schema = f"bench_{os.getpid()}_{time.monotonic_ns()}"
    return PostgresStore(url, schema=schema, drop_schema_on_close=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--only", action="append", choices=sorted(WORKLOADS), help="run just these workloads"
    )
    parser.add_argument("--repeat", type=int, default=3, help="best of N (default 3)")
    parser.add_argument("--json", action="store_true", help="print rows as JSON lines")
    parser.add_argument(
        "--store",
        action="append",
        choices=["memory", "sqlite", "postgres"],
        help="stores to measure (default: memory); postgres uses $TIDEFLOW_BENCH_PG "
        "(default postgresql://root@127.0.0.1:5432/test)",
    )
    parser.add_argument(
        "--steps",
        action="append",
        choices=sorted(STEP_TYPES),
        help="step kinds to measure (default: both); python calls bench_steps:step",
    )
    parser.add_argument(
        "--loop",
        choices=["uvloop", "asyncio"],
        help="the event loop (default: the commands' own, uvloop unless $TIDEFLOW_LOOP "
        "says otherwise)",
    )
    parser.add_argument(
        "--machine",
        action="store_true",
        help="first measure what the machine costs below the engine (bench/machine.py: "
        "thread hand-off, SQLite commit, pure Python) and print it before the rows",
    )
    args = parser.parse_args(argv)
    loop = args.loop or tideflow.loop.loop_name()
    if args.machine:
        machine = probe(loop)
        print(json.dumps({"machine": asdict(machine)}) if args.json else machine.line())
    names = args.only or list(WORKLOADS)
    kinds = args.steps or list(STEP_TYPES)
    rows: list[Row] = []
    combos = [(st, k, n) for st in (args.store or ["memory"]) for k in kinds for n in names]
    for store, kind, name in combos:
        workload = WORKLOADS[name](kind)
        factory = runtime_factory(store)
        best = max(
            (measure(name, workload, store, kind, factory, loop) for _ in range(args.repeat)),
            key=lambda r: r.steps_per_s,
        )
        rows.append(best)
        if args.json:
            print(json.dumps(asdict(best)))
        else:
            latency = (
                f"  p50 {best.p50_ms} ms  p99 {best.p99_ms} ms" if best.p50_ms is not None else ""
            )
            print(
                f"{best.workload:<8} {best.store:<8} {best.step_type:<6} {best.steps:>7} steps  "
                f"{best.seconds:>7.3f} s  {best.steps_per_s:>8} steps/s  "
                f"{best.us_per_step:>6} us/step{latency}  ({best.loop})"
            )
    for kind in kinds:
        by = {r.workload: r for r in rows if r.store == "memory" and r.step_type == kind}
        if "W3" in by and "W3-10k" in by and not args.json:
            ratio = by["W3-10k"].us_per_step / by["W3"].us_per_step
            print(f"W3-10k / W3 per-step cost ratio ({kind}): {ratio:.2f} (target <= 1.5)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
