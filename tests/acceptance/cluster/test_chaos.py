"""The chaos test of cluster mode (issue 9, acceptance): two servers and three workers on
PostgreSQL and a private broker (Redis Streams, NATS JetStream) run 500 workflows of
seven shapes while the test SIGKILLs a worker and one of the two active servers, starts
new ones, and restarts the broker. Each disruption waits until the cluster has made
progress since the last one, so each hits work in flight.

At the end: every run has its expected status and output, no (step, attempt) has two
applied outcomes in its history, no run is left unfinished, and the broker holds
nothing: no task waiting or held on any queue (``tideflow queues --json``), no event
pending on any partition (read from the broker itself: ``XPENDING`` / JetStream
consumer info), no delayed hand-back left.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from harness import FLOWS, Cluster, Proc, eventually, partition_holders  # noqa: E402

from tideflow import Client  # noqa: E402
from tideflow.bus.base import DEFAULT_PARTITIONS  # noqa: E402
from tideflow.store.base import HistoryEntry  # noqa: E402

pytestmark = [pytest.mark.timeout(240)]

RUNS = 500
WORKERS = 3
SERVERS = 2
BROKER_STOP = {"redis": signal.SIGKILL, "nats": signal.SIGTERM}
"""How the broker is stopped. Redis with ``appendfsync always`` has written everything
it acknowledged before it answers, so a SIGKILL loses nothing. nats-server 2.9's file
store writes behind (it acknowledges a publish, an ack or a consumer's creation before
they reach the file, and has no ``sync_interval: always`` before 2.10): after a SIGKILL
the streams hold messages already acknowledged and may lack consumers just made, so NATS
is stopped cleanly here (see docs/deployment.md, "Brokers")."""
BROKER_DOWN = 3.0
"""Seconds the broker stays down: longer than a lease, so that everyone notices."""

EXPECTED: dict[str, Callable[[int], int]] = {
    "chain": lambda x: x + 111,
    "fanout": lambda x: 3 * (x + 1) + 6,
    "switch": lambda x: x + 1 + (1000 if (x + 1) % 2 == 0 else 2000),
    "map": lambda x: 3 * x + 6,
    "retrying": lambda x: 2 * x,  # its first attempt fails, the second succeeds
    "signal": lambda x: 2 * x + 1,  # the signal's bonus is x
    "sleep": lambda x: x + 2,
}
"""Shape → the output of a run of it with input ``{"x": x}``; every run succeeds."""
SHAPES = tuple(EXPECTED)
OUTCOMES = ("task_completed", "task_failed")


def plan_of_runs() -> list[tuple[str, int]]:
    """(shape, x) of every run, the shapes interleaved so that each batch mixes them."""
    return [(SHAPES[i % len(SHAPES)], i) for i in range(RUNS)]


class Chaos:
    """The test's view of the cluster while it runs: starts runs, counts progress."""

    def __init__(self, cluster: Cluster, client: Client) -> None:
        self.cluster = cluster
        self.client = client
        self.runs: dict[str, tuple[str, int]] = {}
        self.todo = plan_of_runs()
        self.mark = 0
        self.began = time.monotonic()

    async def start(self, count: int) -> None:
        batch, self.todo = self.todo[:count], self.todo[count:]
        for shape, x in batch:
            run_id = await self.client.start(f"cl-{shape}", {"x": x})
            if shape == "signal":  # a signal that comes before its wait is kept for it
                await self.client.signal(run_id, "go", {"bonus": x})
            self.runs[run_id] = (shape, x)

    def steps_run(self) -> int:
        return len(self.cluster.executions())

    async def progress(self, more: int, what: str) -> None:
        """Wait until ``more`` step executions beyond the last mark are logged, then mark."""
        target = self.mark + more
        await asyncio.to_thread(
            eventually, lambda: self.steps_run() >= target, f"{more} more steps ({what})", 60
        )
        self.mark = self.steps_run()
        self.say(what)

    def say(self, what: str) -> None:
        done = self.steps_run()
        print(f"{time.monotonic() - self.began:6.1f}s {len(self.runs)} runs {done} steps: {what}")

    async def unfinished(self) -> list[str]:
        return await self.client.unfinished()


def kill_and_restart_worker(cluster: Cluster, workers: list[Proc]) -> None:
    victim = workers.pop(0)
    victim.kill()
    workers.append(cluster.worker("--concurrency", "8"))


def kill_a_server(cluster: Cluster, servers: list[Proc]) -> None:
    """SIGKILL one of the active servers (the other takes its partitions over once their
    leases run out) and start another, which takes its share without a restart."""
    servers.pop(0).kill()
    servers.append(cluster.server())


def completions_twice(entries: list[HistoryEntry]) -> dict[tuple[str, str, int], int]:
    counts = Counter(
        (e.kind, e.event["step_key"], e.event["attempt"]) for e in entries if e.kind in OUTCOMES
    )
    return {key: n for key, n in counts.items() if n > 1}


async def broker_pending(cluster: Cluster) -> dict[str, int]:
    """What the broker itself still holds for the cluster: per stream (or consumer),
    entries not acknowledged; empty when everything was settled."""
    assert cluster.broker is not None
    prefix = cluster.bus.split("prefix=")[1].split("&")[0]
    if cluster.broker.kind == "redis":
        return await _redis_pending(cluster.broker.url, prefix)
    return await _nats_pending(cluster.broker.url, prefix)


