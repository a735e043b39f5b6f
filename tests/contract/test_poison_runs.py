"""A run whose events cannot be stored or applied fails alone; the others never wait on it.

Every test runs a real runtime on every backend (memory, SQLite, PostgreSQL). Commit
faults are injected by wrapping the store's ``commit``: it fails for batches that hold
the poison run's events, once, N times or forever, with a "store unavailable" error
(the run must carry on once the store takes it) or an "unstorable data" error (the
run must fail with EngineError). Real poison (a value no store can hold, an event the
core cannot apply) is sent through the bus as another process could.
"""

from __future__ import annotations

import asyncio
import textwrap
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from tideflow.dsl import compile_definition
from tideflow.model.events import EngineFailed, SignalReceived, TaskCompleted
from tideflow.model.plan import Plan
from tideflow.runtime.runtime import Runtime
from tideflow.store.base import AppliedEvent, Store, StoreUnavailable, UnstorableData
from tideflow.testing.waiting import step_is, wait_until
from tideflow.worker.executors.functions import register, unregister

from .conftest import Backend, drop_schema, postgres_backend

POISON = "poison-run"
OTHERS = 6
WAIT = 30.0


def flow(text: str) -> Plan:
    return compile_definition(textwrap.dedent(text))


QUICK = flow(
    """
    name: quick
    version: "1"
    steps:
      - {id: a, type: python, function: poison.echo, input: {v: "{{ inputs.v }}"}}
      - {id: b, type: python, function: poison.echo, depends_on: [a], input: {v: "{{ steps.a.output }}"}}
    output: "{{ steps.b.output }}"
    """
)
WAITING = flow(
    """
    name: waiting
    version: "1"
    steps:
      - {id: ask, type: wait, signal: go}
    output: "{{ steps.ask.output }}"
    """
)


@pytest.fixture(autouse=True)
def echo() -> Any:
    register("poison.echo")(lambda v: v)
    yield
    unregister("poison.echo")


@dataclass
class CommitFault:
    """Make ``store.commit`` fail for batches holding one of ``runs`` (all runs if None)."""

    store: Store
    error: Exception
    runs: set[str] | None
    times: int | None
    """How many commits fail; None: forever (until ``heal``)."""
    failed: int = 0

    def install(self) -> None:
        original = self.store.commit

        async def commit(batch: Sequence[AppliedEvent], relayed: Sequence[str] = ()) -> None:
            if self._hits(batch):
                self.failed += 1
                raise self.error
            await original(batch, relayed)

        self.store.commit = commit  # type: ignore[method-assign]

    def _hits(self, batch: Sequence[AppliedEvent]) -> bool:
        if self.times is not None and self.failed >= self.times:
            return False
        return any(
            (self.runs is None or a.event.run_id in self.runs)
            and not isinstance(a.event, EngineFailed)  # the failure itself can be stored
            for a in batch
        )

    def heal(self) -> None:
        self.times = self.failed


@pytest.fixture
async def runtime(backend: Backend) -> AsyncIterator[Runtime]:
    async with Runtime(store=backend.make(), workers=4) as rt:
        yield rt


async def run_all(rt: Runtime, plan: Plan, ids: list[str]) -> dict[str, str]:
    for run_id in ids:
        await rt.start_run(plan, {"v": run_id}, run_id=run_id)
    results = await asyncio.gather(*(rt.wait(run_id, WAIT) for run_id in ids))
    return {r.run_id: r.status for r in results}


def others() -> list[str]:
    return [f"other-{i}" for i in range(OTHERS)]


@pytest.mark.parametrize("times", [1, 3])
async def test_an_unavailable_commit_is_retried_and_the_run_carries_on(
    runtime: Runtime, times: int
) -> None:
    fault = CommitFault(runtime.store, StoreUnavailable("the store is busy"), {POISON}, times)
    fault.install()
    statuses = await run_all(runtime, QUICK, [POISON, *others()])
    assert set(statuses.values()) == {"succeeded"}
    assert fault.failed == times
    assert (await runtime.result(POISON)).output == POISON


async def test_a_run_that_can_never_be_committed_holds_up_no_other(runtime: Runtime) -> None:
    fault = CommitFault(runtime.store, StoreUnavailable("no space for this one"), {POISON}, None)
    fault.install()
    await runtime.start_run(QUICK, {"v": POISON}, run_id=POISON)
    statuses = await run_all(runtime, QUICK, others())
    assert set(statuses.values()) == {"succeeded"}
    assert fault.failed >= 1
    assert (await runtime.store.get_run(POISON)).status in ("pending", "running")
    fault.heal()
    result = await runtime.wait(POISON, WAIT)
    assert result.status == "succeeded"


async def test_unstorable_data_fails_that_run_with_engine_error(runtime: Runtime) -> None:
    fault = CommitFault(runtime.store, UnstorableData("a value is too big"), {POISON}, None)
    fault.install()
    statuses = await run_all(runtime, QUICK, [POISON, *others()])
    assert statuses.pop(POISON) == "failed"
    assert set(statuses.values()) == {"succeeded"}
    result = await runtime.result(POISON)
    assert result.error is not None
    assert result.error["type"] == "EngineError"
    assert "UnstorableData: a value is too big" in result.error["message"]
    history = await runtime.history(POISON)
    assert history[-1].kind == "engine_failed"
    assert (await runtime.store.get_run(POISON)).status == "failed"


