"""bench/cluster.py, bench/idle.py and bench/scale.py keep working against a real cluster (their numbers
are read by people, not asserted here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _bench(script: str, *args: str) -> list[dict[str, object]]:
    done = subprocess.run(
        [sys.executable, f"bench/{script}", *args, "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


@pytest.mark.slow
def test_cluster_bench_runs_w1_on_redis_and_reports_dispatch_latency(
    postgres_url: str, redis_url: str
) -> None:
    rows = _bench(
        "cluster.py",
        *("--bus", "redis", "--only", "W1", "--only", "W1-1k", "--runs", "20", "--repeat", "1"),
        *("--warmup", "5"),
    )
    assert [(r["workload"], r["bus"], r["steps"]) for r in rows] == [
        ("W1", "redis", 200),
        ("W1-1k", "redis", 200),  # started at 100 runs/s: 20 runs take at least 0.19 s
    ]
    for row in rows:
        assert row["steps_per_s"] > 0  # type: ignore[operator]
        assert row["dispatch_n"] == 180  # 20 runs x 9 chained steps with an upstream
        assert row["p50_ms"] is not None and row["dispatch_p99_ms"] is not None
    assert rows[1]["seconds"] >= 0.19  # type: ignore[operator]


@pytest.mark.slow
def test_idle_bench_counts_the_servers_statements(postgres_url: str, redis_url: str) -> None:
    (result,) = _bench("idle.py", "--runs", "50", "--idle", "2", "--settle", "0.5")
    sql = result["sql_statements"]
    assert isinstance(sql, dict) and sql["total"] >= 1  # the engine lease is renewed every 2 s
    assert any("engine_leases" in text for text in sql["by"])
    assert result["runs"] == 50
    implied = result["sql_implied"]
    assert isinstance(implied, dict) and implied["other"] == 0
    assert sql["total"] <= implied["at_most"]  # the lease and the sweep, nothing else


@pytest.mark.slow
def test_idle_bench_counts_the_sweeps_statements(postgres_url: str, redis_url: str) -> None:
    (result,) = _bench(
        "idle.py", "--runs", "20", "--idle", "3", "--settle", "0.5", "--sweep-interval", "0.5"
    )
    implied = result["sql_implied"]
    assert isinstance(implied, dict) and implied["sweep"] >= 3  # a round at least
    assert implied["sweep"] <= implied["sweep_at_most"] and implied["other"] == 0


@pytest.mark.slow
def test_scale_bench_drains_a_burst_and_a_dag_burst_and_reports_every_row(
    postgres_url: str, redis_url: str
) -> None:
    (row,) = _bench(
        "scale.py",
        *("--bus", "redis", "--runs", "50", "--dag-runs", "2", "--w1-runs", "20"),
        *("--w1-warmup", "5", "--settle", "0.5", "--sample-interval", "0.5"),
    )
    report: Any = row  # nested JSON: read as it is
    assert (report["bus"], report["servers"], report["workers"]) == ("redis", 1, 2)
    assert report["w1"]["workload"] == "W1" and report["w1"]["steps"] == 200
    burst = report["burst"]
    assert (burst["runs"], burst["steps"]) == (50, 500)
    assert burst["statuses"] == {"succeeded": 50} and burst["all_succeeded"] is True
    assert burst["ratio_to_w1"] > 0 and burst["first_1pct_runs"] == 1
    # every chained step but the first of each run, in exactly one window of the drain
    assert sum(w["n"] for w in burst["dispatch"].values()) == 50 * 9
    assert set(burst["dispatch"]) == {"first_third", "middle_third", "last_third"}
    assert report["sweep_repairs"] == {"outbox": 0, "schedule_slot": 0, "start": 0, "timer": 0}
    assert [p["process"] for p in report["rss"]] == ["server-0", "worker-0", "worker-1"]
    assert all(p["after_warmup_mib"] > 0 and p["after_drain_mib"] > 0 for p in report["rss"])
    assert set(report["broker"]) == {"used_memory_mib"}
    assert report["broker"]["used_memory_mib"]["idle"] > 0
    assert report["database"]["after_mib"] >= report["database"]["before_mib"] > 0
    statements = report["pg_statements"]
    assert "error" in statements or statements["slow_count"] >= 0
    dag = report["dag"]
    assert dag["statuses"] == {"succeeded": 2} and dag["steps"] == 600
    assert dag["dispatch_first_10pct"]["n"] == dag["dispatch_last_10pct"]["n"] > 0
    finished = [s["finished"] for s in report["samples"]]
    assert finished and finished == sorted(finished)
