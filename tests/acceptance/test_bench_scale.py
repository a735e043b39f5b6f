"""bench/scale.py works end to end at a tiny size, and reads PostgreSQL's log right (its
numbers are read by people, not asserted here)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _scale_module() -> ModuleType:
    sys.path.insert(0, str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location("bench_scale", ROOT / "bench" / "scale.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_scale_bench_drains_a_burst_and_a_dag_burst_and_reports_every_row(
    postgres_url: str, redis_url: str
) -> None:
    done = subprocess.run(
        [
            *(sys.executable, "bench/scale.py", "--json", "--bus", "redis", "--runs", "50"),
            *("--dag-runs", "2", "--w1-runs", "20", "--w1-warmup", "5", "--settle", "0.5"),
            *("--sample-interval", "0.5"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    (report,) = [json.loads(line) for line in done.stdout.splitlines()]
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


def test_pg_log_counts_one_databases_statements_and_weighs_the_sample(tmp_path: Path) -> None:
    scale = _scale_module()
    log = tmp_path / "postgresql.log"
    prefix = "2026-12-07 21:00:00.000 UTC [42] root@"
    lines = ["old line before the window\n"]
    start = len(lines[0])
    # 200 sampled statements under 10 ms at a 10% sample: they stand for 2,000
    lines += [
        f"{prefix}bench LOG:  duration: {1 + i / 100:.2f} ms  execute s{i}: SELECT {i}\n"
        for i in range(200)
    ]
    # 30 slow ones, logged in full; one a multi-line statement opening with a comment
    lines += [f"{prefix}bench LOG:  duration: 12.5 ms  statement: COMMIT\n"] * 29
    lines += [
        f"{prefix}bench LOG:  duration: 40.0 ms  execute <unnamed>: -- a batch\n",
        "\t-- in one statement\n",
        "\tSELECT tideflow_commit($1::jsonb)\n",
        f"{prefix}other LOG:  duration: 99.0 ms  statement: SELECT pg_sleep(1)\n",
        "\tof another database\n",
        f"{prefix}bench LOG:  duration: 50.0 ms  parse s9: SELECT 9\n",  # not a statement's
    ]
    log.write_text("".join(lines))
    report = scale.PgLog(str(log), "bench", 0.1).report(start)
    assert report["slow_count"] == 30 and report["sampled"] == 200
    assert report["statements_estimated"] == 2030
    # rank 0.99 x 2030 = 2009.7 > 2000: the p99 is among the slow ones
    assert report["p99_ms"] == 12.5 and report["p99_under_10ms"] is False
    assert report["slowest"][0] == {"statement": "COMMIT", "count": 29, "max_ms": 12.5}
    assert report["slowest"][1]["statement"] == "SELECT tideflow_commit($1::jsonb)"

    quiet = scale.PgLog(str(log), "bench", 1.0).report(start)  # the same lines, all sampled
    assert quiet["statements_estimated"] == 230
    assert quiet["p99_ms"] == 12.5  # rank 227.7: the 28th of the 30 slow ones
    assert quiet["slow_share"] == round(30 / 230, 5)

    missing = scale.PgLog(str(tmp_path / "none.log"), "bench", 0.1).report(0)
    assert missing["error"].startswith("cannot read the PostgreSQL log")
