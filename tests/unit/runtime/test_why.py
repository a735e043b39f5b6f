"""`Client.why` (runtime/why.py) on real runs: each reason a run can be waiting for, read
from the store, the history and the bus; and `tideflow runs why` on a store no engine is
live on."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tideflow.bus.backends.local import LocalBus
from tideflow.bus.base import Message, QueueStats, WorkerBeat
from tideflow.cli.main import app
from tideflow.dsl import compile_definition
from tideflow.model.commands import DispatchTask
from tideflow.model.plan import Priority
from tideflow.model.run import new_run_state
from tideflow.runtime.partitions import PARTITION_COUNT
from tideflow.runtime.runtime import Runtime
from tideflow.runtime.why import OVERDUE, STUCK, Diagnosis, Reason, WhyKind, _Seen, reasons_of
from tideflow.store import open_store
from tideflow.store.base import Lease
from tideflow.testing.waiting import step_is, wait_until
from tideflow.worker.executors.functions import register, unregister

GATE: dict[str, asyncio.Event] = {}

WAITS = {
    "name": "waits",
    "version": "1",
    "steps": [
        {
            "id": "ask",
            "type": "wait",
            "signal": "approve",
            "match": "{{ signal.ok == true }}",
            "timeout": "1h",
        },
        {"id": "nap", "type": "sleep", "duration": "10m"},
        {"id": "gpu", "type": "python", "function": "why.slow", "queue": "gpu"},
        {"id": "after", "type": "noop", "depends_on": ["ask", "nap"]},
        {"id": "final", "type": "noop", "depends_on": ["after"]},
    ],
}
TWO = {
    "name": "two",
    "version": "1",
    "steps": [
        {"id": "a", "type": "python", "function": "why.slow"},
        {"id": "b", "type": "python", "function": "why.slow"},
    ],
}
FLAKY = {
    "name": "flaky",
    "version": "1",
    "steps": [
        {
            "id": "charge",
            "type": "python",
            "function": "why.broken",
            "retry": {"max_attempts": 3, "backoff": "1h"},
        }
    ],
}
CHILD = {
    "name": "child",
    "version": "1",
    "steps": [{"id": "hold", "type": "wait", "signal": "go"}],
}
PARENT = {
    "name": "parent",
    "version": "1",
    "steps": [{"id": "sub", "type": "subflow", "workflow": "child"}],
}


@pytest.fixture(autouse=True)
def functions() -> Iterator[None]:
    @register("why.slow")
    async def slow() -> str:
        await GATE["release"].wait()
        return "done"

    @register("why.broken")
    def broken() -> None:
        raise ConnectionError("payments down")

    yield
    unregister("why.slow")
    unregister("why.broken")


@pytest.fixture
async def rt(request: pytest.FixtureRequest) -> AsyncIterator[Runtime]:
    """A runtime with one worker (``@pytest.mark.parametrize("rt", [0], indirect=True)``:
    none, so no queue has a reader)."""
    GATE["release"] = asyncio.Event()
    async with Runtime(workers=getattr(request, "param", 1)) as runtime:
        for definition in (WAITS, TWO, FLAKY, CHILD, PARENT):
            await runtime.client.register(definition)
        yield runtime
        GATE["release"].set()


def by_step(diagnosis: Diagnosis) -> dict[str | None, list[Reason]]:
    found: dict[str | None, list[Reason]] = {}
    for reason in diagnosis.reasons:
        found.setdefault(reason.step, []).append(reason)
    return found


@pytest.mark.parametrize("rt", [0], indirect=True)
async def test_a_run_that_waits_names_its_signal_timer_queue_and_join(rt: Runtime) -> None:
    run_id = await rt.client.start("waits")
    await wait_until(rt, run_id, step_is("nap", "waiting"))
    await wait_until(rt, run_id, step_is("ask", "waiting"))
    await rt.client.signal(run_id, "approve", {"ok": False})  # kept: its match is false
    await wait_until(rt, run_id, lambda s: bool(s.signals))

    steps = by_step(await rt.client.why(run_id))

    (ask,) = steps["ask"]
    assert ask.kind is WhyKind.WAITING_FOR_SIGNAL
    assert ask.data == {
        "signal": "approve",
        "match": "signal.ok == true",
        "kept_unmatched": 1,
        "timeout_action": "fail",
    }
    assert "since" in ask.text and "times out at" in ask.text and ask.at is not None
    (nap,) = steps["nap"]
    assert nap.kind is WhyKind.TIMER and nap.data == {"timer": "sleep"}
    assert "sleep is due at" in nap.text
    (gpu,) = steps["gpu"]  # the runtime has no worker
    assert gpu.kind is WhyKind.NO_CONSUMER and gpu.kind in STUCK
    assert gpu.data["queue"] == "gpu" and gpu.data["consumers"] == 0
    assert "tideflow worker --queues gpu" in gpu.text
    (after,) = steps["after"]
    assert after.kind is WhyKind.JOIN
    assert after.data == {"join": "all", "waiting_on": {"ask": "waiting", "nap": "waiting"}}
    assert "final" not in steps  # it waits on `after`, which waits: only the front is named
    assert None not in steps  # an engine is live here: no run-wide reason


async def test_an_attempt_on_a_worker_and_one_queued_behind_it(rt: Runtime) -> None:
    run_id = await rt.client.start("two")
    state = await wait_until(
        rt, run_id, lambda s: any(st.attempt_started_at for st in s.steps.values())
    )
    running = next(k for k, st in state.steps.items() if st.attempt_started_at)
    queued = "b" if running == "a" else "a"

    steps = by_step(await rt.client.why(run_id))
    assert set(steps) == {"a", "b"}, (state.steps, steps)

    (on_worker,) = steps[running]
    assert on_worker.kind is WhyKind.ON_WORKER
    worker = on_worker.data["worker"]
    assert worker and "/" in worker  # host/pid
    assert on_worker.since == state.steps[running].attempt_started_at
    assert on_worker.data["last_beat"] >= on_worker.since  # its reader beats: live
    assert "its last heartbeat was at" in on_worker.text
    (waiting,) = steps[queued]
    assert waiting.kind is WhyKind.QUEUED and waiting.data["consumers"] == 1
    assert "not started by a worker" in waiting.text

    readers = [1]

    async def queues() -> list[QueueStats]:
        stats = QueueStats(
            queue="default",
            priority=Priority.NORMAL,
            depth=1,
            held=1,
            oldest_age=1.0,
            consumers=readers[0],
        )
        return [stats]

    stopped = WorkerBeat(worker=worker, queues=None, last_beat=1_700_000_000.0, live=False)
    beats = [WorkerBeat(worker="other/1", queues=None, last_beat=time.time(), live=True), stopped]

    async def worker_beats() -> list[WorkerBeat]:
        return beats

    rt.client.queues = queues  # type: ignore[method-assign]
    rt.client.worker_beats = worker_beats  # type: ignore[method-assign]
    gone = by_step(await rt.client.why(run_id))[running][0]  # another worker reads on
    assert gone.kind is WhyKind.WORKER_GONE and gone.kind in STUCK
    assert gone.data["last_beat"] == stopped.last_beat
    assert "its heartbeat stopped at 2023-11-14T22:13:20Z" in gone.text
    assert "delivered again when its lease lapses" in gone.text

    beats, readers[0] = [], 0  # no beat on record (an older worker): by the queue's readers
    gone = by_step(await rt.client.why(run_id))[running][0]
    assert gone.kind is WhyKind.WORKER_GONE and "last_beat" not in gone.data
    assert "no heartbeat of it is on record" in gone.text
    GATE["release"].set()
    assert (await rt.client.wait(run_id, timeout=10)).status == "succeeded"
    (ended,) = (await rt.client.why(run_id)).reasons
    assert ended.kind is WhyKind.ENDED and "succeeded" in ended.text


async def test_a_retry_backoff_is_due_and_then_overdue(rt: Runtime) -> None:
    run_id = await rt.client.start("flaky")
    state = await wait_until(rt, run_id, step_is("charge", "retrying"))
    fire_at = state.timers[state.steps["charge"].timers[0]].fire_at

    (backoff,) = by_step(await rt.client.why(run_id))["charge"]
    assert backoff.kind is WhyKind.TIMER and backoff.at == fire_at
    assert backoff.data == {"timer": "retry"} and "retry backoff" in backoff.text

    from tideflow.runtime.why import diagnose

    late = await diagnose(rt.client, run_id, now=fire_at + OVERDUE + 60)
    (overdue,) = by_step(late)["charge"]
    assert overdue.kind is WhyKind.TIMER_OVERDUE and "has not fired" in overdue.text


async def test_a_subflow_names_its_child_run_and_the_child_its_wait(rt: Runtime) -> None:
    run_id = await rt.client.start("parent")
    state = await wait_until(
        rt, run_id, lambda s: bool(s.steps.get("sub", None)) and bool(s.steps["sub"].child_run_id)
    )
    child = state.steps["sub"].child_run_id
    assert child is not None
    await wait_until(rt, child, step_is("hold", "waiting"))

    (sub,) = by_step(await rt.client.why(run_id))["sub"]
    assert sub.kind is WhyKind.CHILD_RUN
    assert sub.data == {"child_run_id": child, "child_status": "running"}
    (hold,) = by_step(await rt.client.why(child))["hold"]
    assert hold.kind is WhyKind.WAITING_FOR_SIGNAL and hold.data["signal"] == "go"


class DownBus(LocalBus):
    """The in-process bus with a broker that refuses every task."""

    async def publish_tasks(self, tasks: Sequence[DispatchTask | Message[DispatchTask]]) -> None:
        raise ConnectionError("the broker connection was reset")


async def test_effects_that_wait_to_be_relayed_are_named() -> None:
    GATE["release"] = asyncio.Event()
    async with Runtime(workers=1, bus=DownBus()) as runtime:
        await runtime.client.register(TWO)
        run_id = await runtime.client.start("two")
        await wait_until(runtime, run_id, step_is("a", "running"))
        reasons = (await runtime.client.why(run_id)).reasons
        (backlog,) = [r for r in reasons if r.kind is WhyKind.RELAY_BACKLOG]
        (retrying,) = backlog.data["retrying"]
        assert retrying["what"].startswith("dispatch") and retrying["tries"] >= 1
        assert "wait to be relayed" in backlog.text and "failed" in backlog.text


def tool(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


def test_runs_why_on_a_store_no_engine_is_live_on(tmp_path: Path) -> None:
    flow = tmp_path / "waits.json"
    flow.write_text(json.dumps(CHILD))
    store = f"sqlite:///{tmp_path}/runs.db"
    assert tool("definitions", "register", str(flow), "--store", store).exit_code == 0
    started = tool("runs", "start", str(flow), "--store", store)
    assert started.exit_code == 0, started.output
    run_id = started.stdout.strip()

    shown = tool("runs", "why", run_id, "--store", store, "--json")
    assert shown.exit_code == 1, shown.output  # nothing moves it: someone must act
    found = json.loads(shown.stdout)
    kinds = [r["kind"] for r in found["reasons"]]
    assert found["status"] == "running" and kinds == ["no_engine", "waiting_for_signal"]
    assert "tideflow resume" in found["reasons"][0]["text"]
    text = tool("runs", "why", run_id, "--store", store)
    assert f"run {run_id}: running" in text.stdout and "no live engine" in text.stdout

    asyncio.run(_claim_partition_count(store))
    cluster = json.loads(tool("runs", "why", run_id, "--store", store, "--json").stdout)
    (no_server,) = [r for r in cluster["reasons"] if r["kind"] == "no_engine"]
    assert "no live server holds event partition" in no_server["text"]
    assert 0 <= no_server["data"]["partition"] < 4

    missing = tool("runs", "why", "nope", "--store", store)
    assert missing.exit_code == 2 and "nope" in missing.stderr


async def _claim_partition_count(store: str) -> None:
    """Make the store a cluster's, of 4 partitions that no live server holds."""
    opened = open_store(store)
    await opened.open()
    try:
        now = time.time()
        count = Lease(
            name=PARTITION_COUNT,
            owner="4",
            kind="cluster",
            host="h",
            pid=1,
            address=None,
            acquired_at=now,
            expires_at=now + 3600,
        )
        await opened.acquire_lease(count, now=now)
    finally:
        await opened.close()


