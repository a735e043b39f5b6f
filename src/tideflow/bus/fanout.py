"""The fan-out channels every backend hands out (control messages, run ends): one queue
per stream, fed by the bus's single subscription (or, in process, by the publish call)
from the moment the stream is created, not from its first ``anext``; and the wire form
of a batch of run ends, which the broker backends share."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from typing import Generic, TypeVar

import orjson

from tideflow.bus.base import RunEnded

T = TypeVar("T")


class FanOut(Generic[T]):
    """The open streams of one channel; ``put`` hands an item to each of them."""

    __slots__ = ("_queues",)

    def __init__(self) -> None:
        self._queues: list[asyncio.Queue[T]] = []

    def __bool__(self) -> bool:
        """Whether a stream is open."""
        return bool(self._queues)

    def stream(self) -> FanOutStream[T]:
        """A new stream, fed from now on."""
        return FanOutStream(self._queues)

    def put(self, items: Iterable[T]) -> None:
        for item in items:
            for queue in self._queues:
                queue.put_nowait(item)


class FanOutStream(Generic[T]):
    def __init__(self, subscribers: list[asyncio.Queue[T]]) -> None:
        self._queue: asyncio.Queue[T] = asyncio.Queue()
        self._subscribers = subscribers
        subscribers.append(self._queue)

    def __aiter__(self) -> FanOutStream[T]:
        return self

    async def __anext__(self) -> T:
        return await self._queue.get()

    async def aclose(self) -> None:
        if self._queue in self._subscribers:
            self._subscribers.remove(self._queue)


class MalformedEnds(ValueError):
    """A run-end message this bus cannot read (the message says why)."""


def encode_run_ends(ends: Sequence[RunEnded]) -> bytes:
    """One message for a batch of ends: ``{"ends": [[run_id, status], ...]}``."""
    return orjson.dumps({"ends": [[end.run_id, end.status] for end in ends]})


def decode_run_ends(raw: bytes) -> list[RunEnded]:
    """The ends of a message; ``MalformedEnds`` for anything else (all or nothing)."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise MalformedEnds(f"not JSON ({exc})") from None
    pairs = data.get("ends") if isinstance(data, dict) else None
    if not isinstance(pairs, list):
        raise MalformedEnds('not an object with a list "ends"')
    ends = []
    for pair in pairs:
        if (
            not isinstance(pair, list)
            or len(pair) != 2
            or not all(isinstance(part, str) and part for part in pair)
        ):
            raise MalformedEnds(f"an end is not [run_id, status] but {pair!r:.100}")
        ends.append(RunEnded(pair[0], pair[1]))
    return ends


__all__ = ["FanOut", "FanOutStream", "MalformedEnds", "decode_run_ends", "encode_run_ends"]