async def _redis_pending(url: str, prefix: str) -> dict[str, int]:
    import redis.asyncio as aioredis

    client = aioredis.from_url(url)
    left: dict[str, int] = {}
    try:
        async for raw in client.scan_iter(match=f"{prefix}:*", count=1000):
            key = raw.decode()
            kind = (await client.type(key)).decode()
            if kind == "stream" and (":events:" in key or ":tasks:" in key):
                group = "engine" if ":events:" in key else "workers"
                groups = {g["name"].decode() for g in await client.xinfo_groups(key)}
                pending = (await client.xpending(key, group))["pending"] if group in groups else 0
                length = await client.xlen(key)
                if pending or length:
                    left[key] = max(pending, length)
        delayed = await client.zcard(f"{prefix}:delayed")
        if delayed:
            left[f"{prefix}:delayed"] = delayed
    finally:
        await client.aclose()
    return left


async def _nats_pending(url: str, prefix: str) -> dict[str, int]:
    import nats

    conn = await nats.connect(url)
    left: dict[str, int] = {}
    try:
        js = conn.jetstream()
        for stream in (f"{prefix}_tasks", f"{prefix}_events"):
            info = await js.stream_info(stream)
            if info.state.messages:
                left[stream] = info.state.messages
            for consumer in await js.consumers_info(stream):
                waiting = consumer.num_pending + consumer.num_ack_pending
                if waiting:
                    left[f"{stream}/{consumer.name}"] = waiting
    finally:
        await conn.close()
    return left


def queues_left(cluster: Cluster) -> list[dict[str, Any]]:
    shown = cluster.cli("queues", "--json")
    assert shown.returncode == 0, shown.stderr
    rows: list[dict[str, Any]] = json.loads(shown.stdout)["queues"]
    assert rows, "no queue shown at all"
    return [r for r in rows if r["depth"] or r["held"]]


async def settled(cluster: Cluster) -> bool:
    return not queues_left(cluster) and not await broker_pending(cluster)


@pytest.mark.slow
async def test_500_mixed_runs_survive_killed_workers_servers_and_a_broker_restart(
    private_cluster: Cluster,
) -> None:
    cluster = private_cluster
    assert cluster.broker is not None
    began = time.monotonic()
    servers = cluster.servers(SERVERS)
    workers = [cluster.worker("--concurrency", "8") for _ in range(WORKERS)]
    async with Client.connect(cluster.store, cluster.bus) as client:
        for shape in SHAPES:
            await client.register(FLOWS / f"{shape}.yaml")
        chaos = Chaos(cluster, client)

        await chaos.start(150)
        await chaos.progress(100, "before the worker is killed")
        await asyncio.to_thread(kill_and_restart_worker, cluster, workers)
        await chaos.start(100)
        await chaos.progress(100, "before the server is killed")
        await asyncio.to_thread(kill_a_server, cluster, servers)
        await chaos.start(100)

        async def taken_over() -> bool:  # every partition held by a live server
            held = await partition_holders(cluster.store)
            live = {s.pid for s in servers}
            return len(held) == DEFAULT_PARTITIONS and set(held.values()) <= live

        await _eventually_async(taken_over, "the live servers hold every partition", 30)
        await chaos.progress(100, "before the broker restarts")
        await chaos.start(100)
        in_flight = len(await chaos.unfinished())
        await asyncio.to_thread(
            cluster.broker.restart, BROKER_STOP[cluster.broker.kind], BROKER_DOWN
        )
        chaos.say(f"the broker restarted ({in_flight} runs were unfinished)")
        await chaos.start(len(chaos.todo))
        assert len(chaos.runs) == RUNS

        async def all_ended() -> bool:
            return not await chaos.unfinished()

        try:
            await _eventually_async(all_ended, "every run ends", 60)
        except AssertionError:
            raise AssertionError(await _stuck(cluster, chaos)) from None
        await _check_runs(client, chaos.runs)
    try:
        await _eventually_async(lambda: settled(cluster), "the broker holds nothing", 30)
    except AssertionError:
        left = f"queues {queues_left(cluster)}, broker {await broker_pending(cluster)}"
        raise AssertionError(f"the broker still holds: {left}") from None
    assert queues_left(cluster) == []
    assert await broker_pending(cluster) == {}
    elapsed = time.monotonic() - began
    print(f"{RUNS} runs on {cluster.broker.kind} with chaos in {elapsed:.1f}s")


async def _stuck(cluster: Cluster, chaos: Chaos) -> str:
    """What the runs that did not end are waiting for, and what the broker holds."""
    lines = []
    for run_id in (await chaos.unfinished())[:15]:
        result = await chaos.client.get(run_id)
        steps = {k: (s.status, s.attempts) for k, s in result.steps.items()}
        lines.append(f"{chaos.runs.get(run_id)} {run_id}: {result.status} {steps}")
    left = len(await chaos.unfinished())
    pending = await broker_pending(cluster)
    return f"{left} run(s) did not end:\n" + "\n".join(lines) + f"\nbroker holds {pending}"


async def _check_runs(client: Client, runs: dict[str, tuple[str, int]]) -> None:
    wrong: list[str] = []
    twice: dict[str, Any] = {}
    for run_id, (shape, x) in runs.items():
        result = await client.get(run_id)
        if result.status != "succeeded" or result.output != EXPECTED[shape](x):
            wrong.append(
                f"{shape} x={x} {run_id}: {result.status} {result.output!r} {result.error}"
            )
        doubled = completions_twice(await client.store.history(run_id))
        if doubled:
            twice[run_id] = doubled
    assert not wrong, f"{len(wrong)} run(s) did not end as expected:\n" + "\n".join(wrong[:20])
    assert not twice, f"outcomes applied twice: {twice}"


async def _eventually_async(check: Callable[[], Any], what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        await asyncio.sleep(0.1)
