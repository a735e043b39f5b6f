"""Helpers of the tests that start processes: whether a pid still runs, waiting for a
condition, and spawns that return late."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie waiting for its parent."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def eventually(condition: Callable[[], object], timeout: float = 5.0) -> bool:
    """Whether ``condition()`` holds within ``timeout`` seconds (polled)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        await asyncio.sleep(0.02)
    return False


def spawns_return_late(monkeypatch: pytest.MonkeyPatch) -> asyncio.Event:
    """Have ``asyncio.create_subprocess_exec`` start the child at once but return only
    once the event it gives is set, as a loop still connecting the child's pipes: a
    cancellation then comes while the child runs and its spawn has not returned."""
    release = asyncio.Event()
    real = asyncio.create_subprocess_exec

    async def late(*args: Any, **kwargs: Any) -> asyncio.subprocess.Process:
        proc = await real(*args, **kwargs)
        await release.wait()
        return proc

    monkeypatch.setattr(asyncio, "create_subprocess_exec", late)
    return release
