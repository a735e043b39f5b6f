"""What the engine does per step and per start, seen in the store: a quick step costs one
event (its start rides on its outcome), a slow one still reports its start while it runs,
and starting runs of a known plan writes its definition once."""

from __future__ import annotations

import sqlite3
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tideflow.dsl import compile_definition
from tideflow.model.plan import Plan
from tideflow.model.run import RunState
from tideflow.runtime.runtime import Runtime
from tideflow.store.backends.sqlite import SqliteStore
from tideflow.testing.waiting import wait_until
from tideflow.worker import starts
from tideflow.worker.executors.functions import register, unregister

RELEASE = threading.Event()


@pytest.fixture(autouse=True)
def functions() -> Iterator[None]:
    RELEASE.clear()
    register("hot.quick")(lambda: None)

    @register("hot.held")
    def held() -> str:
        return "released" if RELEASE.wait(10) else "not released"

    yield
    RELEASE.set()
    for name in ("hot.quick", "hot.held"):
        unregister(name)


def chain(function: str, n: int) -> Plan:
    steps = [
        {"id": f"s{i}", "type": "python", "function": function}
        | ({"depends_on": [f"s{i - 1}"]} if i else {})
        for i in range(n)
    ]
    return compile_definition(
        {"name": f"hot-{uuid.uuid4().hex[:8]}", "version": "1", "steps": steps}
    )


async def test_a_quick_python_step_records_one_event_not_two(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(starts, "REPORT_DELAY", 60.0)  # no start is sent on its own
    async with Runtime() as rt:
        result = await rt.run(chain("hot.quick", 3))
        kinds = [entry.kind for entry in await rt.history(result.run_id)]
        state = await rt.state(result.run_id)
    assert result.status == "succeeded"
    assert kinds.count("task_completed") == 3
    assert "task_started" not in kinds
    # The start still counts: it rode on the outcome.
    assert all(st.attempt_started_at is not None for st in state.steps.values())


async def test_a_step_that_keeps_running_reports_its_start_meanwhile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(starts, "REPORT_DELAY", 0.0)
    async with Runtime() as rt:
        run_id = await rt.start_run(chain("hot.held", 1))
        await wait_until(rt, run_id, _started("s0"))
        RELEASE.set()
        result = await rt.wait(run_id, timeout=10)
        kinds = [entry.kind for entry in await rt.history(run_id)]
    assert result.status == "succeeded"
    assert kinds.index("task_started") < kinds.index("task_completed")


def _started(step: str) -> Callable[[RunState], bool]:
    def started(state: RunState) -> bool:
        st = state.steps.get(step)
        return st is not None and st.attempt_started_at is not None

    return started


async def test_starting_runs_of_a_stored_plan_does_not_write_its_definition_again(
    tmp_path: Path,
) -> None:
    store = SqliteStore(f"sqlite:///{tmp_path}/runs.db")
    statements: list[str] = []
    plan = chain("hot.quick", 2)
    async with Runtime(store=store) as rt:
        store.conn.set_trace_callback(statements.append)
        for _ in range(5):
            result = await rt.run(plan)
            assert result.status == "succeeded"
        store.conn.set_trace_callback(None)
    touching = [s for s in statements if "definitions" in s or "INSERT INTO plans" in s]
    assert len(touching) <= 3  # looked up and written once, for the first run


def test_sqlite_refuses_a_changed_definition_under_a_known_version(tmp_path: Path) -> None:
    import asyncio

    from tideflow.errors import DefinitionConflict

    async def main() -> None:
        store = SqliteStore(f"sqlite:///{tmp_path}/runs.db")
        first = compile_definition(
            {"name": "same", "version": "1", "steps": [{"id": "a", "type": "noop"}]}
        )
        other = compile_definition(
            {"name": "same", "version": "1", "steps": [{"id": "b", "type": "noop"}]}
        )
        async with Runtime(store=store) as rt:
            await rt.register(first)
            await rt.register(first)  # known: no error
            with pytest.raises(DefinitionConflict):
                await rt.register(other)
        assert sqlite3.connect(f"{tmp_path}/runs.db").execute(
            "SELECT count(*) FROM definitions"
        ).fetchone() == (1,)

    asyncio.run(main())
