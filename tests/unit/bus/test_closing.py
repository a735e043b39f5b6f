"""`unstoppable`: a broker stream's cleanup runs to its end whatever cancels its consumer."""

from __future__ import annotations

import asyncio

import pytest

from tideflow.bus.closing import unstoppable


async def test_a_cleanup_cancelled_again_and_again_runs_to_its_end_then_the_cancel_comes() -> None:
    done: list[str] = []
    started = asyncio.Event()

    async def hand_back() -> None:
        started.set()
        await asyncio.sleep(0.1)
        done.append("handed back")

    async def release() -> None:
        await asyncio.sleep(0.05)
        done.append("released")

    task = asyncio.create_task(unstoppable(hand_back, release))
    await started.wait()
    for _ in range(3):
        task.cancel()
        await asyncio.sleep(0.02)
    with pytest.raises(asyncio.CancelledError):
        await task
    assert done == ["handed back", "released"]


async def test_a_cleanup_left_alone_returns_and_an_error_of_a_step_comes_out() -> None:
    done: list[str] = []

    async def first() -> None:
        done.append("first")

    async def fails() -> None:
        raise ConnectionError("the broker went away")

    async def never() -> None:
        done.append("never")

    await unstoppable(first)
    with pytest.raises(ConnectionError, match="went away"):
        await unstoppable(first, fails, never)
    assert done == ["first", "first"]
