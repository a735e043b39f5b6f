"""The Bus port: moves task messages to workers and events to schedulers.

At-least-once: a task is removed only when acknowledged; events of one run are
applied in order by one scheduler at a time. The in-process backend keeps both
in memory; Redis Streams and NATS JetStream backends implement the same methods.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from tideflow.model.commands import DispatchTask
from tideflow.model.events import Event


class Bus(ABC):
    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    @abstractmethod
    async def publish_tasks(self, tasks: Sequence[DispatchTask]) -> None:
        """Queue tasks for workers, by their queue and priority."""

    @abstractmethod
    async def next_task(self) -> DispatchTask:
        """The next task to run, highest priority first; waits until there is one."""

    @abstractmethod
    async def publish_events(self, events: Sequence[Event]) -> None:
        """Deliver events to the scheduler."""

    @abstractmethod
    async def next_events(self, max_batch: int) -> list[Event]:
        """Wait for at least one event, then return every event available (up to max_batch)."""
