"""A timed wait that is cancelled as what it waits for happens is cancelled all the same.

On Python 3.11 ``asyncio.wait_for`` returns the result when the awaited thing finished in
the same turn as the cancellation, and the cancellation is lost: a Redis task reader whose
``anext`` was cancelled so went on waiting for tasks for ever (seen in CI). Every timed wait
of the package is ``asyncio.timeout`` now (ruff bans ``asyncio.wait_for`` in src/, TID251).
"""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("redis")
from tideflow.bus.backends.redis_consumers import wait_until_set


async def test_a_wait_cancelled_as_its_event_is_set_is_cancelled() -> None:
    event = asyncio.Event()
    waiting = asyncio.ensure_future(wait_until_set(event, 10.0))
    for _ in range(3):  # it waits on the event now
        await asyncio.sleep(0)
    event.set()
    waiting.cancel()  # in the same turn
    with pytest.raises(asyncio.CancelledError):
        await waiting


async def test_a_wait_ends_at_its_timeout_or_when_its_event_is_set() -> None:
    event = asyncio.Event()
    await wait_until_set(event, 0.01)  # the timeout: no error
    assert not event.is_set()
    waiting = asyncio.ensure_future(wait_until_set(event, 10.0))
    await asyncio.sleep(0)
    event.set()
    await asyncio.wait_for(waiting, 5.0)
