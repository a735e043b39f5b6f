"""The benchmark script keeps working (its numbers are read by people, not asserted here)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _python(*argv: str) -> subprocess.CompletedProcess[str]:
    """``python ARGV…`` in the project's root, its output captured (5 minutes at most)."""
    return subprocess.run(
        [sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )


def test_bench_script_runs_and_reports_rows_for_both_step_kinds() -> None:
    done = _python(
        *("bench/run.py", "--only", "W3", "--only", "W1-seq"),
        *("--repeat", "1", "--json", "--store", "sqlite"),
    )
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(r["workload"], r["store"], r["step_type"], r["steps"]) for r in rows] == [
        ("W3", "sqlite", "noop", 300),
        ("W1-seq", "sqlite", "noop", 2000),
        ("W3", "sqlite", "python", 300),
        ("W1-seq", "sqlite", "python", 2000),
    ]
    assert all(r["steps_per_s"] > 0 for r in rows)
    assert rows[1]["p50_ms"] is not None and rows[3]["p50_ms"] is not None
    assert {r["loop"] for r in rows} == {"uvloop"}  # the commands' loop, by default


def test_bench_rows_say_which_event_loop_they_ran_on() -> None:
    """``--loop asyncio`` measures on the standard library's loop, and the row says so:
    checked in the process, on the loop the measurement's coroutine ran on."""
    probe = """
import asyncio, sys
sys.path.insert(0, "bench")
import run
seen = set()
runs = run._runs
async def noting(*args, **kwargs):
    seen.add(type(asyncio.get_running_loop()).__module__.split(".")[0])
    return await runs(*args, **kwargs)
run._runs = noting
run.main(["--only", "W2", "--steps", "noop", "--repeat", "1", "--json", "--loop", "asyncio"])
print(sorted(seen))
"""
    done = _python("-c", probe)
    assert done.returncode == 0, done.stderr
    row, seen = done.stdout.splitlines()
    assert json.loads(row)["loop"] == "asyncio"
    assert seen == "['asyncio']"


def test_python_rows_call_the_plain_function_through_start_run() -> None:
    """The python rows run `python` steps calling bench_steps:step (a module-level sync
    function), each run submitted with Runtime.start_run: counted in the process itself."""
    probe = """
import sys
sys.path.insert(0, "bench")
import bench_steps, run
from tideflow.runtime.runtime import Runtime
calls, starts = [0], [0]
step = bench_steps.step
def counted():
    calls[0] += 1
    return step()
bench_steps.step = counted
start_run = Runtime.start_run
async def counted_start(self, *args, **kwargs):
    starts[0] += 1
    return await start_run(self, *args, **kwargs)
Runtime.start_run = counted_start
run.main(["--only", "W1-seq", "--steps", "python", "--repeat", "1", "--json"])
print(calls[0], starts[0])
"""
    done = _python("-c", probe)
    assert done.returncode == 0, done.stderr
    *rows, counts = done.stdout.splitlines()
    assert json.loads(rows[0])["step_type"] == "python"
    assert counts == "2000 200"  # 200 runs x 10 steps, each run started on its own


def test_the_ab_script_runs_each_tree_s_own_code(tmp_path: Path) -> None:
    """bench/ab.py measures a row with each tree's own bench/run.py and src/: a copy whose
    W2 fans out to 10 steps instead of 1,000 reports its own step count."""
    base = tmp_path / "base"
    shutil.copytree(ROOT / "src", base / "src", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "bench", base / "bench", ignore=shutil.ignore_patterns("__pycache__"))
    run_py = base / "bench" / "run.py"
    text = run_py.read_text()
    assert '"W2": lambda kind: (fan(1000, kind), 1, 1)' in text
    run_py.write_text(text.replace("fan(1000, kind)", "fan(10, kind)"))
    done = _python(
        *("bench/ab.py", str(base), "."),
        *("--only", "W2", "--steps", "noop", "--rounds", "1", "--json"),
    )
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(line["tree"], line["steps"], line["rounds"]) for line in lines] == [
        (str(base), 11, 1),
        (".", 1001, 1),
    ]
    assert all(line["steps_per_s"] > 0 and line["loop_us_per_step"] > 0 for line in lines)


