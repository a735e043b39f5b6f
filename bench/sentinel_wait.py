"""What ``wait=1`` costs a publish on the Redis bus behind Sentinel.

Starts a Sentinel topology of its own (tideflow.testing.topologies.redis_sentinel: a
master, two replicas, three sentinels on loopback) and measures, on one bus with
``wait=0`` and one with ``wait=1``, interleaved round by round so that both see the same
machine: ``publish_events`` of one event at a time (latency p50 / p99 of a publish, one
after the other) and of batches (events per second, ``--batch`` events a publish). The
rows are medians over the rounds.

Usage:
    python bench/sentinel_wait.py --rounds 5 --publishes 2000 --batch 100
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from tideflow.bus import open_bus
from tideflow.bus.base import Bus
from tideflow.model.events import TaskCompleted
from tideflow.testing.topologies.redis_sentinel import RedisSentinel


def event(n: int) -> TaskCompleted:
    return TaskCompleted(
        event_id=f"ev-{n}", time=0.0, run_id=f"run-{n}", step_key="s", attempt=1, output=n
    )


async def singles(bus: Bus, count: int) -> list[float]:
    took = []
    for n in range(count):
        began = time.perf_counter()
        await bus.publish_events([event(n)])
        took.append(time.perf_counter() - began)
    return took


async def batches(bus: Bus, count: int, batch: int) -> float:
    began = time.perf_counter()
    for n in range(0, count, batch):
        await bus.publish_events([event(n + i) for i in range(batch)])
    return count / (time.perf_counter() - began)


async def measure(url: str, rounds: int, publishes: int, batch: int) -> None:
    buses: dict[str, Bus] = {}
    for wait in ("0", "1"):
        bus = open_bus(f"{url}?prefix=bench-{uuid.uuid4().hex[:8]}&partitions=16&wait={wait}")
        await bus.open()
        buses[f"wait={wait}"] = bus
    rows: dict[str, dict[str, list[float]]] = {
        name: {"p50": [], "p99": [], "eps": []} for name in buses
    }
    try:
        for round_ in range(rounds):
            order = list(buses) if round_ % 2 == 0 else list(reversed(buses))
            for name in order:
                took = sorted(await singles(buses[name], publishes))
                rows[name]["p50"].append(took[len(took) // 2] * 1e3)
                rows[name]["p99"].append(took[int(len(took) * 0.99)] * 1e3)
                rows[name]["eps"].append(await batches(buses[name], publishes * 10, batch))
    finally:
        for bus in buses.values():
            await bus.close()
    print(f"| bus | publish p50 ms | publish p99 ms | events/s in batches of {batch} |")
    print("| --- | --- | --- | --- |")
    for name, row in rows.items():
        print(
            f"| {name} | {statistics.median(row['p50']):.3f} | "
            f"{statistics.median(row['p99']):.3f} | {statistics.median(row['eps']):,.0f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--publishes", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=100)
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="tideflow-sentinel-") as tmp,
        RedisSentinel(Path(tmp)) as topology,
    ):
        asyncio.run(measure(topology.url, args.rounds, args.publishes, args.batch))


if __name__ == "__main__":
    main()
