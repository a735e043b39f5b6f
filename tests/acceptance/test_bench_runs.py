"""The benchmark script keeps working (its numbers are read by people, not asserted here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_script_runs_and_reports_rows() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "bench/run.py",
            "--only",
            "W3",
            "--only",
            "W1-seq",
            "--repeat",
            "1",
            "--json",
            "--store",
            "sqlite",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(r["workload"], r["store"], r["steps"]) for r in rows] == [
        ("W3", "sqlite", 300),
        ("W1-seq", "sqlite", 2000),
    ]
    assert all(r["steps_per_s"] > 0 for r in rows)
    assert rows[1]["p50_ms"] is not None
