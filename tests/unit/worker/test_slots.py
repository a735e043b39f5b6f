"""The pool's attempt slots: handed on first come, first served, and a slot handed to a
waiter that was cancelled before it resumed is passed on, not lost."""

from __future__ import annotations

import asyncio

from tideflow.worker.pool import _Slots


async def test_a_slot_given_back_goes_to_the_oldest_waiter() -> None:
    slots = _Slots(1)
    assert slots.take() is None
    first, second = slots.take(), slots.take()
    assert first is not None and second is not None
    slots.give_back()
    assert first.done() and not second.done()
    assert slots.take() is not None  # a newcomer does not overtake the one still waiting


async def test_a_slot_handed_to_a_cancelled_waiter_is_passed_on() -> None:
    slots = _Slots(1)
    assert slots.take() is None
    waiter, next_waiter = slots.take(), slots.take()
    assert waiter is not None and next_waiter is not None

    async def wait() -> None:
        try:
            await waiter
        except asyncio.CancelledError:
            slots.forgo(waiter)
            raise

    attempt = asyncio.create_task(wait())
    await asyncio.sleep(0)
    slots.give_back()  # handed over ...
    attempt.cancel()  # ... and cancelled before it resumed
    await asyncio.gather(attempt, return_exceptions=True)
    assert next_waiter.done()


async def test_a_waiter_that_gives_up_takes_no_slot() -> None:
    slots = _Slots(1)
    assert slots.take() is None
    waiter = slots.take()
    assert waiter is not None
    slots.forgo(waiter)
    slots.give_back()
    assert slots.take() is None  # the slot came back free
    assert slots.take() is not None
