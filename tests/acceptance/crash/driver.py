"""Drive the crash-test workflows in a real process that the test SIGKILLs.

::

    python driver.py --store sqlite:////tmp/x.db [--schema S] --log steps.jsonl \
        --copies 2 --mode start|resume [--seed N]

Opens the embedded runtime on the store (which resumes every unfinished run in
it), then in ``start`` mode starts ``copies`` runs of every workflow of
`crash_workflows` with fixed run ids and idempotency keys (a restarted driver
gets the existing runs back), or in ``resume`` mode only takes the runs that
have not ended. It sends each signal-waiting run its signal once the run waits
for it (with a fixed signal id, so a resend after a crash is applied at most
once) and waits for every run to end.

On stdout: ``{"event": "ready", ...}`` once the runs are started, then
``{"event": "finished", "runs": [...]}`` (exit 0), or ``{"event": "timeout",
"unfinished": [...]}`` (exit 3) when the runs did not end in time. The step
functions log their executions to ``--log`` (``$TIDEFLOW_CRASH_LOG``).
``$TIDEFLOW_FAULT`` makes the runtime kill itself at a named point.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # the step functions: `crash_steps:…`
    sys.path.insert(0, str(HERE))

import crash_steps  # noqa: E402
import crash_workflows as wf  # noqa: E402

from tideflow import RunResult, Runtime  # noqa: E402
from tideflow.model.run import RunState  # noqa: E402
from tideflow.store import Store, open_store  # noqa: E402
from tideflow.testing.waiting import wait_until  # noqa: E402


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, "pid": os.getpid(), **fields}), flush=True)


def make_store(url: str, schema: str | None) -> Store:
    if schema is None:
        return open_store(url)
    from tideflow.store.backends.postgres import PostgresStore

    return PostgresStore(url, schema=schema)


def wait_reached(state: RunState) -> bool:
    step = state.steps.get("go")
    return state.is_terminal or (step is not None and step.status.value not in ("pending", "ready"))


async def send_signal(rt: Runtime, run_id: str, rng: random.Random, timeout: float) -> None:
    """Signal the run once its `wait` waits (never before: the kill may land while it waits)."""
    state = await wait_until(rt, run_id, wait_reached, timeout)
    if state.is_terminal or state.steps["go"].status.value != "waiting":
        return
    await asyncio.sleep(rng.uniform(0.0, 0.15))
    await rt.signal(run_id, wf.SIGNAL, wf.SIGNAL_PAYLOAD, signal_id=f"{run_id}:{wf.SIGNAL}")


def _summary(result: RunResult) -> dict[str, Any]:
    error = result.error and {"type": result.error["type"], "message": result.error["message"]}
    return {
        "run_id": result.run_id,
        "status": result.status,
        "output": result.output,
        "error": error,
    }


async def drive(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    rt = Runtime(store=make_store(args.store, args.schema), workers=args.workers)
    await rt.start()  # resumes every unfinished run of the store
    try:
        planned = {run.run_id: run for run in wf.planned_runs(args.copies)}
        run_ids = await start_runs(rt, planned) if args.mode == "start" else await rt.unfinished()
        emit("ready", mode=args.mode, runs=run_ids)
        signals = [
            asyncio.create_task(send_signal(rt, run_id, rng, args.timeout))
            for run_id in run_ids
            if run_id in planned and planned[run_id].signalled
        ]
        waits = [asyncio.create_task(rt.wait(run_id)) for run_id in run_ids]
        done, pending = await _wait_all([*waits, *signals], args.timeout)
        if pending:
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            emit("timeout", unfinished=await rt.unfinished())
            return 3
        for task in done:
            task.result()  # a failed signal or wait is a driver error
        emit("finished", runs=[_summary(task.result()) for task in waits])
        return 0
    finally:
        await rt.close()


async def start_runs(rt: Runtime, planned: dict[str, wf.PlannedRun]) -> list[str]:
    """Start every planned run; a run that exists already (same idempotency key) is reused."""
    plans = {}
    for definition in wf.DEFINITIONS:
        plan = await rt.register(definition)  # the same content again is a no-op
        plans[plan.name] = plan
    for run in planned.values():
        await rt.start_run(
            plans[run.workflow], run.input, run_id=run.run_id, idempotency_key=run.idempotency_key
        )
    return list(planned)


async def _wait_all(
    tasks: list[asyncio.Task[Any]], timeout: float
) -> tuple[set[asyncio.Task[Any]], set[asyncio.Task[Any]]]:
    if not tasks:
        return set(), set()
    return await asyncio.wait(tasks, timeout=timeout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True)
    parser.add_argument("--schema", help="PostgreSQL schema (postgresql:// stores only)")
    parser.add_argument("--log", required=True, help="where the step functions log executions")
    parser.add_argument("--copies", type=int, default=2)
    parser.add_argument("--mode", choices=["start", "resume"], default="start")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--timeout", type=float, default=30.0)
    args = parser.parse_args()
    os.environ[crash_steps.LOG_ENV] = args.log
    return asyncio.run(drive(args))


if __name__ == "__main__":
    sys.exit(main())
