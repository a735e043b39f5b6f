"""spawn_group: a child started for a step never outlives a cancellation of its spawn."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from tests.processes import alive, eventually, spawns_return_late

from tideflow.worker.executors.processes import spawn_group


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
    release = spawns_return_late(monkeypatch)
    task = asyncio.create_task(spawn_group("sh", "-c", f"sleep 30 & echo $! > {pidfile}; wait"))
    assert await eventually(lambda: pidfile.exists() and pidfile.read_text().strip())
    for _ in range(3):  # each waits for the spawn, none cuts the kill short
        task.cancel()
        await asyncio.sleep(0.02)
    assert not task.done()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await eventually(lambda: not alive(int(pidfile.read_text())))


async def test_a_spawn_that_fails_raises_its_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        await spawn_group(str(tmp_path / "no-such-program"))
