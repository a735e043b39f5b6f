"""The gateway benchmark keeps working (its numbers are read by people)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("batch", [1, 5])
def test_bench_gateway_wakes_every_run_by_its_own_event(batch: int) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "bench/gateway.py",
            "--runs",
            "20",
            "--concurrency",
            "4",
            "--batch",
            f"{batch}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    row = json.loads(done.stdout)
    assert row["runs"] == 20 and row["woken_by_the_wrong_event"] == 0
    assert row["statuses"] == {"delivered": 20}
    assert row["accepted_events_per_s"] > 0 and row["server_cpu_ms_per_event"] > 0