def test_a_diagnosis_reads_back_from_its_json() -> None:
    reason = Reason(kind=WhyKind.TIMER, text="t", step="s", at=1.0, data={"timer": "sleep"})
    diagnosis = Diagnosis(run_id="r", status="running", checked_at=2.0, reasons=(reason,))
    assert Diagnosis.of(json.loads(json.dumps(diagnosis.to_dict()))) == diagnosis


def test_a_stored_run_no_engine_has_started_says_so() -> None:
    plan = compile_definition(CHILD)
    state = new_run_state(
        run_id="r", workflow="child", version="1", plan_hash=plan.hash, created_at=10.0
    )
    seen = _Seen(
        state=state,
        plan=plan,
        history=[],
        now=20.0,
        queues=None,
        beats=None,
        engine=None,
        outbox=[],
        relaying=[],
        children={},
    )
    (reason,) = reasons_of(seen)
    assert reason.kind is WhyKind.NOT_STARTED and reason.since == 10.0


MANY = {
    "name": "many",
    "version": "1",
    "steps": [
        {
            "id": "fan",
            "type": "map",
            "items": "{{ inputs.items }}",
            "step": {"id": "one", "type": "python", "function": "why.slow"},
        }
    ],
}


@pytest.mark.parametrize("rt", [0], indirect=True)
async def test_a_map_in_flight_names_twenty_items_and_counts_the_rest(rt: Runtime) -> None:
    await rt.client.register(MANY)
    run_id = await rt.client.start("many", {"items": list(range(50))})
    await wait_until(rt, run_id, lambda s: len(s.steps) > 50)
    reasons = (await rt.client.why(run_id)).reasons
    named = [r for r in reasons if r.kind is WhyKind.NO_CONSUMER and r.step is not None]
    (rest,) = [r for r in reasons if r.kind is WhyKind.NO_CONSUMER and r.step is None]
    assert len(named) == 20 and rest.data == {"more": 30} and "30 more" in rest.text
