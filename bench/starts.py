"""Concurrent starts: how fast a burst of ``Client.start`` calls is stored and published.

A cluster client (``tideflow.runtime.remote.connect``: what a `tideflow server`'s
``POST /runs`` and a client process share) on a fresh store and an in-process bus starts
``--runs`` runs of a one-step workflow, ``--concurrency`` calls at a time, and reports
the starts per second, the mean latency of one start, and (when the store has
``create_runs``) how many store commits the burst took. A lone start (``--concurrency
1``) shows what one start costs with nobody to gather with.

Usage (run it on two source trees to compare, in the same minute):
    python bench/starts.py --store sqlite --runs 5000 --concurrency 1 --concurrency 200
    python bench/starts.py --store postgres --runs 5000 --concurrency 1 --concurrency 200
    PYTHONPATH=/path/to/base/src python bench/starts.py --store postgres ...
PostgreSQL uses $TIDEFLOW_BENCH_PG (default postgresql://root@127.0.0.1:5432/test),
in a schema of its own that is dropped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from typing import Any

from scratch import scratch_dir

from tideflow.bus.backends.local import LocalBus
from tideflow.dsl import compile_definition
from tideflow.runtime.remote import connect
from tideflow.store.base import Store

FLOW: dict[str, Any] = {"name": "one", "version": "1", "steps": [{"id": "a", "type": "noop"}]}


def open_store(kind: str, tag: str) -> tuple[Store, str | None]:
    """A fresh store, and the PostgreSQL schema to drop after (None for SQLite)."""
    if kind == "sqlite":
        from tideflow.store.backends.sqlite import SqliteStore

        path = f"sqlite:///{scratch_dir('tideflow-starts-')}/starts.db"
        return SqliteStore(path, compile_plan=compile_definition), None
    from tideflow.store.backends.postgres import PostgresStore

    url = os.environ.get("TIDEFLOW_BENCH_PG", "postgresql://root@127.0.0.1:5432/test")
    schema = f"bench_starts_{os.getpid()}_{tag}"
    return PostgresStore(url, schema=schema, compile_plan=compile_definition), url + "#" + schema


async def _drop(where: str | None) -> None:
    if where is None:
        return
    import asyncpg  # type: ignore[import-untyped]

    url, schema = where.split("#")
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


async def burst(kind: str, runs: int, concurrency: int) -> dict[str, Any]:
    store, where = open_store(kind, str(concurrency))
    commits = [0]
    if hasattr(store, "create_runs"):  # a store without it commits once per start
        real = store.create_runs

        async def counted(batch: Any) -> Any:
            commits[0] += 1
            return await real(batch)

        setattr(store, "create_runs", counted)  # noqa: B010 (also on a tree without it)
    try:
        async with connect(store, LocalBus()) as client:
            plan = await client.register(compile_definition(FLOW))
            await client.start(plan)  # warm: the plan is known, the connections open
            commits[0] = 0
            left = iter(range(runs))
            latencies: list[float] = []

            async def caller() -> None:
                for i in left:
                    began = time.perf_counter()
                    await client.start(plan, {"i": i})
                    latencies.append(time.perf_counter() - began)

            began = time.perf_counter()
            await asyncio.gather(*(caller() for _ in range(concurrency)))
            took = time.perf_counter() - began
    finally:
        await _drop(where)
    return {
        "store": kind,
        "runs": runs,
        "concurrency": concurrency,
        "starts_per_s": round(runs / took),
        "mean_ms": round(1000 * sum(latencies) / len(latencies), 2),
        "commits": commits[0] if hasattr(store, "create_runs") else runs,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--runs", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, action="append")
    args = parser.parse_args(argv)
    for concurrency in args.concurrency or [1, 200]:
        print(json.dumps(asyncio.run(burst(args.store, args.runs, concurrency))), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
