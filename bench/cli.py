"""How long the `tideflow` command takes, as a whole process: start-up and one read.

Commands timed (each a fresh process, wall clock, min / median / max of ``--rounds``):

- ``tideflow --version`` and ``tideflow --help``: the start-up alone (target: under
  150 ms on this machine; docs/operations.md, "A fast CLI");
- ``tideflow runs list`` on a SQLite store holding ``--runs`` finished runs (made once,
  before timing): start-up, opening the store, one page (target: under 400 ms).

Beside the wall clock it reports the CPU time (user + system) of the child, which the
machine's noise moves less. The command is timed as it runs once installed: with its
bytecode caches written (``PYTHONDONTWRITEBYTECODE`` is dropped for the children, and
each command runs once, untimed, before the rounds); without them every run would compile
tideflow's sources again. ``--against TREE`` times another checkout too (its ``src``
on ``PYTHONPATH``, this interpreter), alternating which goes first in each round, so
both are measured in the same minutes.

Usage:
    python bench/cli.py
    python bench/cli.py --rounds 30 --json
    git worktree add /tmp/base main~3 && python bench/cli.py --against /tmp/base
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent

COMMANDS: dict[str, list[str]] = {
    "--version": ["--version"],
    "--help": ["--help"],
    "runs list (SQLite)": ["runs", "list", "--store", "{store}"],
}
FLOW = {
    "name": "bench-cli",
    "version": "1",
    "steps": [{"id": "a", "type": "noop"}, {"id": "b", "type": "noop", "depends_on": ["a"]}],
}


def _env(tree: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree / "src")
    env.pop("TIDEFLOW_STORE", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # timed as installed: with bytecode caches
    return env


def _command(argv: list[str], store: str) -> list[str]:
    code = "import sys; from tideflow.cli.main import main; sys.argv[0] = 'tideflow'; main()"
    return [sys.executable, "-c", code, *(a.format(store=store) for a in argv)]


def _timed(argv: list[str], env: dict[str, str], cwd: str) -> tuple[float, float]:
    """Wall and CPU seconds of one run of the command (CPU of the child alone)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    subprocess.run(
        argv, env=env, cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    wall = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def _make_store(tree: Path, directory: str, runs: int) -> str:
    """A SQLite store with ``runs`` finished runs of a two-step flow, made by ``tree``'s
    own code (a tree reads no store of a newer schema than its own)."""
    url = f"sqlite:///{directory}/bench-{abs(hash(str(tree)))}.db"
    flow = Path(directory) / "flow.json"
    flow.write_text(json.dumps(FLOW), encoding="utf-8")
    code = (
        "import asyncio, sys\n"
        "from tideflow.runtime.runtime import Runtime\n"
        "async def main():\n"
        f"    async with Runtime(store={url!r}) as rt:\n"
        f"        await rt.client.register({str(flow)!r})\n"
        f"        ids = [await rt.client.start('bench-cli', {{}}) for _ in range({runs})]\n"
        "        for run_id in ids:\n"
        "            await rt.client.wait(run_id)\n"
        "asyncio.run(main())\n"
    )
    subprocess.run([sys.executable, "-c", code], env=_env(tree), cwd=directory, check=True)
    return url


def _summary(values: list[float]) -> dict[str, float]:
    return {
        "min_ms": round(min(values) * 1000, 1),
        "median_ms": round(statistics.median(values) * 1000, 1),
        "max_ms": round(max(values) * 1000, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--runs", type=int, default=200, help="runs in the SQLite store")
    parser.add_argument("--against", type=Path, help="another checkout to time alongside")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    trees = {"this": HERE}
    if args.against is not None:
        trees["against"] = args.against.resolve()
    for tree in trees.values():
        if not (tree / "src" / "tideflow" / "cli" / "main.py").is_file():
            parser.error(f"{tree} is not a tideflow checkout (no src/tideflow/cli/main.py)")
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="tideflow-bench-cli-") as directory:
        stores = {tree: _make_store(path, directory, args.runs) for tree, path in trees.items()}
        samples: dict[tuple[str, str], tuple[list[float], list[float]]] = {
            (tree, name): ([], []) for tree in trees for name in COMMANDS
        }
        for argv in COMMANDS.values():  # writes the bytecode caches: untimed
            for tree in trees:
                _timed(_command(argv, stores[tree]), _env(trees[tree]), directory)
        for round_ in range(args.rounds):
            order = list(trees) if round_ % 2 == 0 else list(reversed(trees))
            for name, argv in COMMANDS.items():
                for tree in order:
                    command = _command(argv, stores[tree])
                    wall, cpu = _timed(command, _env(trees[tree]), directory)
                    samples[(tree, name)][0].append(wall)
                    samples[(tree, name)][1].append(cpu)
        for (tree, name), (walls, cpus) in samples.items():
            results.setdefault(tree, {})[name] = {
                "wall": _summary(walls),
                "cpu": _summary(cpus),
            }
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for tree, rows in results.items():
        print(f"{tree}: {trees[tree]}")
        for name, row in rows.items():
            wall, cpu = row["wall"], row["cpu"]
            print(
                f"  {name:<20} wall min {wall['min_ms']:7.1f}  median {wall['median_ms']:7.1f}"
                f"  max {wall['max_ms']:7.1f} ms   cpu median {cpu['median_ms']:7.1f} ms"
            )


if __name__ == "__main__":
    main()
