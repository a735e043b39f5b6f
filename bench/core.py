"""The pure core alone: what one `decide` of a W1 step costs, with no loop, store or bus.

1,000 runs of W1's 10-step chain of ``python`` steps are started and driven to their end
by their events (``RunStarted``, then one ``TaskCompleted`` per step), one event of each
run in turn, as the scheduler applies them when 1,000 runs are in flight. Events are
built before the clock starts; the collector is off while it runs. Prints microseconds
per decide (best and median of ``--repeat`` rounds).

Timings move with the machine. For a change to the core, count instructions instead,
which do not: run the script under callgrind with 1 and with 3 rounds, and divide the
difference by 2 x 11,000 decides:

    valgrind --tool=callgrind python bench/core.py --repeat 1
    valgrind --tool=callgrind python bench/core.py --repeat 3
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time

from run import chain

from tideflow.core.decide import decide
from tideflow.model.events import Event, RunStarted, TaskCompleted
from tideflow.model.plan import Plan
from tideflow.model.run import RunState, new_run_state

RUNS = 1000
STEPS = 10


def _round(plan: Plan) -> float:
    """Seconds to apply every event of ``RUNS`` runs, interleaved."""
    states: list[RunState] = []
    events: list[list[Event]] = []
    for index in range(RUNS):
        run_id = f"run-{index}"
        states.append(
            new_run_state(
                run_id=run_id,
                workflow=plan.name,
                version=plan.version,
                plan_hash=plan.hash,
                created_at=0.0,
            )
        )
        started: list[Event] = [RunStarted(event_id=f"{run_id}-start", run_id=run_id, time=1.0)]
        events.append(
            started
            + [
                TaskCompleted(
                    event_id=f"{run_id}-{step}",
                    run_id=run_id,
                    time=2.0 + step,
                    step_key=f"s{step}",
                    attempt=1,
                    output=None,
                    round=0,
                    started_at=1.5 + step,
                    worker="bench",
                )
                for step in range(STEPS)
            ]
        )
    began = time.perf_counter()
    for position in range(STEPS + 1):
        for state, of_run in zip(states, events, strict=True):
            decide(plan, state, of_run[position])
    seconds = time.perf_counter() - began
    unfinished = [s.run_id for s in states if s.status.value != "succeeded"]
    if unfinished:
        raise RuntimeError(f"{len(unfinished)} runs did not succeed, e.g. {unfinished[0]}")
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=7, help="rounds (default 7)")
    parser.add_argument("--json", action="store_true", help="one JSON object")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    plan = chain(STEPS, "python")
    decides = RUNS * (STEPS + 1)
    gc.disable()
    try:
        rounds = [_round(plan) / decides * 1e6 for _ in range(args.repeat)]
    finally:
        gc.enable()
    best, median = min(rounds), statistics.median(rounds)
    if args.json:
        print(
            json.dumps(
                {"decides": decides, "us_best": round(best, 3), "us_median": round(median, 3)}
            )
        )
    else:
        print(
            f"core     W1 chain   {decides} decides a round   best {best:.2f} us/decide"
            f"   median {median:.2f} us/decide  ({args.repeat} rounds)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
