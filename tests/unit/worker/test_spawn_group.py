"""spawn_group: a child started for a step never outlives a cancellation of its spawn."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from tideflow.worker.executors.processes import spawn_group


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def _until(condition: Any, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        await asyncio.sleep(0.02)
    return False


async def test_the_child_leads_a_group_of_its_own(tmp_path: Path) -> None:
    proc = await spawn_group(
        "sh", "-c", "echo $$ $(ps -o pgid= -p $$)", stdout=asyncio.subprocess.PIPE
    )
    out, _ = await proc.communicate()
    pid, pgid = out.decode().split()
    assert int(pid) == int(pgid) == proc.pid


async def test_cancelled_again_and_again_while_it_spawns_the_group_is_killed_all_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pidfile = tmp_path / "pid"
    release = asyncio.Event()
    real = asyncio.create_subprocess_exec

    async def slow_to_return(*args: Any, **kwargs: Any) -> asyncio.subprocess.Process:
        proc = await real(*args, **kwargs)
        await release.wait()  # as a loop still connecting the pipes
        return proc

    monkeypatch.setattr(asyncio, "create_subprocess_exec", slow_to_return)
    task = asyncio.create_task(spawn_group("sh", "-c", f"sleep 30 & echo $! > {pidfile}; wait"))
    assert await _until(lambda: pidfile.exists() and pidfile.read_text().strip())
    for _ in range(3):  # each waits for the spawn, none cuts the kill short
        task.cancel()
        await asyncio.sleep(0.02)
    assert not task.done()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await _until(lambda: not _alive(int(pidfile.read_text())))


async def test_a_spawn_that_fails_raises_its_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        await spawn_group(str(tmp_path / "no-such-program"))
