"""Engine start on a store full of waiting runs: start time and memory.

Fills a store with N runs that each wait for a signal (``go``) and sleep 30 days
beside it, committed through the store exactly as an engine commits them (the core
applies ``RunStarted``; the commit writes the run, its history, its timer and wait
rows). Then, for each cache size, a fresh engine process opens the store and
reports how long ``Runtime.start()`` took and its RSS; it then signals ``--touch``
of the runs (each moves on to a second wait and stays in memory as an idle run)
and reports its peak RSS: bounded by the cache size, not by N.

Usage:
    python bench/waiting.py --store sqlite --runs 100000 --cache 1000 --cache 10000
    python bench/waiting.py --store postgres --runs 100000 --cache 1000 --cache 10000
PostgreSQL uses $TIDEFLOW_BENCH_PG (default postgresql://root@127.0.0.1:5432/test),
in a schema of its own that is dropped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from scratch import scratch_dir

from tideflow.core.decide import decide
from tideflow.dsl import compile_definition
from tideflow.model.events import RunStarted, Transition
from tideflow.model.plan import Plan
from tideflow.model.run import RunState, new_run_state
from tideflow.runtime.runtime import Runtime
from tideflow.store.base import AppliedEvent, Store

WAITING: dict[str, Any] = {
    "name": "waiting",
    "version": "1",
    "steps": [
        {"id": "hold", "type": "wait", "signal": "go"},
        {"id": "nap", "type": "sleep", "duration": "30d"},
        {"id": "again", "type": "wait", "signal": "again", "depends_on": ["hold"]},
    ],
}
BATCH = 2000


def waiting_plan() -> Plan:
    return compile_definition(WAITING)


def open_store(kind: str, where: str) -> Store:
    if kind == "sqlite":
        from tideflow.store.backends.sqlite import SqliteStore

        return SqliteStore(where, compile_plan=compile_definition)
    from tideflow.store.backends.postgres import PostgresStore

    url, schema = where.split("#")
    return PostgresStore(url, schema=schema, compile_plan=compile_definition)


async def populate(kind: str, where: str, runs: int) -> float:
    """Create and start ``runs`` waiting runs; seconds taken."""
    began = time.perf_counter()
    plan = waiting_plan()
    store = open_store(kind, where)
    await store.open()
    try:
        await store.save_definition(plan)
        now = time.time()
        for first in range(0, runs, BATCH):
            states = [
                _state(plan, f"run-{i:07d}", now) for i in range(first, min(runs, first + BATCH))
            ]
            await asyncio.gather(*(store.create_run(state) for state in states))
            await store.commit([_started(plan, state, now) for state in states])
    finally:
        await store.close()
    return time.perf_counter() - began


def _state(plan: Plan, run_id: str, now: float) -> RunState:
    return new_run_state(
        run_id=run_id, workflow=plan.name, version=plan.version, plan_hash=plan.hash, created_at=now
    )


def _started(plan: Plan, state: RunState, now: float) -> AppliedEvent:
    event = RunStarted(event_id=f"{state.run_id}:started", run_id=state.run_id, time=now)
    decision = decide(plan, state, event)
    return AppliedEvent(
        event=event,
        state=state,
        transitions=decision.transitions,
        commands=decision.commands,
        seq=1,
    )


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return round(pages * os.sysconf("SC_PAGE_SIZE") / 2**20, 1)


def peak_rss_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


async def engine(kind: str, where: str, cache: int, touch: int, offset: int) -> dict[str, Any]:
    """One engine process: start it, then signal ``touch`` runs (from ``offset`` on: each
    engine moves runs of its own) and wait until they all wait again."""
    before = rss_mb()
    began = time.perf_counter()
    rt = Runtime(store=open_store(kind, where), run_cache_size=cache)
    await rt.start()
    started = time.perf_counter() - began
    after_start = rss_mb()
    moved = asyncio.Event()
    touched = [f"run-{i:07d}" for i in range(offset, offset + touch)]
    left = set(touched)

    def listener(state: RunState, transitions: Sequence[Transition]) -> None:
        if any(t.subject == "again" and t.new == "waiting" for t in transitions):
            left.discard(state.run_id)
            if not left:
                moved.set()

    rt.add_listener(listener)
    try:
        for run_id in touched:
            await rt.signal(run_id, "go", {"by": "bench"})
        if touch:
            async with asyncio.timeout(600):
                await moved.wait()
        cached = len(rt._engine.runs)
    finally:
        await rt.close()
    return {
        "store": kind,
        "cache": cache,
        "start_s": round(started, 3),
        "rss_before_start_mb": before,
        "rss_after_start_mb": after_start,
        "touched": touch,
        "cached_runs": cached,
        "peak_rss_mb": peak_rss_mb(),
    }


def _where(kind: str) -> str:
    if kind == "sqlite":
        return f"sqlite:///{scratch_dir('tideflow-waiting-')}/waiting.db"
    url = os.environ.get("TIDEFLOW_BENCH_PG", "postgresql://root@127.0.0.1:5432/test")
    return f"{url}#bench_waiting_{os.getpid()}"


async def _drop(where: str) -> None:
    if "#" in where:
        import asyncpg  # type: ignore[import-untyped]

        url, schema = where.split("#")
        conn = await asyncpg.connect(url)
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await conn.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--store", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--runs", type=int, default=100_000, help="waiting runs to store")
    parser.add_argument("--cache", type=int, action="append", help="run cache sizes to try")
    parser.add_argument("--touch", type=int, default=20_000, help="runs each engine signals")
    parser.add_argument("--engine", help=argparse.SUPPRESS)  # internal: one engine process
    parser.add_argument("--offset", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.engine:
        row = asyncio.run(engine(args.store, args.engine, args.cache[0], args.touch, args.offset))
        print(json.dumps(row))
        return 0
    caches = args.cache or [1_000, 10_000]
    if len(caches) * args.touch > args.runs:
        least = len(caches) * args.touch
        parser.error(f"--runs must be at least {least} (each engine signals runs of its own)")
    where = _where(args.store)
    try:
        seconds = asyncio.run(populate(args.store, where, args.runs))
        print(f"stored {args.runs} waiting runs in {seconds:.1f} s ({args.store})", flush=True)
        for index, cache in enumerate(caches):
            done = subprocess.run(
                [
                    *(sys.executable, __file__, "--store", args.store, "--engine", where),
                    *("--cache", str(cache), "--touch", str(args.touch)),
                    *("--offset", str(index * args.touch)),
                ],
                capture_output=True,
                text=True,
                check=False,
                timeout=1800,
            )
            if done.returncode:
                print(done.stderr, file=sys.stderr)
                return done.returncode
            print(done.stdout.strip(), flush=True)
    finally:
        asyncio.run(_drop(where))
    return 0


if __name__ == "__main__":
    sys.exit(main())
