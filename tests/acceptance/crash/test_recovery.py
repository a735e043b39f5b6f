"""Crash recovery in-process (the middle of the three crash-test depths).

A runtime on a SQLite file is stopped abruptly in the middle of its runs, and a
new runtime on the same file must finish them without running again any step
whose outcome was committed:

- ``close()`` while an attempt is executing (the attempt's result is dropped);
- a simulated crash at each fault point of the runtime (``before_commit``,
  ``after_commit``, ``after_relay``, ``task_started``, ``task_finished``): the
  checkpoint raises ``CancelledError`` there, which ends the scheduler (or drops
  the attempt, for the worker points) where a SIGKILL would have stopped it, and
  the runtime is closed at once, before anything redoes the lost work.

The kill -9 test (``test_kill9.py``) does the same with real processes.
"""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # the step functions: `crash_steps:…`
    sys.path.insert(0, str(HERE))

import crash_steps  # noqa: E402
import crash_workflows as wf  # noqa: E402
from crash_checks import Execution, Instance, StoreView, observe, read_log  # noqa: E402

from tideflow import Runtime, faults  # noqa: E402
from tideflow.store import open_store  # noqa: E402
from tideflow.testing.waiting import step_is, wait_until  # noqa: E402

TIMEOUT = 10.0

GATED = {
    "name": "crash-gated",
    "version": "1",
    "steps": [
        {"id": "a", **wf.python_step("add", input={"value": "{{ inputs.x }}", "amount": 1})},
        {
            "id": "b",
            "depends_on": ["a"],
            **wf.python_step("gated_add", input={"value": "{{ steps.a.output }}", "amount": 1}),
        },
        {
            "id": "c",
            "depends_on": ["b"],
            **wf.python_step("multiply", input={"value": "{{ steps.b.output }}", "factor": 10}),
        },
    ],
    "output": "{{ steps.c.output }}",
}


@pytest.fixture
def log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "executions.jsonl"
    monkeypatch.setenv(crash_steps.LOG_ENV, str(path))
    return path


def starts(log: Path) -> list[Execution]:
    return [ex for ex in read_log(log)[0] if ex.phase == "start"]


async def read_store(url: str, run_ids: list[str]) -> StoreView:
    """The store's content, read with no runtime on it."""
    store = open_store(url)
    await store.open()
    try:
        return await observe(store, run_ids)
    finally:
        await store.close()


async def test_close_during_an_attempt_then_reopen(tmp_path: Path, log: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    crash_steps.GATE.clear()
    crash_steps.GATE_REACHED.clear()
    rt = Runtime(store=url, workers=2)
    await rt.start()
    plan = await rt.register(GATED)
    run_id = await rt.start_run(plan, {"x": 1}, run_id="gated")
    await wait_until(rt, run_id, step_is("b", "running"), TIMEOUT)
    assert await asyncio.to_thread(crash_steps.GATE_REACHED.wait, TIMEOUT)
    await rt.close()  # `b` is executing: its result is never recorded
    crash_steps.GATE.set()

    async with Runtime(store=url, workers=2) as again:
        result = await again.wait(run_id, TIMEOUT)
    view = await read_store(url, [run_id])

    assert (result.status, result.output) == ("succeeded", 30)
    assert Counter(ex.instance[1] for ex in starts(log)) == {"a": 1, "b": 2, "c": 1}, (
        "only the interrupted step runs again"
    )
    assert {(ex.attempt, ex.idempotency_key) for ex in starts(log) if ex.instance[1] == "b"} == {
        (1, "gated:b")
    }, "re-dispatched with the same attempt and idempotency key"
    assert view.outcomes == {((run_id, key, False), 1): 1 for key in "abc"}


CRASH_POINTS = [
    ("before_commit", 1),
    ("before_commit", 9),
    ("after_commit", 2),
    ("after_commit", 12),
    ("after_relay", 5),
    ("after_relay", 15),
    ("task_started", 3),
    ("task_started", 10),
    ("task_finished", 1),
    ("task_finished", 8),
]
"""(point, n): crash the n-th time the point is reached (each well before the runs end)."""


class SimulatedCrash:
    """A fault-point checkpoint that "crashes" the runtime at the n-th pass of ``point``."""

    def __init__(self, point: str, nth: int) -> None:
        self.point = point
        self.nth = nth
        self.passes = 0
        self.crashed = asyncio.Event()

    def __call__(self, point: str) -> None:
        if point != self.point or self.crashed.is_set():
            return
        self.passes += 1
        if self.passes >= self.nth:
            self.crashed.set()
            raise asyncio.CancelledError  # ends the scheduler task / drops the attempt here


@pytest.mark.parametrize(("point", "nth"), CRASH_POINTS)
async def test_crash_at_a_fault_point_then_recover(
    tmp_path: Path, log: Path, monkeypatch: pytest.MonkeyPatch, point: str, nth: int
) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    planned = wf.planned_runs(1)
    run_ids = [run.run_id for run in planned]
    crash = SimulatedCrash(point, nth)
    monkeypatch.setattr(faults, "ARMED", True)
    monkeypatch.setattr(faults, "checkpoint", crash)
    rt = Runtime(store=url, workers=4)
    await rt.start()
    await start_all(rt, planned)
    await asyncio.wait_for(crash.crashed.wait(), TIMEOUT)
    await rt.close()
    monkeypatch.setattr(faults, "ARMED", False)
    before_restart = len(starts(log))
    at_crash = await read_store(url, run_ids)

    async with Runtime(store=url, workers=4) as again:
        await start_all(again, planned)  # idempotent: the runs exist, the signal id is used
        results = {run_id: await again.wait(run_id, TIMEOUT) for run_id in run_ids}
        assert await again.unfinished() == []
    final = await read_store(url, run_ids)

    for run in planned:
        result = results[run.run_id]
        assert (result.status, result.output) == (run.status, run.output), run.run_id
    executions = starts(log)
    for ex in executions[before_restart:]:
        committed = (
            at_crash.completions[ex.instance] or at_crash.outcomes[(ex.instance, ex.attempt)]
        )
        assert not committed, f"{ex} ran again after its outcome was committed"
    assert final.damage == []
    for item, count in final.outcomes.items():
        assert count == 1, f"{item} has {count} committed outcomes"
    per_instance: Counter[Instance] = Counter(ex.instance for ex in executions)
    for instance, count in per_instance.items():
        assert count <= final.committed(instance) + 1, f"{instance} ran {count} times"
    for ex in executions:
        assert ex.idempotency_key == ex.expected_key, ex


async def start_all(rt: Runtime, planned: list[wf.PlannedRun]) -> None:
    plans = {}
    for definition in wf.DEFINITIONS:
        plan = await rt.register(definition)
        plans[plan.name] = plan
    for run in planned:
        await rt.start_run(
            plans[run.workflow], run.input, run_id=run.run_id, idempotency_key=run.idempotency_key
        )
        if run.signalled:  # kept by the run until its `wait` takes it
            await rt.signal(
                run.run_id, wf.SIGNAL, wf.SIGNAL_PAYLOAD, signal_id=f"{run.run_id}:{wf.SIGNAL}"
            )
