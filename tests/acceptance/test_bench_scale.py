"""bench/scale.py reads PostgreSQL's log right (its run end to end at a tiny size is in
test_bench_cluster.py, beside the other cluster benches)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


BENCH_MODULES = ("cluster", "run", "bench_steps")
"""bench/scale.py's own imports by plain name; a test package may hold one of those names
(tests/acceptance/cluster) in ``sys.modules`` already."""


def _scale_module() -> ModuleType:
    """bench/scale.py loaded with bench/'s modules, leaving ``sys.path`` and the modules
    of the same names that this process imported before as they were."""
    bench = str(ROOT / "bench")
    saved = {name: sys.modules.pop(name) for name in BENCH_MODULES if name in sys.modules}
    sys.path.insert(0, bench)
    try:
        spec = importlib.util.spec_from_file_location("bench_scale", ROOT / "bench" / "scale.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # its dataclasses look their module up
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(bench)
        for name in BENCH_MODULES:
            sys.modules.pop(name, None)
        sys.modules.update(saved)


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
    assert report["slowest"][0] == {
        "statement": "COMMIT",
        "count": 29,
        "max_ms": 12.5,
        "estimated": 29,
        "p99_ms": None,  # no COMMIT under 10 ms sampled: too few for a p99 of its own
    }
    assert report["slowest"][1]["statement"] == "SELECT tideflow_commit($1::jsonb)"

    quiet = scale.PgLog(str(log), "bench", 1.0).report(start)  # the same lines, all sampled
    assert quiet["statements_estimated"] == 230
    assert quiet["p99_ms"] == 12.5  # rank 227.7: the 28th of the 30 slow ones
    assert quiet["slow_share"] == round(30 / 230, 5)

    missing = scale.PgLog(str(tmp_path / "none.log"), "bench", 0.1).report(0)
    assert missing["error"].startswith("cannot read the PostgreSQL log")
