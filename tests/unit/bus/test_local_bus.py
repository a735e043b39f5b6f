"""The in-process bus's own bookkeeping: what a take looks at."""

from __future__ import annotations

from collections import deque
from typing import Any

from tideflow.bus.backends.local import LocalBus
from tideflow.bus.base import partition_of
from tideflow.model.events import CancelRequested


class Watched(deque[Any]):
    """A partition that counts how often a consumer asks whether it has events."""

    looks = 0

    def __len__(self) -> int:
        Watched.looks += 1
        return super().__len__()


async def test_an_event_take_looks_only_at_partitions_with_events() -> None:
    bus = LocalBus(partitions=16)
    bus.parts = [Watched() for _ in range(16)]
    first, second = (
        CancelRequested(event_id=f"e{n}", run_id=f"r{n}", time=0.0, reason="test") for n in (1, 2)
    )
    await bus.publish_events([first])
    batches = bus.consume_events(max_batch=10)
    assert (await anext(batches)).events == [first]  # (opening looks at every partition)
    Watched.looks = 0
    await bus.publish_events([second])
    batch = await anext(batches)
    assert batch.events == [second]
    assert Watched.looks <= 2  # the one partition with the event, not all 16
    assert bus.parts[partition_of("r2", 16)] == deque()
    await batches.aclose()
