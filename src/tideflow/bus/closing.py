"""Stopping what talks to a broker or a database: a stream's cleanup run to its end even
when its consumer is cancelled meanwhile (``unstoppable``), a task cancelled until it
is over (``cancel_and_wait``), and a loop that ends at a cancel its client library
dropped (``cancels_asked`` and ``raise_dropped_cancel``).

A stream that closes hands back what it held (tasks not acknowledged, a batch not
committed), withdraws its reader's presence and releases its partition locks: network
calls that take a while. Its consumer may be cancelled during them, and again: the
scheduler cancels a read that ignored its cancel every half second (nats-py can swallow
one), and a stop can come on top of a partition change. Cut short, a cleanup left the
partition locks held until their TTL (the next stream on them was refused: "consumed by
another consumer already") and tasks unacknowledged until their lease ran out.

A single cancel does not always stop a task: on Python 3.11 ``asyncio.wait_for``
returns the answer of a request whose answer came in the same turn as the cancel, and
drops the cancel. nats-py and asyncpg wait for their answers so; a presence renewer
cancelled as its renewal was answered went on renewing, and the reader's close waited
for it for ever.

redis-py sends every command under such a ``wait_for``: a cancel that comes in the turn
its command has been written is dropped, and the reply is read as if none had come. The
task runs on with the cancel still counted (``Task.cancelling``), so a loop of the bus
compares that count with the one it started with at each turn and raises the cancel
itself (``raise_dropped_cancel``): a Redis task reader's ``anext`` cancelled so went on
waiting for tasks for ever, and the test that awaited it hung until CI killed its worker.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

CANCEL_AGAIN = 0.5
"""Seconds ``cancel_and_wait`` gives a cancel before it cancels again."""


async def unstoppable(*steps: Callable[[], Awaitable[None]]) -> None:
    """Run ``steps`` in order, in a task of their own, to their end; a cancellation of the
    caller meanwhile waits for them and is raised after. An error of a step ends them and
    is raised, as it would be without this."""
    cleanup = asyncio.ensure_future(_in_order(steps))
    cancelled = False
    while True:
        try:
            await asyncio.shield(cleanup)
        except asyncio.CancelledError:
            if cleanup.done():
                raise
            cancelled = True
            continue
        break
    if cancelled:
        raise asyncio.CancelledError


async def _in_order(steps: tuple[Callable[[], Awaitable[None]], ...]) -> None:
    for step in steps:
        await step()


async def cancel_and_wait(*tasks: asyncio.Future[Any]) -> None:
    """Cancel ``tasks`` and return once they are over, cancelling again every
    ``CANCEL_AGAIN`` seconds those that run on (a cancel a client library dropped). A
    cancel of the caller meanwhile is raised once they are over. The first error a task
    ended with is raised, as ``await task`` would; their cancellation is not."""
    stopped = False
    while running := [task for task in tasks if not task.done()]:
        for task in running:
            task.cancel()
        try:
            await asyncio.wait(running, timeout=CANCEL_AGAIN)
        except asyncio.CancelledError:
            stopped = True
    errors = [task.exception() for task in tasks if not task.cancelled()]
    if stopped:
        raise asyncio.CancelledError
    for error in errors:
        if error is not None:
            raise error


def cancels_asked() -> int:
    """How many cancels of the current task are asked and not withdrawn
    (``Task.cancelling``; 0 outside a task): what ``raise_dropped_cancel`` compares with."""
    task = asyncio.current_task()
    return 0 if task is None else task.cancelling()


def raise_dropped_cancel(asked: int) -> None:
    """Raise ``CancelledError`` if the current task has been asked to cancel more often
    than ``asked`` (what ``cancels_asked`` said before) and runs on all the same: a client
    library dropped the cancel (a timeout's own cancel, which ``asyncio.timeout`` takes
    back, leaves the count where it was). A loop calls it at each turn, at a point where
    what it holds is recorded, so that its cleanup hands that back."""
    if cancels_asked() > asked:
        raise asyncio.CancelledError