async def test_a_store_that_is_down_fails_no_run(runtime: Runtime) -> None:
    fault = CommitFault(runtime.store, StoreUnavailable("connection refused"), None, 4)
    fault.install()
    statuses = await run_all(runtime, QUICK, others())
    assert set(statuses.values()) == {"succeeded"}
    assert fault.failed == 4


async def test_a_value_no_store_can_hold_fails_only_its_run(runtime: Runtime) -> None:
    """A signal with an integer beyond 64 bits, as another process could publish it."""
    await runtime.start_run(WAITING, None, run_id=POISON)
    await wait_until(runtime, POISON, step_is("ask", "waiting"))
    await runtime.bus.publish_events(
        [SignalReceived(event_id="bad", run_id=POISON, time=1.0, name="go", payload=2**70)]
    )
    statuses = await run_all(runtime, QUICK, others())
    assert set(statuses.values()) == {"succeeded"}
    result = await runtime.wait(POISON, WAIT)
    assert result.status == "failed"
    assert result.error is not None
    assert result.error["type"] == "EngineError"
    assert "64-bit" in result.error["message"]
    fresh = await run_all(runtime, QUICK, ["after"])  # the store still takes new runs
    assert fresh == {"after": "succeeded"}


async def test_an_event_the_core_cannot_apply_fails_only_its_run(runtime: Runtime) -> None:
    await runtime.start_run(WAITING, None, run_id=POISON)
    await runtime.start_run(WAITING, None, run_id="other")
    for run_id in (POISON, "other"):
        await wait_until(runtime, run_id, step_is("ask", "waiting"))
    broken = TaskCompleted(event_id="e1", run_id=POISON, time=1.0, step_key=["ask"], attempt=1)  # type: ignore[arg-type]
    fine = SignalReceived(event_id="e2", run_id="other", time=1.0, name="go", payload="ok")
    await runtime.bus.publish_events([broken, fine])
    assert (await runtime.wait("other", WAIT)).output == "ok"
    result = await runtime.wait(POISON, WAIT)
    assert result.status == "failed"
    assert result.error is not None
    assert result.error["type"] == "EngineError"
    assert "TypeError" in result.error["message"]


DAMAGED = (
    '{"kind": "task_completed", "event_id": "x", "run_id": "damaged", "time": 1.0, '
    '"step_key": ["ask"], "attempt": 1}'
)


async def test_a_run_that_cannot_be_loaded_holds_up_no_other(
    sql_backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    async with Runtime(store=sql_backend.make(), workers=1) as rt:
        for run_id in ("damaged", "other"):
            await rt.start_run(WAITING, None, run_id=run_id)
            await wait_until(rt, run_id, step_is("ask", "waiting"))
    assert sql_backend.raw is not None
    await sql_backend.raw(f"UPDATE history SET data = '{DAMAGED}' WHERE run_id = 'damaged'")
    async with Runtime(store=sql_backend.make(), workers=1) as rt:
        signals = [
            SignalReceived(event_id=f"s-{run_id}", run_id=run_id, time=1.0, name="go", payload=1)
            for run_id in ("damaged", "other")
        ]
        await rt.bus.publish_events(signals)  # one batch: the damaged run's event comes first
        assert (await rt.wait("other", WAIT)).output == 1
    assert any(
        "run damaged cannot be loaded" in r.getMessage() and "TypeError" in r.getMessage()
        for r in caplog.records
    )


async def test_a_recording_client_says_when_the_store_did_not_take_the_event(
    runtime: Runtime,
) -> None:
    await runtime.start_run(WAITING, None, run_id=POISON)
    await wait_until(runtime, POISON, step_is("ask", "waiting"))
    fault = CommitFault(runtime.store, StoreUnavailable("the store is busy"), {POISON}, None)
    fault.install()
    tool = runtime.client.recording()  # what `tideflow runs cancel` uses
    with pytest.raises(StoreUnavailable):
        await tool.cancel(POISON)
    assert (await runtime.store.get_run(POISON)).status == "running"
    fault.heal()
    await tool.cancel(POISON)
    assert (await runtime.store.get_run(POISON)).status == "cancelled"


async def test_a_value_postgresql_refuses_fails_only_its_run(postgres_url: str) -> None:
    """PostgreSQL text cannot hold NUL: a signal id with one is a real DataError there."""
    schema = f"poison_{uuid.uuid4().hex[:12]}"
    backend = postgres_backend(postgres_url, schema)
    try:
        async with Runtime(store=backend.make(), workers=2) as rt:
            await rt.start_run(WAITING, None, run_id=POISON)
            await wait_until(rt, POISON, step_is("ask", "waiting"))
            await rt.signal(POISON, "go", "x", signal_id="bad\x00id")
            statuses = await run_all(rt, QUICK, others())
            assert set(statuses.values()) == {"succeeded"}
            result = await rt.wait(POISON, WAIT)
            assert result.status == "failed"
            assert result.error is not None
            assert result.error["type"] == "EngineError"
            assert "UnstorableData" in result.error["message"]
    finally:
        await drop_schema(postgres_url, schema)
