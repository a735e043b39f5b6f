"""The correlation benchmark keeps working (its numbers are read by people)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_correlate_runs_and_reports_events_per_second() -> None:
    done = subprocess.run(
        [sys.executable, "bench/correlate.py", "--runs", "20", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    row = json.loads(done.stdout)
    assert row["runs"] == 20 and row["events_per_s"] > 0
