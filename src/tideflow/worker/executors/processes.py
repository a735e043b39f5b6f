"""Process-group helpers shared by the executors that start processes.

Children are started with ``start_new_session=True``: each is the leader of its
own process group, so signalling the group reaches everything it started.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal


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
