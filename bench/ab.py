"""Interleaved A/B of one `bench/run.py` row between two source trees (two checkouts).

On a shared, noisy machine two benchmark runs minutes apart differ by more than most
changes: this runs the row in a fresh process for each tree in turn, alternating which
goes first, and prints medians. Besides steps/s and p50 it reports the CPU time of the
event-loop thread per step, which the machine's noise moves least.

Usage:
    git worktree add /tmp/base main~5
    python bench/ab.py /tmp/base . --store memory --only W1 --steps python --rounds 8

Each tree's own `bench/run.py` and `src/` are used (PYTHONPATH), with this interpreter,
on each tree's default event loop (`tideflow.loop`, where a tree has it: uvloop unless
``TIDEFLOW_LOOP`` says otherwise; the variable passes on to both trees' processes).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def one_row(store: str, workload: str, kind: str) -> dict[str, Any]:
    """Measure one row in this process, with the bench/run.py of the tree it runs in (the
    working directory, put where this script's own directory was on ``sys.path``)."""
    sys.path[0] = os.getcwd()
    import run

    measured: dict[str, float] = {}
    runs = run._runs

    async def timed(*args: Any, **kwargs: Any) -> Any:
        began = time.thread_time()
        result = await runs(*args, **kwargs)
        measured["loop"] = time.thread_time() - began
        return result

    run._runs = timed
    row = run.measure(
        workload, run.WORKLOADS[workload](kind), store, kind, run.runtime_factory(store)
    )
    return {
        "steps": row.steps,
        "steps_per_s": row.steps_per_s,
        "p50_ms": row.p50_ms,
        "loop_us_per_step": round(measured["loop"] / row.steps * 1e6, 1),
    }


def in_tree(tree: Path, store: str, workload: str, kind: str) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=f"{tree / 'src'}{os.pathsep}{tree / 'bench'}")
    argv = [sys.executable, str(Path(__file__).resolve()), "--one", store, workload, kind]
    done = subprocess.run(argv, cwd=tree / "bench", env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{tree}: the row failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--one", nargs=3, metavar=("STORE", "WORKLOAD", "KIND"), help=argparse.SUPPRESS
    )
    parser.add_argument("trees", nargs="*", type=Path, help="the two trees: base, then new")
    parser.add_argument("--store", default="memory", choices=["memory", "sqlite", "postgres"])
    parser.add_argument("--only", default="W1", help="the workload (default W1)")
    parser.add_argument("--steps", default="python", choices=["python", "noop"])
    parser.add_argument("--rounds", type=int, default=6, help="runs per tree (default 6)")
    parser.add_argument("--json", action="store_true", help="print the medians as JSON")
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(one_row(*args.one)))
        return 0
    if len(args.trees) != 2 or args.rounds < 1:
        parser.error("give two trees (base, new) and --rounds of at least 1")
    results: dict[Path, list[dict[str, Any]]] = {tree: [] for tree in args.trees}
    for index in range(args.rounds):
        order = args.trees if index % 2 == 0 else list(reversed(args.trees))
        for tree in order:
            results[tree].append(in_tree(tree, args.store, args.only, args.steps))
    medians = [_medians(tree, rows) for tree, rows in results.items()]
    for line in medians:
        print(json.dumps(line) if args.json else _text(line, args))
    return 0


def _medians(tree: Path, rows: list[dict[str, Any]]) -> dict[str, Any]:
    p50s = [row["p50_ms"] for row in rows if row["p50_ms"] is not None]
    return {
        "tree": str(tree),
        "rounds": len(rows),
        "steps": rows[0]["steps"],
        "steps_per_s": statistics.median(row["steps_per_s"] for row in rows),
        "p50_ms": statistics.median(p50s) if p50s else None,
        "loop_us_per_step": statistics.median(row["loop_us_per_step"] for row in rows),
    }


def _text(line: dict[str, Any], args: argparse.Namespace) -> str:
    p50 = f"  p50 {line['p50_ms']} ms" if line["p50_ms"] is not None else ""
    return (
        f"{line['tree']:<30} {args.only} {args.store} {args.steps}: "
        f"{line['steps_per_s']:>9.0f} steps/s  loop {line['loop_us_per_step']:>6.1f} us/step"
        f"{p50}  (medians of {line['rounds']})"
    )


if __name__ == "__main__":
    sys.exit(main())
