"""`unstoppable`: a broker stream's cleanup runs to its end whatever cancels its consumer.
`cancel_and_wait`: a task that drops a cancel (as a client library's ``wait_for`` does on
Python 3.11 when the answer comes in the same turn) is cancelled again until it is over.
`raise_dropped_cancel`: a loop raises such a cancel itself at its next turn."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from tideflow.bus import closing, presence
from tideflow.bus.closing import (
    cancel_and_wait,
    cancels_asked,
    raise_dropped_cancel,
    unstoppable,
)

WITHIN = 5.0


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


async def drops_one_cancel(answered: asyncio.Event, log: list[str]) -> None:
    """What nats-py's request under a 3.11 ``wait_for`` does when its answer and a cancel
    come in the same turn: the answer is returned, the cancel is gone."""
    try:
        answered.set()
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        log.append("cancel dropped")
    await asyncio.Event().wait()  # on to the next wait, as a renewer's sleep


async def test_a_task_that_drops_a_cancel_is_cancelled_again_until_it_is_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(closing, "CANCEL_AGAIN", 0.01)
    answered, log = asyncio.Event(), []
    task = asyncio.create_task(drops_one_cancel(answered, log))
    await answered.wait()
    async with asyncio.timeout(WITHIN):
        await cancel_and_wait(task)
    assert task.cancelled() and log == ["cancel dropped"]


async def test_a_cancel_of_the_caller_comes_once_the_tasks_are_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(closing, "CANCEL_AGAIN", 0.01)
    answered, log = asyncio.Event(), []
    tasks = [asyncio.create_task(drops_one_cancel(answered, log)) for _ in range(2)]
    await answered.wait()
    stopping = asyncio.create_task(cancel_and_wait(*tasks))
    await asyncio.sleep(0)  # it has cancelled them once
    stopping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopping
    assert all(task.cancelled() for task in tasks)


async def test_the_first_error_a_task_ended_with_comes_out() -> None:
    async def fails(message: str) -> None:
        raise ConnectionError(message)

    tasks = [asyncio.create_task(fails(m)) for m in ("first", "second")]
    tasks.append(asyncio.create_task(asyncio.Event().wait()))
    await asyncio.sleep(0)
    with pytest.raises(ConnectionError, match="first"):
        await cancel_and_wait(*tasks)
    assert tasks[2].cancelled()
    await cancel_and_wait()  # none: nothing to wait for


class _DroppingPresence(presence.Presence):
    """A presence whose renewal drops the cancel that stops it (seen on NATS: a reader's
    close waited for its renewer for ever, and a CI worker was killed 120 s later)."""

    renewer_name = "test-presence"

    def __init__(self) -> None:
        super().__init__(lease=0.03)
        self.announced = asyncio.Event()
        self.renewing = asyncio.Event()
        self.withdrawn = False
        self.dropped = 0

    async def announce(self) -> None:
        if not self.announced.is_set():
            self.announced.set()
            return
        self.renewing.set()
        try:
            await asyncio.sleep(3600)  # a renewal on its way
        except asyncio.CancelledError:
            self.dropped += 1  # answered in the same turn: returned as if not cancelled

    async def withdraw(self) -> None:
        self.withdrawn = True


async def test_a_presence_whose_renewal_dropped_the_cancel_still_stops(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(closing, "CANCEL_AGAIN", 0.01)
    reader = _DroppingPresence()
    await reader.start()
    async with asyncio.timeout(WITHIN):
        await reader.renewing.wait()
    stopping = asyncio.create_task(reader.stop())
    await asyncio.wait((stopping,), timeout=WITHIN)  # not a cancel: that would stop it
    assert stopping.done(), "the stop waits for a renewer that dropped its cancel"
    await stopping
    assert reader.withdrawn and reader.dropped == 1


async def test_a_loop_raises_a_cancel_its_library_dropped_at_its_next_turn() -> None:
    """What redis-py's commands do under Python 3.11's ``wait_for``: the answer comes back
    and the cancel that came in the same turn is gone, but still counted by the task."""
    answered, log = asyncio.Event(), []
    turns = 0

    async def loop() -> None:
        nonlocal turns
        asked = cancels_asked()
        while True:
            raise_dropped_cancel(asked)
            turns += 1
            if turns == 1:
                await drops_cancel_once(answered, log)
            await asyncio.sleep(0)  # a wait that would take a cancel: none comes again

    task = asyncio.create_task(loop())
    await answered.wait()
    task.cancel()
    await asyncio.wait((task,), timeout=WITHIN)  # one cancel, never again
    assert task.cancelled(), "the loop ran on after the cancel its library dropped"
    assert log == ["cancel dropped"] and turns == 1


async def drops_cancel_once(answered: asyncio.Event, log: list[str]) -> None:
    try:
        answered.set()
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        log.append("cancel dropped")  # returned as if answered


async def test_a_timeout_taken_back_or_a_cancel_asked_before_is_not_a_dropped_cancel() -> None:
    async def body() -> int:
        asked = cancels_asked()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(0):
                await asyncio.sleep(1)  # the timeout cancels the task, then takes it back
        raise_dropped_cancel(asked)
        return cancels_asked()

    assert await asyncio.create_task(body()) == 0

    async def cancelled_before() -> int:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(1)  # a cancel taken here, not withdrawn: counted
        asked = cancels_asked()
        await asyncio.sleep(0)
        raise_dropped_cancel(asked)  # nothing new since
        return asked

    task = asyncio.create_task(cancelled_before())
    await asyncio.sleep(0)
    task.cancel()
    assert await task == 1
    assert cancels_asked() == 0


async def test_a_presence_renewer_ends_at_the_cancel_its_renewal_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without the second cancel of ``cancel_and_wait``: the renewer raises the cancel its
    broker client dropped at its next turn."""
    monkeypatch.setattr(closing, "CANCEL_AGAIN", 3600.0)
    reader = _DroppingPresence()
    await reader.start()
    async with asyncio.timeout(WITHIN):
        await reader.renewing.wait()
    renewer = reader._renewer
    assert renewer is not None
    stopping = asyncio.create_task(reader.stop())
    await asyncio.wait((stopping,), timeout=WITHIN)
    ended = stopping.done()
    async with asyncio.timeout(WITHIN):  # (a renewer that ran on: until a cancel is taken)
        while not stopping.done():
            renewer.cancel()
            await asyncio.wait((stopping,), timeout=0.01)
    await stopping
    assert ended, "the renewer ran on after the cancel its renewal dropped"
    assert reader.withdrawn and reader.dropped == 1
