"""A test that hangs in a pytest-xdist worker is reported with what it waited for: the
asyncio tasks of its loop, on the worker's stderr, which the controller prints
(``tests/hangs.py``). Before, CI printed only "node down: Not properly terminated"."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

HANGING = """
import asyncio

async def waits_for_nothing():
    await asyncio.Event().wait()

async def test_hangs():
    await asyncio.create_task(waits_for_nothing(), name="the-waiter")
"""


def test_a_hung_test_in_a_worker_is_reported_with_its_asyncio_tasks(tmp_path: Path) -> None:
    (tmp_path / "test_hang.py").write_text(HANGING)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "tests.hangs",
            "-p",
            "no:cacheprovider",
            "-n",
            "1",
            "-o",
            "timeout=1",
            "-o",
            "timeout_method=thread",
            "-o",
            "asyncio_mode=auto",
            "test_hang.py",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert "test_hang.py::test_hangs timed out" in out, out
    assert "asyncio tasks of" in out, out
    assert "name='the-waiter'" in out and "in waits_for_nothing" in out, out
