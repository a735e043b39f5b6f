"""A PostgreSQL failover under a real cluster (issue 29): `tideflow server` and
`tideflow worker` on a primary and a synchronous streaming standby of the test's own,
named together in one store URL (``target_session_attrs=read-write``), and the shared
Redis (a key prefix of the test's own). A burst of chain runs is under way when the
primary is SIGKILLed and the standby promoted; the server rides through without a
restart, and every run, those started before and after, succeeds.

What the failover may cost is bounded: no completion is applied twice in a run's
history, every step ran in one attempt (the engine made none again), and a step that
ran twice ran with the same idempotency key (a dispatch relayed again: the bus is
at-least-once, the key is what a step's effect is made idempotent with)."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from harness import FLOWS, Cluster, Proc, _cluster, eventually  # noqa: E402
from test_chaos import completions_twice  # noqa: E402

from tideflow import Client  # noqa: E402
from tideflow.testing.topologies.postgres_standby import PostgresStandby  # noqa: E402

pytestmark = [pytest.mark.timeout(150), pytest.mark.slow]

BEFORE, AFTER = 150, 30
"""Chain runs started before the failover, and after it."""
KILL_AFTER = 60
"""Step executions logged before the primary is killed: the burst is mid-way."""


def test_a_burst_of_runs_rides_through_a_promotion(
    postgres_standby: PostgresStandby, redis_url: str, tmp_path: Path
) -> None:
    topology = postgres_standby
    with _cluster(topology.url, "redis", redis_url, tmp_path, None) as cluster:
        server = cluster.server()
        worker = cluster.worker("--concurrency", "8")
        runs, killed_at = asyncio.run(_burst_through_a_failover(cluster, topology, server))
        executions = [e for e in cluster.executions() if e["run_id"] in runs]
        assert {e["attempt"] for e in executions} == {1}, "a step was attempted again"
        keys: dict[tuple[str, str], set[str]] = {}
        for e in executions:
            keys.setdefault((e["run_id"], e["step_key"]), set()).add(e["idempotency_key"])
        assert len(keys) == 3 * len(runs)
        assert all(len(used) == 1 for used in keys.values()), "a step ran with two keys"
        again = len(executions) - len(keys)
        assert server.popen.poll() is None, f"the server exited:\n{server.text()[-6000:]}"
        assert worker.popen.poll() is None, f"the worker exited:\n{worker.text()[-6000:]}"
        print(
            f"killed the primary after {killed_at} of {3 * BEFORE} steps; "
            f"{len(runs)} runs succeeded, {again} step(s) ran again with their key"
        )


async def _burst_through_a_failover(
    cluster: Cluster, topology: PostgresStandby, server: Proc
) -> tuple[dict[str, int], int]:
    """Start the burst, fail the primary over mid-way, start more; wait until every run
    succeeded and check outputs and histories. The runs (id -> x), and how many steps
    had run when the primary was killed."""
    runs: dict[str, int] = {}
    async with Client.connect(cluster.store, cluster.bus) as client:
        await client.register(FLOWS / "chain.yaml")
        await _start(client, runs, range(BEFORE))

        def steps_run() -> int:
            return len(cluster.executions())

        await asyncio.to_thread(
            eventually, lambda: steps_run() >= KILL_AFTER, f"{KILL_AFTER} steps ran", 60
        )
        killed_at = steps_run()
        await asyncio.to_thread(topology.kill_primary)
        await asyncio.to_thread(topology.promote)
        await asyncio.to_thread(topology.wait_primary)
        assert killed_at < 3 * BEFORE, "the burst ended before the failover"

        await _start(client, runs, range(BEFORE, BEFORE + AFTER))  # its store reconnected

        async def unfinished() -> list[str]:
            return [r for r in runs if (await client.get(r)).status != "succeeded"]

        deadline = time.monotonic() + 60
        while left := await unfinished():
            if time.monotonic() > deadline:
                status = (await client.get(left[0])).status
                raise AssertionError(
                    f"{len(left)} run(s) not succeeded 60s after the failover (one is "
                    f"{status}); the server's log ends:\n{server.text()[-6000:]}"
                )
            await asyncio.sleep(0.1)  # polled, bounded: the runs end in other processes

        wrong = {}
        twice = {}
        for run_id, x in runs.items():
            result = await client.get(run_id)
            if result.output != x + 111:
                wrong[run_id] = result.output
            doubled = completions_twice(await client.store.history(run_id))
            if doubled:
                twice[run_id] = doubled
        assert not wrong, f"outputs not as expected: {wrong}"
        assert not twice, f"outcomes applied twice: {twice}"
    return runs, killed_at


async def _start(client: Client, runs: dict[str, int], xs: range) -> None:
    """Start chain runs 20 at a time (the burst outpaces the cluster)."""
    for first in range(xs.start, xs.stop, 20):
        chunk = range(first, min(first + 20, xs.stop))
        ids = await asyncio.gather(*(client.start("cl-chain", {"x": x}) for x in chunk))
        runs.update(zip(ids, chunk, strict=True))
