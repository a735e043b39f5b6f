"""What the machine under the benchmark rows costs, measured without tideflow.

The same code measures 2.8 ms or 3.6 ms for one 10-step run on SQLite (``W1-seq``) on
two days on the "same" virtual machine: shared hosts change speed, and a row alone
cannot say whether the engine or the machine moved. This probe measures the three
things a step is made of below the engine, so that rows taken on different days or
machines can be compared:

- ``handoff_us``: a call handed from the event loop to a thread and its result back
  (a ``SimpleQueue`` one way, ``call_soon_threadsafe`` the other), the primitive under
  every sync ``python`` step; median round trip on the commands' event loop. On a
  virtual machine whose idle vCPUs halt at once (the ``haltpoll`` cpuidle driver with
  ``guest_halt_poll_ns`` 0) each direction wakes a halted vCPU through the hypervisor.
- ``handoff_one_cpu_us``: the same with both threads on one CPU (what ``taskset -c 0``
  gives, see docs/operations.md); None where the process may use a single CPU only.
- ``sqlite_commit_us``: a SQLite transaction writing 9 pages in WAL mode with
  ``synchronous=NORMAL`` (a step's commit writes 8-10), median.
- ``python_ms``: a fixed piece of pure Python (dicts, strings, a sort), best of 5.

Usage:
    python bench/machine.py            # one line
    python bench/machine.py --json     # one JSON object
    python bench/run.py --machine ...  # the same line before the rows
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import sqlite3
import statistics
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from scratch import scratch_dir

import tideflow.loop

SQLITE_PAGES = 9
"""B-trees one step's commit touches (history and its two indexes, the task row and its
two, the run row, ...): each is a page of the WAL."""


@dataclass
class Machine:
    cpus: int
    """CPUs this process may run on (``os.sched_getaffinity``)."""
    python: str
    loop: str
    cpuidle: str | None
    """Linux's cpuidle driver (``haltpoll`` in a KVM guest that may poll), where it says."""
    halt_poll_ns: int | None
    """``guest_halt_poll_ns`` of ``haltpoll``: 0, an idle vCPU halts at once."""
    handoff_us: float
    handoff_one_cpu_us: float | None
    sqlite_commit_us: float
    python_ms: float

    def line(self) -> str:
        idle = ""
        if self.cpuidle is not None:
            idle = f", cpuidle {self.cpuidle}"
            if self.halt_poll_ns is not None:
                idle += f" (guest_halt_poll_ns {self.halt_poll_ns})"
        one = (
            f" ({self.handoff_one_cpu_us} us on one CPU)"
            if self.handoff_one_cpu_us is not None
            else ""
        )
        return (
            f"machine: {self.cpus} CPUs{idle}, Python {self.python}, {self.loop}: "
            f"thread hand-off {self.handoff_us} us{one}, "
            f"SQLite {SQLITE_PAGES}-page commit {self.sqlite_commit_us} us, "
            f"python {self.python_ms} ms"
        )


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


_Calls = queue.SimpleQueue[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]] | None]
"""Calls to the answering thread: the loop and the future to resolve (None: stop)."""


def _server(calls: _Calls) -> None:
    while (call := calls.get()) is not None:
        loop, future = call
        loop.call_soon_threadsafe(future.set_result, None)


async def _round_trips(count: int) -> float:
    """Median loop -> thread -> loop round trip in microseconds, over a thread started
    here (so that it starts with this thread's CPU set)."""
    loop = asyncio.get_running_loop()
    calls: _Calls = queue.SimpleQueue()
    server = threading.Thread(target=_server, args=(calls,), name="bench-handoff", daemon=True)
    server.start()
    try:
        times = []
        for i in range(count + count // 10):
            began = time.perf_counter()
            future = loop.create_future()
            calls.put((loop, future))
            await future
            if i >= count // 10:  # the first tenth warms up
                times.append(time.perf_counter() - began)
        return round(statistics.median(times) * 1e6, 1)
    finally:
        calls.put(None)
        server.join()


def handoff(count: int, loop_name: str) -> float:
    factory = tideflow.loop.loop_factory({tideflow.loop.ENV: loop_name})
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(_round_trips(count))


def handoff_one_cpu(count: int, loop_name: str) -> float | None:
    """The hand-off with this thread (and so the thread it starts) on its current CPU."""
    allowed = os.sched_getaffinity(0)
    if len(allowed) < 2:
        return None
    here = sorted(allowed)[0]
    os.sched_setaffinity(0, {here})  # this thread only, on Linux
    try:
        return handoff(count, loop_name)
    finally:
        os.sched_setaffinity(0, allowed)


def sqlite_commit(count: int) -> float:
    path = os.path.join(scratch_dir("tideflow-machine-"), "probe.db")
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        for table in range(SQLITE_PAGES):
            conn.execute(f"CREATE TABLE t{table} (id INTEGER PRIMARY KEY, data TEXT NOT NULL)")
        row = "x" * 300
        times = []
        for i in range(count + count // 10):
            began = time.perf_counter()
            conn.execute("BEGIN IMMEDIATE")
            for table in range(SQLITE_PAGES):
                conn.execute(f"INSERT INTO t{table} (data) VALUES (?)", (row,))
            conn.execute("COMMIT")
            if i >= count // 10:
                times.append(time.perf_counter() - began)
        return round(statistics.median(times) * 1e6, 1)
    finally:
        conn.close()


def _python_work() -> int:
    total = 0
    rows: list[tuple[str, int]] = []
    for i in range(20_000):
        row: dict[str, Any] = {"run_id": f"run-{i % 97}", "seq": i, "status": "running"}
        rows.append((row["run_id"], row["seq"]))
        total += len(row["run_id"]) + (i % 7)
    rows.sort()
    return total + len(rows)


def python_speed(repeat: int = 5) -> float:
    best = float("inf")
    for _ in range(repeat):
        began = time.perf_counter()
        _python_work()
        best = min(best, time.perf_counter() - began)
    return round(best * 1e3, 2)


def probe(loop_name: str | None = None, count: int = 2000) -> Machine:
    """Measure this machine (a second or two with the default ``count``)."""
    loop_name = loop_name or tideflow.loop.loop_name()
    poll = _read("/sys/module/haltpoll/parameters/guest_halt_poll_ns")
    return Machine(
        cpus=len(os.sched_getaffinity(0)),
        python=sys.version.split()[0],
        loop=loop_name,
        cpuidle=_read("/sys/devices/system/cpu/cpuidle/current_driver"),
        halt_poll_ns=int(poll) if poll is not None and poll.isdigit() else None,
        handoff_us=handoff(count, loop_name),
        handoff_one_cpu_us=handoff_one_cpu(count, loop_name),
        sqlite_commit_us=sqlite_commit(max(count // 4, 10)),
        python_ms=python_speed(),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--count", type=int, default=2000, help="round trips to time (default 2000)"
    )
    parser.add_argument(
        "--loop",
        choices=["uvloop", "asyncio"],
        help="the event loop (default: the commands' own)",
    )
    args = parser.parse_args(argv)
    if args.count < 10:
        parser.error("--count must be at least 10")
    machine = probe(args.loop, args.count)
    print(json.dumps(asdict(machine)) if args.json else machine.line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
