"""What a committed batch asks for is carried out even when the bus, a listener or the
store fails for a while: every run still finishes, nothing is applied twice, and the
other runs carry on.

A real runtime runs on a real store; the bus is the in-process bus behind ``FlakyBus``,
which fails the publications a ``Fault`` matches once, N times, or until it is healed,
with the ``ConnectionError`` a network broker raises.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tideflow.bus.backends.local import LocalBus
from tideflow.bus.base import Message
from tideflow.dsl import compile_definition
from tideflow.model.commands import DispatchTask
from tideflow.model.events import ChildRunFinished, Event, TimerFired, Transition
from tideflow.model.plan import Plan
from tideflow.model.run import RunState
from tideflow.runtime.runtime import Runtime
from tideflow.store.base import AppliedEvent, Store, StoreUnavailable
from tideflow.testing.waiting import step_is, wait_until
from tideflow.worker.executors.functions import register, unregister

from .conftest import Backend, sqlite_backend

WAIT = 20.0


def flow(text: str) -> Plan:
    return compile_definition(textwrap.dedent(text))


TWO_STEPS = flow(
    """
    name: two-steps
    version: "1"
    steps:
      - {id: a, type: python, function: relay.echo, input: {v: "{{ inputs.v }}"}}
      - {id: b, type: python, function: relay.echo, depends_on: [a], input: {v: "{{ steps.a.output }}"}}
    output: "{{ steps.b.output }}"
    """
)
CHILD = flow(
    """
    name: child
    version: "1"
    steps: [{id: c, type: python, function: relay.echo, input: {v: "{{ inputs.v }}"}}]
    output: "{{ steps.c.output }}"
    """
)
PARENT = flow(
    """
    name: parent
    version: "1"
    steps:
      - {id: kid, type: subflow, workflow: child, input: {v: "{{ inputs.v }}"}}
      - {id: after, type: python, function: relay.echo, depends_on: [kid], input: {v: "{{ steps.kid.output }}"}}
    output: "{{ steps.after.output }}"
    """
)
SLEEPER = flow(
    """
    name: sleeper
    version: "1"
    steps:
      - {id: nap, type: sleep, duration: 20ms}
      - {id: b, type: python, function: relay.echo, depends_on: [nap], input: {v: "{{ inputs.v }}"}}
    output: "{{ steps.b.output }}"
    """
)


@pytest.fixture(autouse=True)
def echo() -> Any:
    register("relay.echo")(lambda v: v)
    yield
    unregister("relay.echo")


@dataclass
class Fault:
    """Fail publications holding a message ``matches`` accepts: ``times`` of them, or all
    until ``heal`` (``times=None``)."""

    matches: Callable[[Any], bool]
    times: int | None = 1
    failed: int = 0

    def trips(self, messages: Sequence[Any]) -> bool:
        if self.times is not None and self.failed >= self.times:
            return False
        if not any(self.matches(m) for m in messages):
            return False
        self.failed += 1
        return True

    def heal(self) -> None:
        self.times = self.failed


class FlakyBus(LocalBus):
    """The in-process bus, with publications that fail when a fault says so."""

    def __init__(self) -> None:
        super().__init__()
        self.faults: list[Fault] = []

    def fail(self, fault: Fault) -> Fault:
        self.faults.append(fault)
        return fault

    def _check(self, messages: Sequence[Any]) -> None:
        for fault in self.faults:
            if fault.trips(messages):
                raise ConnectionError("the broker connection was reset")

    async def publish_tasks(self, tasks: Sequence[DispatchTask | Message[DispatchTask]]) -> None:
        self._check(tasks)
        await super().publish_tasks(tasks)

    async def publish_events(self, events: Sequence[Event | Message[Event]]) -> None:
        self._check(events)
        await super().publish_events(events)


def kind(cls: type) -> Callable[[Any], bool]:
    return lambda message: isinstance(message, cls)


@pytest.fixture(params=["memory", "sqlite"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return "memory://" if request.param == "memory" else f"sqlite:///{tmp_path}/runs.db"


@pytest.fixture
def bus() -> FlakyBus:
    return FlakyBus()


@pytest.fixture
async def rt(store_url: str, bus: FlakyBus) -> AsyncIterator[Runtime]:
    async with Runtime(store=store_url, bus=bus, workers=4) as rt:
        await rt.register(CHILD)
        yield rt


async def run_all(rt: Runtime, plan: Plan, ids: Sequence[str]) -> dict[str, Any]:
    for run_id in ids:
        await rt.start_run(plan, {"v": run_id}, run_id=run_id)
    results = await asyncio.gather(*(rt.wait(run_id, WAIT) for run_id in ids))
    assert {r.run_id: r.status for r in results} == dict.fromkeys(ids, "succeeded")
    return {r.run_id: r.output for r in results}


async def applied_once(rt: Runtime, run_id: str) -> None:
    """Every event in the run's history is there once (none applied twice)."""
    entries = await rt.store.history(run_id)
    ids = Counter(e.event["event_id"] for e in entries)
    assert [i for i, n in ids.items() if n > 1] == []
    kinds = Counter(e.kind for e in entries)
    assert kinds["run_started"] == 1


