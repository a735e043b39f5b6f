"""The control stream every backend hands out: one queue per ``consume_control`` call,
fed by the bus's single subscription (or, in process, by ``publish_control``) from the
moment the stream is created, not from its first ``anext``."""

from __future__ import annotations

import asyncio

from tideflow.bus.base import Control


class ControlStream:
    def __init__(self, subscribers: list[asyncio.Queue[Control]]) -> None:
        self._queue: asyncio.Queue[Control] = asyncio.Queue()
        self._subscribers = subscribers
        subscribers.append(self._queue)

    def __aiter__(self) -> ControlStream:
        return self

    async def __anext__(self) -> Control:
        return await self._queue.get()

    async def aclose(self) -> None:
        if self._queue in self._subscribers:
            self._subscribers.remove(self._queue)
