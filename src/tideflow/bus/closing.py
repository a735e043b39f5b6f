"""A broker stream's cleanup, run to its end even when its consumer is cancelled meanwhile.

A stream that closes hands back what it held (tasks not acknowledged, a batch not
committed), withdraws its reader's presence and releases its partition locks: network
calls that take a while. Its consumer may be cancelled during them, and again: the
scheduler cancels a read that ignored its cancel every half second (nats-py can swallow
one), and a stop can come on top of a partition change. Cut short, a cleanup left the
partition locks held until their TTL (the next stream on them was refused: "consumed by
another consumer already") and tasks unacknowledged until their lease ran out.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable


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