# -- listeners --------------------------------------------------------------------------


async def test_a_listener_that_raises_once_strands_no_run(rt: Runtime) -> None:
    raised: list[str] = []

    def flaky(state: RunState, transitions: Sequence[Transition]) -> None:
        if not raised:
            raised.append(state.run_id)
            raise RuntimeError("a listener bug")

    rt.add_listener(flaky)
    outputs = await run_all(rt, TWO_STEPS, ["one", "two", "three"])
    assert raised and outputs == {"one": "one", "two": "two", "three": "three"}


async def test_a_listener_that_always_raises_keeps_the_others_informed(
    rt: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[str] = []

    def broken(state: RunState, transitions: Sequence[Transition]) -> None:
        raise RuntimeError("always broken")

    rt.add_listener(broken)
    rt.add_listener(lambda state, transitions: seen.append(state.run_id))
    await run_all(rt, TWO_STEPS, ["x", "y"])
    assert {"x", "y"} <= set(seen)
    failures = [r for r in caplog.records if "listener" in r.getMessage()]
    assert failures and "run x" in " ".join(r.getMessage() for r in failures)
    assert "broken" in failures[0].getMessage()


# -- the bus ----------------------------------------------------------------------------


@pytest.mark.parametrize("times", [1, 3])
async def test_child_run_finished_that_fails_to_publish_still_reaches_the_parent(
    rt: Runtime, bus: FlakyBus, times: int
) -> None:
    fault = bus.fail(Fault(kind(ChildRunFinished), times))
    outputs = await run_all(rt, PARENT, ["p1", "p2"])
    assert outputs == {"p1": "p1", "p2": "p2"}
    assert fault.failed == times
    for run_id in ("p1", "p2"):
        await applied_once(rt, run_id)
        kinds = Counter(e.kind for e in await rt.store.history(run_id))
        assert kinds["child_run_finished"] == 1


@pytest.mark.parametrize("times", [1, 3])
async def test_tasks_that_fail_to_publish_are_dispatched_again(
    rt: Runtime, bus: FlakyBus, times: int
) -> None:
    fault = bus.fail(Fault(kind(DispatchTask), times))
    outputs = await run_all(rt, TWO_STEPS, ["t1", "t2", "t3"])
    assert outputs == {"t1": "t1", "t2": "t2", "t3": "t3"}
    assert fault.failed == times
    for run_id in outputs:
        await applied_once(rt, run_id)
        results = await rt.result(run_id)
        assert [s.attempts for s in results.steps.values()] == [1, 1]


async def test_a_fired_timer_that_fails_to_publish_fires_again(rt: Runtime, bus: FlakyBus) -> None:
    fault = bus.fail(Fault(kind(TimerFired), 2))
    outputs = await run_all(rt, SLEEPER, ["s1", "s2"])
    assert outputs == {"s1": "s1", "s2": "s2"}
    assert fault.failed == 2


async def test_a_bus_that_fails_until_it_recovers_leaves_effects_pending_then_relays_them(
    rt: Runtime, bus: FlakyBus
) -> None:
    fault = bus.fail(Fault(lambda m: isinstance(m, DispatchTask) and m.run_id == "stuck", None))
    await rt.start_run(TWO_STEPS, {"v": "stuck"}, run_id="stuck")
    await wait_until(rt, "stuck", step_is("a", "running"))
    assert rt.pending_effects >= 1
    await run_all(rt, TWO_STEPS, ["free1", "free2"])  # the others carry on meanwhile
    assert (await rt.store.get_run("stuck")).status == "running"
    fault.heal()
    result = await rt.wait("stuck", WAIT)
    assert result.status == "succeeded"
    assert rt.pending_effects == 0


# -- the store --------------------------------------------------------------------------


def fail_commits(store: Store, *, times: int, after: bool, relayed_only: bool) -> list[int]:
    """Make ``store.commit`` raise ``times`` times: before writing, or ``after`` it wrote
    (a commit that went through but whose answer was lost); with ``relayed_only`` only
    commits that forget relayed outbox ids."""
    original = store.commit
    failed = [0]

    async def commit(batch: Sequence[AppliedEvent], relayed: Sequence[str] = ()) -> None:
        hit = failed[0] < times and (bool(relayed) or not relayed_only)
        if hit and after:
            await original(batch, relayed)
        if hit:
            failed[0] += 1
            raise StoreUnavailable("the connection dropped")
        await original(batch, relayed)

    store.commit = commit  # type: ignore[method-assign]
    return failed


async def test_a_commit_that_fails_while_forgetting_relayed_effects_applies_nothing_twice(
    rt: Runtime,
) -> None:
    failed = fail_commits(rt.store, times=2, after=False, relayed_only=True)
    await run_all(rt, PARENT, ["f1", "f2", "f3"])
    assert failed[0] == 2
    for run_id in ("f1", "f2", "f3"):
        await applied_once(rt, run_id)
        kinds = Counter(e.kind for e in await rt.store.history(run_id))
        assert kinds["child_run_finished"] == 1


async def test_a_commit_that_went_through_but_reported_failure_applies_nothing_twice(
    rt: Runtime,
) -> None:
    failed = fail_commits(rt.store, times=1, after=True, relayed_only=False)
    await run_all(rt, TWO_STEPS, ["g1", "g2"])
    assert failed[0] == 1
    for run_id in ("g1", "g2"):
        await applied_once(rt, run_id)


# -- restarts (SQLite and PostgreSQL) ----------------------------------------------------


async def _child_finished_unheard(backend: Backend) -> str:
    """Run a parent until its child finished, while the bus refuses every ChildRunFinished;
    stop the engine there and return the parent's id."""
    bus = FlakyBus()
    bus.fail(Fault(kind(ChildRunFinished), None))
    async with Runtime(store=backend.make(), bus=bus, workers=2) as rt:
        await rt.register(CHILD)
        await rt.start_run(PARENT, {"v": "later"}, run_id="parent")
        state = await wait_until(
            rt, "parent", lambda s: "kid" in s.steps and bool(s.steps["kid"].child_run_id), WAIT
        )
        child = await rt.wait(str(state.steps["kid"].child_run_id), WAIT)
        assert child.status == "succeeded"
        assert (await rt.store.get_run("parent")).status == "running"
    return "parent"


@pytest.mark.parametrize("outbox", ["kept", "lost"])
async def test_a_parent_whose_child_finished_unheard_finishes_after_a_restart(
    sql_backend: Backend, outbox: str
) -> None:
    parent = await _child_finished_unheard(sql_backend)
    if outbox == "lost":  # as a store written before effects were acknowledged holds it
        assert sql_backend.raw is not None
        await sql_backend.raw("DELETE FROM outbox")
    async with Runtime(store=sql_backend.make(), workers=2) as rt:
        result = await rt.wait(parent, WAIT)
        assert result.status == "succeeded"
        assert result.output == "later"
        await applied_once(rt, parent)
        kinds = Counter(e.kind for e in await rt.store.history(parent))
        assert kinds["child_run_finished"] == 1


def db_status(url: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "tideflow.cli.main", "db", "status", "--json", "--store", url],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


async def test_db_status_counts_the_effects_a_stopped_engine_left(tmp_path: Path) -> None:
    backend = sqlite_backend(tmp_path)
    parent = await _child_finished_unheard(backend)
    url = f"sqlite:///{tmp_path / 'store.db'}"
    assert db_status(url)["pending_effects"] == 1  # the child's end, not yet told
    async with Runtime(store=backend.make(), workers=2) as rt:
        assert (await rt.wait(parent, WAIT)).status == "succeeded"
    assert db_status(url)["pending_effects"] == 0
