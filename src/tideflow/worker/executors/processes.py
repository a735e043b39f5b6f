"""Process-group helpers shared by the executors that start processes.

Children are started with ``start_new_session=True`` (`spawn_group`): each is the leader
of its own process group, so signalling the group reaches everything it started.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from typing import Any

from tideflow.bus.closing import unstoppable


async def spawn_group(program: str, *args: str, **kwargs: Any) -> asyncio.subprocess.Process:
    """``asyncio.create_subprocess_exec`` with the child leading a new process group.

    The child runs before the call returns (the event loop still connects its pipes): one
    cancelled meanwhile (a timeout, a cancelled run) would leave it, and whatever it
    started, running with nobody to stop it. So the spawn runs in a task of its own; a
    cancellation waits for it, kills the new group and reaps its leader, then goes on.
    """
    spawning = asyncio.ensure_future(
        asyncio.create_subprocess_exec(program, *args, start_new_session=True, **kwargs)
    )
    try:
        return await asyncio.shield(spawning)
    except asyncio.CancelledError:
        await unstoppable(lambda: _kill_spawned(spawning))
        raise


async def _kill_spawned(spawning: asyncio.Future[asyncio.subprocess.Process]) -> None:
    try:
        proc = await spawning
    except Exception:  # it did not start: nothing to kill
        return
    signal_group(proc.pid, signal.SIGKILL)
    await proc.wait()
    close_transport(proc)


def signal_group(pgid: int, sig: signal.Signals) -> None:
    """Send ``sig`` to process group ``pgid``; nothing when the group is gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


async def terminate_group(proc: asyncio.subprocess.Process, grace: float) -> None:
    """SIGTERM the group, give the leader ``grace`` seconds, then SIGKILL the group and reap."""
    if proc.returncode is None:
        signal_group(proc.pid, signal.SIGTERM)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace):
                await proc.wait()
    # Also after the leader exited: descendants may have ignored SIGTERM.
    signal_group(proc.pid, signal.SIGKILL)
    await proc.wait()


def close_transport(proc: asyncio.subprocess.Process) -> None:
    """Close the subprocess transport (kills the leader if still running).

    asyncio has no public way to do this; without it, a pipe held open by an escaped
    descendant would leave an unclosed transport behind.
    """
    transport = getattr(proc, "_transport", None)
    if transport is not None:
        transport.close()