def test_the_waiting_runs_benchmark_reports_a_cache_bounded_engine() -> None:
    """bench/waiting.py (the 100,000-waiting-runs measurement, run small here): a fresh
    engine on a store of waiting runs holds no more idle runs than its cache size."""
    done = _python(
        *("bench/waiting.py", "--store", "sqlite"),
        *("--runs", "300", "--cache", "50", "--touch", "120"),
    )
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [(r["store"], r["cache"], r["touched"]) for r in rows] == [("sqlite", 50, 120)]
    assert 0 < rows[0]["cached_runs"] <= 50
    assert rows[0]["start_s"] > 0 and rows[0]["peak_rss_mb"] > 0


def test_the_machine_probe_reports_what_the_rows_stand_on() -> None:
    """bench/machine.py measures the machine below the engine: every figure is there and
    positive, and the CPU count is the process's own."""
    done = _python("bench/machine.py", "--json", "--count", "50")
    assert done.returncode == 0, done.stderr
    machine = json.loads(done.stdout)
    assert machine["cpus"] == len(os.sched_getaffinity(0))
    assert machine["loop"] == "uvloop"  # the commands' loop, by default
    assert machine["handoff_us"] > 0 and machine["sqlite_commit_us"] > 0
    assert machine["python_ms"] > 0
    if machine["cpus"] > 1:
        assert machine["handoff_one_cpu_us"] > 0
    else:
        assert machine["handoff_one_cpu_us"] is None
    refused = _python("bench/machine.py", "--count", "5")
    assert refused.returncode == 2 and "--count must be at least 10" in refused.stderr


def test_the_one_cpu_hand_off_runs_both_threads_on_one_cpu_and_restores_the_set() -> None:
    """The thread that answers runs on the one CPU the loop's thread was put on, and the
    loop's thread gets its whole CPU set back afterwards: checked in the process."""
    probe = """
import os, sys
sys.path.insert(0, "bench")
import machine
seen = []
serve = machine._server
def noting(calls):
    seen.append(sorted(os.sched_getaffinity(0)))
    return serve(calls)
machine._server = noting
before = sorted(os.sched_getaffinity(0))
result = machine.handoff_one_cpu(20, "uvloop")
print(len(before), seen, result is not None, sorted(os.sched_getaffinity(0)) == before)
"""
    done = _python("-c", probe)
    assert done.returncode == 0, done.stderr
    cpus, rest = done.stdout.split(" ", 1)
    if int(cpus) < 2:
        assert rest.strip() == "[] False True"  # nothing to compare with on one CPU
    else:
        seen, measured, restored = rest.strip().rsplit(" ", 2)
        assert len(json.loads(seen)) == 1 and len(json.loads(seen)[0]) == 1
        assert (measured, restored) == ("True", "True")


def test_the_bench_prints_the_machine_before_its_rows_when_asked() -> None:
    done = _python(
        *("bench/run.py", "--machine", "--json", "--only", "W2"),
        *("--steps", "noop", "--repeat", "1"),
    )
    assert done.returncode == 0, done.stderr
    first, row = (json.loads(line) for line in done.stdout.splitlines())
    assert set(first) == {"machine"} and first["machine"]["handoff_us"] > 0
    assert row["workload"] == "W2"


def test_core_bench_drives_every_run_to_its_end_and_reports_per_decide() -> None:
    done = _python("bench/core.py", "--repeat", "1", "--json")
    assert done.returncode == 0, done.stderr  # (it raises when a run does not succeed)
    row = json.loads(done.stdout)
    assert row["decides"] == 11000
    assert 0 < row["us_best"] <= row["us_median"]
    refused = _python("bench/core.py", "--repeat", "0")
    assert refused.returncode == 2
    assert "--repeat must be at least 1" in refused.stderr
