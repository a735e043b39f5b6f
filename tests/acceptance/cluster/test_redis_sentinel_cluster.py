"""A cluster on Redis Sentinel (issue 29): a `tideflow server` and two `tideflow worker`
processes on PostgreSQL and a ``redis+sentinel://`` bus (with ``wait=1``) over a
topology of the test's own (a master, two replicas, three sentinels:
tideflow.testing.topologies.redis_sentinel). Chains are started in a burst and the
master is SIGKILLed in the middle of it; the sentinels promote a replica and every
process follows it.

At the end: every run ``succeeded`` with its output, none is left unfinished, no
(step, attempt) has two applied outcomes in its history, and in the step log (the
cluster harness's) every step ran with one idempotency key, as attempt 1, at most twice
(once, and once more for a delivery whose acknowledgement the failover lost)."""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from harness import BUS_LEASE, ENGINE_LEASE_TTL, FLOWS, Cluster, eventually  # noqa: E402

from tideflow import Client  # noqa: E402
from tideflow.testing.topologies.redis_sentinel import RedisSentinel  # noqa: E402

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

RUNS = 60
BEFORE_KILL = 40
"""Step executions logged before the master is killed: the burst is under way."""
WITHIN = 60.0


@pytest.fixture
async def sentinel_cluster(
    postgres_url: str, tmp_path: Path, broker_binary: Callable[[str], str]
) -> AsyncIterator[tuple[Cluster, RedisSentinel]]:
    broker_binary("redis")  # skip (fail in CI) on a machine without redis-server
    import os

    import asyncpg

    token = uuid.uuid4().hex[:12]
    schema = f"sentinel_{token}"
    with RedisSentinel(tmp_path / "sentinel") as topology:
        bus = f"{topology.url}?prefix=sn-{token}&lease={BUS_LEASE:g}&wait=1"
        env = {
            **os.environ,
            "TIDEFLOW_STORE": f"{postgres_url}?schema={schema}",
            "TIDEFLOW_BUS": bus,
            "TIDEFLOW_ENGINE_LEASE_TTL": f"{ENGINE_LEASE_TTL:g}",
            "TIDEFLOW_CLUSTER_LOG": str(tmp_path / "steps.jsonl"),
            "COLUMNS": "200",
        }
        env.pop("TIDEFLOW_FAULT", None)
        cluster = Cluster(store=env["TIDEFLOW_STORE"], bus=bus, tmp=tmp_path, env=env)
        try:
            yield cluster, topology
        finally:
            cluster.stop_all()
            conn = await asyncpg.connect(postgres_url)
            try:
                await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            finally:
                await conn.close()


async def test_chains_ride_through_a_sentinel_failover_mid_burst(
    sentinel_cluster: tuple[Cluster, RedisSentinel],
) -> None:
    cluster, topology = sentinel_cluster
    began = time.monotonic()
    cluster.server("--sweep-interval", "2")
    cluster.worker("--concurrency", "8")
    cluster.worker("--concurrency", "8")
    runs: dict[str, int] = {}
    async with Client.connect(cluster.store, cluster.bus) as client:
        await client.register(FLOWS / "chain.yaml")
        for x in range(RUNS // 2):
            runs[await client.start("cl-chain", {"x": x})] = x
        await asyncio.to_thread(
            eventually,
            lambda: len(cluster.executions()) >= BEFORE_KILL,
            f"{BEFORE_KILL} steps run before the kill",
            WITHIN,
        )
        old = await asyncio.to_thread(topology.kill_master)
        killed, steps_then = time.monotonic() - began, len(cluster.executions())
        # the rest of the burst goes out while there is no master: a start whose
        # publication keeps failing stays stored (pending), and the server admits it
        # with the next start it hears of, or its sweep does
        for x in range(RUNS // 2, RUNS):
            runs[await client.start("cl-chain", {"x": x})] = x
        new = await asyncio.to_thread(topology.wait_failover, old)
        failed_over = time.monotonic() - began

        deadline = time.monotonic() + WITHIN
        while unfinished := await client.unfinished():
            if time.monotonic() > deadline:
                raise AssertionError(await stuck(client, unfinished))
            await asyncio.sleep(0.1)
        wrong = []
        for run_id, x in runs.items():
            result = await client.get(run_id)
            if result.status != "succeeded" or result.output != x + 111:
                wrong.append(f"x={x} {run_id}: {result.status} {result.output!r} {result.error}")
            entries = await client.store.history(run_id)
            outcomes = Counter(
                (e.event["step_key"], e.event["attempt"])
                for e in entries
                if e.kind in ("task_completed", "task_failed")
            )
            wrong += [f"{run_id}: {k} applied {n} times" for k, n in outcomes.items() if n > 1]
        assert not wrong, "\n".join(wrong[:20])

    per_step: dict[tuple[str, str], list[dict[str, object]]] = {}
    for line in cluster.executions():
        per_step.setdefault((str(line["run_id"]), str(line["step_key"])), []).append(line)
    assert {run for run, _ in per_step} == set(runs)
    assert len(per_step) == 3 * RUNS
    for (run_id, step), lines in per_step.items():
        assert {line["idempotency_key"] for line in lines} == {f"{run_id}:{step}"}, lines
        assert {line["attempt"] for line in lines} == {1}, lines
        assert len(lines) <= 2, lines
    again = sum(len(lines) - 1 for lines in per_step.values())
    print(
        f"{RUNS} chains in {time.monotonic() - began:.1f}s: {old} killed at {killed:.1f}s "
        f"({steps_then} of {3 * RUNS} steps run), {new} master at {failed_over:.1f}s; "
        f"{again} step(s) ran a second time"
    )


async def stuck(client: Client, unfinished: list[str]) -> str:
    lines = []
    for run_id in unfinished[:15]:
        result = await client.get(run_id)
        steps = {k: (s.status, s.attempts) for k, s in result.steps.items()}
        lines.append(f"{run_id}: {result.status} {steps}")
    return f"{len(unfinished)} run(s) did not end:\n" + "\n".join(lines)
