"""A real `tideflow server --sweep-interval` starts a run a client stored but could not
publish the start of (its broker refused every publish): the run is not stranded
`pending` until the next server start."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Collection, Sequence
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from harness import FLOWS, Cluster  # noqa: E402

from tideflow import Client  # noqa: E402
from tideflow.bus.base import (  # noqa: E402
    Bus,
    Control,
    Delivery,
    EventBatch,
    Message,
    QueueStats,
    RunEnded,
    Stream,
    WorkerBeat,
)
from tideflow.model.commands import DispatchTask  # noqa: E402
from tideflow.model.events import Event  # noqa: E402

pytestmark = [pytest.mark.timeout(120)]


class GoneBroker(Bus):
    """A client's bus whose broker refuses every publish (this client consumes nothing)."""

    async def publish_events(self, events: Sequence[Event | Message[Event]]) -> None:
        raise ConnectionError("the broker connection was reset")

    async def publish_tasks(self, tasks: Sequence[DispatchTask | Message[DispatchTask]]) -> None:
        raise ConnectionError("the broker connection was reset")

    async def publish_control(self, message: Control) -> None:
        raise ConnectionError("the broker connection was reset")

    async def publish_run_ends(self, ends: Sequence[RunEnded]) -> None:
        raise ConnectionError("the broker connection was reset")

    def consume_tasks(
        self, queues: Collection[str] | None = None, *, prefetch: int, worker: str | None = None
    ) -> Stream[Delivery[DispatchTask]]:
        raise NotImplementedError

    def consume_events(
        self, partitions: Collection[int] | None = None, *, max_batch: int
    ) -> Stream[EventBatch]:
        raise NotImplementedError

    def consume_control(self) -> Stream[Control]:
        raise NotImplementedError

    async def run_ends(self) -> Stream[RunEnded]:
        raise ConnectionError("the broker connection was reset")

    async def queue_stats(self) -> list[QueueStats]:
        raise ConnectionError("the broker connection was reset")

    async def worker_beats(self) -> list[WorkerBeat]:
        raise ConnectionError("the broker connection was reset")


async def _start_unpublished(cluster: Cluster) -> str:
    async with Client.connect(cluster.store, GoneBroker()) as client:
        plan = await client.register(FLOWS / "chain.yaml")
        run_id = await client.start(plan.name, {"x": 5})
        assert (await client.summary(run_id)).status == "pending"
        return run_id


async def _wait(cluster: Cluster, run_id: str) -> tuple[str, object]:
    async with Client.connect(cluster.store, cluster.bus) as client:
        result = await client.wait(run_id, timeout=60)
        return result.status, result.output


@pytest.mark.slow
def test_the_servers_sweep_starts_a_run_whose_start_the_client_could_not_publish(
    cluster: Cluster,
) -> None:
    server = cluster.server("--sweep-interval", "0.5")
    cluster.worker()
    run_id = asyncio.run(_start_unpublished(cluster))
    assert asyncio.run(_wait(cluster, run_id)) == ("succeeded", 116)
    server.wait_log("1 pending run(s) whose start was lost admitted")
