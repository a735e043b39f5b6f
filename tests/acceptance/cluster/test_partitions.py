"""Run ownership with real processes (runtime/partitions.py), on PostgreSQL + Redis and
PostgreSQL + NATS: two active servers each apply a share of the partitions; SIGKILL one
and the other takes its partitions within the lease time while runs keep finishing; a
third one started later gets a share without a restart; no completion is applied twice.
Every wait is on a condition with a bound."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from harness import (  # noqa: E402
    BUS_LEASE,
    ENGINE_LEASE_TTL,
    Cluster,
    Proc,
    eventually,
    partition_holders,
)
from test_cluster import _start_many, assert_applied_once, expected, results  # noqa: E402

from tideflow import Client, RunResult  # noqa: E402

pytestmark = [pytest.mark.timeout(180)]

PARTITIONS = 16


async def _stuck(cluster: Cluster, run_ids: list[str]) -> list[tuple[str, str, list[str]]]:
    async with Client.connect(cluster.store, cluster.bus) as client:
        out = []
        for run_id in run_ids:
            summary = await client.summary(run_id)
            if summary.status != "succeeded":
                kinds = [e.kind for e in await client.history(run_id)]
                out.append((run_id, summary.status, kinds))
        return out


def finished(cluster: Cluster, run_ids: list[str]) -> list[RunResult]:
    """The runs' results; a run that did not end is shown with its history."""
    try:
        return results(cluster, run_ids, timeout=60)
    except TimeoutError:
        stuck = asyncio.run(_stuck(cluster, run_ids))
        raise AssertionError(f"runs that did not end: {stuck}") from None


def holders(cluster: Cluster) -> dict[int, int]:
    return asyncio.run(partition_holders(cluster.store))


def shares(cluster: Cluster, *servers: Proc) -> dict[int, set[int]] | None:
    """Each server's partitions, once every partition is held by exactly these servers,
    each of them holding some; else None."""
    held = holders(cluster)
    if len(held) != PARTITIONS:
        return None
    by_pid: dict[int, set[int]] = {s.pid: set() for s in servers}
    for partition, pid in held.items():
        if pid not in by_pid:
            return None
        by_pid[pid].add(partition)
    return by_pid if all(by_pid.values()) else None


@pytest.mark.slow
def test_servers_share_partitions_take_over_a_killed_one_and_rebalance(
    cluster: Cluster,
) -> None:
    first = cluster.server()
    second = cluster.server()
    cluster.worker("--concurrency", "8")
    split = eventually(lambda: shares(cluster, first, second), "both servers hold a share")
    assert not split[first.pid] & split[second.pid]
    for server in (first, second):
        server.wait_log("took partitions")
    status = cluster.cli("db", "status", "--json")
    assert status.returncode == 0, status.stderr
    listed = json.loads(status.stdout)["cluster"]
    assert listed["partitions"] == PARTITIONS
    assert {s["pid"]: set(s["partitions"]) for s in listed["servers"]} == split
    assert f"server pid {first.pid}" in cluster.cli("db", "status").stdout

    runs = asyncio.run(_start_many(cluster, 4))  # 20 runs of every shape, both shares
    second.kill()
    eventually(
        lambda: shares(cluster, first),
        "the survivor holds every partition",
        timeout=ENGINE_LEASE_TTL + BUS_LEASE + 15,
    )
    after_kill = asyncio.run(_start_many(cluster, 2))
    done = finished(cluster, list(runs) + list(after_kill))
    everything = {**runs, **after_kill}
    for result in done:
        shape, x = everything[result.run_id]
        assert result.status == "succeeded", (shape, result.error)
        assert result.output == expected(shape, x), shape

    third = cluster.server()
    rebalanced = eventually(lambda: shares(cluster, first, third), "the third gets a share")
    assert first.popen.poll() is None  # no restart
    first.wait_log("released partitions")
    late = asyncio.run(_start_many(cluster, 2))
    for result in finished(cluster, list(late)):
        shape, x = late[result.run_id]
        assert result.status == "succeeded" and result.output == expected(shape, x), shape
    assert_applied_once(cluster, [*everything, *late])
    assert rebalanced[third.pid]
    assert first.term() == 0 and third.term() == 0
