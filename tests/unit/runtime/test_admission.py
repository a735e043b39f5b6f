"""Admission (runtime/admission.py): a bounded number of busy runs per engine, the rest
pending in the store and admitted by priority, then age, as busy runs end or park."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from tideflow.dsl import compile_definition
from tideflow.model.events import RunStarted
from tideflow.model.plan import Plan, Priority
from tideflow.runtime.admission import (
    Admission,
    Admitter,
    bound_from_environment,
    check_bound,
    default_bound,
)
from tideflow.runtime.runtime import Runtime
from tideflow.store.backends.memory import MemoryStore
from tideflow.store.base import PendingRun
from tideflow.testing.waiting import step_is, wait_until


def plan(text: str) -> Plan:
    return compile_definition(textwrap.dedent(text))


WAITER = plan(
    """
    name: waiter
    version: "1"
    steps:
      - {id: hold, type: wait, signal: go}
    """
)
BUSY = plan(
    """
    name: busy
    version: "1"
    steps:
      - {id: hold, type: python, function: admission.never_run}
    """
)
"""Busy while its attempt is in flight: with no worker (``workers=0``) it stays there."""
CHILD = plan(
    """
    name: child
    version: "1"
    steps:
      - {id: hold, type: python, function: admission.never_run}
    """
)
PARENT = plan(
    """
    name: parent
    version: "1"
    steps:
      - {id: sub, type: subflow, workflow: child}
      - {id: work, type: python, function: admission.never_run}
    """
)
QUICK = plan(
    """
    name: quick
    version: "1"
    steps:
      - {id: a, type: noop}
    """
)
WAIT_THEN_WORK = plan(
    """
    name: wait_then_work
    version: "1"
    steps:
      - {id: hold, type: wait, signal: go}
      - {id: work, type: python, function: admission.never_run, depends_on: [hold]}
    """
)


# -- the bookkeeping -------------------------------------------------------------------


def started(run_id: str, parent: str | None = None) -> RunStarted:
    return RunStarted(event_id=f"{run_id}:started", run_id=run_id, time=0.0, parent_run_id=parent)


def test_a_start_only_wakes_the_admitter_but_its_own_or_a_childs_goes_at_once() -> None:
    book = Admission(2)
    assert not book.gate(started("a"))  # held: admitted from the store, in order
    assert book.waiting and book.held == 1
    book.reserve(["a"])
    book.admitting["a"] = None  # being admitted: only the admitter's own start passes
    assert not book.gate(started("a"))
    own = book.admitting["a"] = started("a")
    assert book.gate(own)
    del book.admitting["a"]
    assert book.gate(started("a"))  # admitted: a duplicate (stale), or one that comes again
    assert book.gate(started("kid", parent="p"))  # never waits
    assert book.active == {"a", "kid"} and book.room == 0
    assert book.gate(started("kid2", parent="p"))  # over the bound: a child still never waits
    assert book.room == 0
    book.settle("kid2", False)  # a duplicate of an ended run, a run not stored
    book.ended("a")
    assert book.active == {"kid"} and book.room == 1


def test_partitions_given_up_take_their_runs_out_of_the_count() -> None:
    book = Admission(10)
    book.reserve(["p0-a", "p1-b", "p0-c"])
    book.forget(lambda run_id: run_id.startswith("p0"))
    assert book.active == {"p1-b"}


def queue_of(*run_ids: str) -> list[PendingRun]:
    return [PendingRun(rank=1, created_at=float(n), run_id=r) for n, r in enumerate(run_ids)]


def admitter_over(
    queue: list[PendingRun], bound: int, owns: set[str] | None = None
) -> tuple[Admitter, list[list[str]]]:
    started: list[list[str]] = []

    async def read(limit: int, after: PendingRun | None) -> list[PendingRun]:
        rest = [p for p in queue if after is None or p > after]
        return rest[:limit]

    async def start(run_ids: list[str]) -> int:
        started.append(run_ids)
        for run_id in run_ids:  # started: out of the queue
            queue[:] = [p for p in queue if p.run_id != run_id]
        return len(run_ids)

    return (
        Admitter(
            Admission(bound),
            read=read,
            owns=(lambda r: True) if owns is None else owns.__contains__,
            start=start,
        ),
        started,
    )


async def test_the_admitter_admits_the_head_of_the_queue_up_to_the_bound() -> None:
    queue = queue_of(*(f"r{n}" for n in range(200)))
    admitter, started = admitter_over(queue, bound=3)
    admitter.recheck()
    assert [p.run_id for p in await admitter.fill()] == ["r0", "r1", "r2"]
    assert started == [["r0", "r1", "r2"]]
    assert admitter.admission.waiting  # the queue holds more
    assert await admitter.fill() == []  # no room: nothing read, nothing admitted
    admitter.admission.ended("r1")
    assert [p.run_id for p in await admitter.fill()] == ["r3"]


async def test_the_admitter_skips_other_engines_runs_and_says_when_the_queue_ran_out() -> None:
    queue = queue_of(*(f"r{n}" for n in range(150)))
    mine = {"r7", "r140", "r149"}
    admitter, started = admitter_over(queue, bound=10, owns=mine)
    admitter.recheck()
    assert [p.run_id for p in await admitter.fill()] == ["r7", "r140", "r149"]
    assert started == [["r7"], ["r140", "r149"]]  # one start per page read
    assert not admitter.admission.waiting  # nothing of its own waits any more


async def test_room_freed_while_the_admitter_starts_runs_goes_to_the_next_in_line() -> None:
    queue = queue_of("a", "b", "c")
    admitter, _ = admitter_over(queue, bound=2)
    book = admitter.admission
    book.reserve(["x"])  # one run active: room for one
    admitter.recheck()
    real = admitter._start

    async def start_while_x_ends(run_ids: list[str]) -> int:
        book.ended("x")  # a run ends meanwhile
        return await real(run_ids)

    admitter._start = start_while_x_ends
    assert [p.run_id for p in await admitter.fill()] == ["a", "b"]  # b, not past it
    assert book.waiting  # c still waits


async def test_a_start_held_while_the_admitter_read_keeps_it_reading() -> None:
    queue = queue_of("a")
    admitter, _ = admitter_over(queue, bound=5)
    book = admitter.admission
    admitter.recheck()
    real = admitter._read

    async def read_then_hold(limit: int, after: PendingRun | None) -> list[PendingRun]:
        page = await real(limit, after)
        book.gate(started("late"))  # a start arrives during the read
        return page

    admitter._read = read_then_hold
    await admitter.fill()
    assert book.waiting  # "late" was created after the read: it must be read again


def test_the_bound_is_checked_and_read_from_the_environment() -> None:
    assert default_bound(10_000) == 1000 and default_bound(5) == 1
    assert check_bound(7) == 7
    for bad in (0, -1, True, 2.5):
        with pytest.raises(ValueError, match="max active runs"):
            check_bound(bad)  # type: ignore[arg-type]
    assert bound_from_environment({}) is None
    assert bound_from_environment({"TIDEFLOW_MAX_ACTIVE_RUNS": " 250 "}) == 250
    with pytest.raises(ValueError, match="TIDEFLOW_MAX_ACTIVE_RUNS='many'"):
        bound_from_environment({"TIDEFLOW_MAX_ACTIVE_RUNS": "many"})
    with pytest.raises(ValueError, match="max active runs"):
        Runtime(max_active_runs=0)


# -- an engine -------------------------------------------------------------------------


async def started_order(rt: Runtime, run_ids: list[str]) -> list[str]:
    """The runs that have started, by the time their RunStarted was applied."""
    times = {}
    for run_id in run_ids:
        for entry in await rt.store.history(run_id):
            if entry.kind == "run_started":
                times[run_id] = (entry.time, entry.seq)
    return sorted(times, key=times.__getitem__)


def busy_runtime(store: MemoryStore | str, bound: int, **options: Any) -> Runtime:
    """No worker: a BUSY run's attempt stays in flight, the run holds its slot."""
    return Runtime(store=store, workers=0, max_active_runs=bound, **options)


async def busy(rt: Runtime, run_id: str) -> None:
    await wait_until(rt, run_id, step_is("hold", "running"))


async def release(rt: Runtime, run_id: str) -> None:
    """Let a busy run end (its slot frees): cancelled, as no worker runs its attempt."""
    await busy(rt, run_id)
    await rt.cancel(run_id)
    assert (await rt.wait(run_id, timeout=10)).status == "cancelled"


async def test_runs_past_the_bound_wait_and_are_admitted_by_priority_then_age() -> None:
    async with busy_runtime(MemoryStore(), 2) as rt:
        first = [await rt.start_run(BUSY) for _ in range(2)]
        for run_id in first:
            await busy(rt, run_id)
        low = await rt.start_run(BUSY, priority="low")
        normal = [await rt.start_run(BUSY) for _ in range(2)]
        high = await rt.start_run(BUSY, priority=Priority.HIGH)
        assert rt.admission[:2] == (2, 2)
        queued = [low, *normal, high]
        assert [(await rt.store.get_run(r)).status for r in queued] == ["pending"] * 4
        assert await rt.store.count_pending() == 4
        for run_id in [*first, high, *normal]:  # each end admits the next in line
            await release(rt, run_id)
        await release(rt, low)
        assert await started_order(rt, [*first, *queued]) == [*first, high, *normal, low]
        assert rt.admission[:2] == (0, 2)


async def test_a_child_of_an_active_parent_is_admitted_at_once() -> None:
    async with busy_runtime(MemoryStore(), 1) as rt:
        await rt.register(CHILD)
        parent = await rt.start_run(PARENT)
        waiting = await wait_until(rt, parent, step_is("sub", "running"))
        child = waiting.steps["sub"].child_run_id
        assert child is not None
        await busy(rt, child)  # over the bound: no deadlock
        assert rt.admission[:2] == (2, 1)
        other = await rt.start_run(BUSY)  # not a child: it waits for room
        assert (await rt.store.get_run(other)).status == "pending"
        await rt.cancel(parent)
        assert (await rt.wait(parent, timeout=10)).status == "cancelled"
        await release(rt, other)


async def test_a_cancelled_pending_run_leaves_the_queue() -> None:
    async with busy_runtime(MemoryStore(), 1) as rt:
        holder = await rt.start_run(BUSY)
        await busy(rt, holder)
        queued = await rt.start_run(BUSY)
        await rt.cancel(queued)
        assert (await rt.wait(queued, timeout=10)).status == "cancelled"
        assert await rt.store.count_pending() == 0
        assert rt.admission[:2] == (1, 1)  # the cancelled run took no slot
        await release(rt, holder)
        later = await rt.start_run(BUSY)
        await release(rt, later)  # admitted: the queue and the count are right


async def test_a_new_engine_counts_the_active_runs_and_admits_from_the_store(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    async with busy_runtime(url, 2) as rt:
        run_ids = [await rt.start_run(BUSY) for _ in range(2)]
        for run_id in run_ids:
            await busy(rt, run_id)
        run_ids += [await rt.start_run(BUSY) for _ in range(3)]
    async with busy_runtime(url, 2) as rt:
        assert rt.admission[:2] == (2, 2)
        assert await rt.store.count_pending() == 3
        for run_id in run_ids:
            await release(rt, run_id)
        assert await started_order(rt, run_ids) == run_ids


async def test_why_says_how_many_runs_are_ahead_of_a_pending_one() -> None:
    async with busy_runtime(MemoryStore(), 1) as rt:
        holder = await rt.start_run(BUSY)
        await busy(rt, holder)
        ahead = [await rt.start_run(BUSY) for _ in range(2)]
        last = await rt.start_run(BUSY, priority="low")
        diagnosis = await rt.client.why(last)
        [reason] = [r for r in diagnosis.reasons if r.kind == "not_started"]
        assert reason.text.startswith("pending: 2 run(s) ahead of it (admission bound 1, 1 active)")
        assert reason.data == {
            "ahead": 2,
            "priority": "low",
            "active": 1,
            "bound": 1,
            "tasks": 1,
            "task_bound": 1,
            "claimed": 1,
        }
        assert "attempts in flight" not in reason.text  # the run bound is what holds it
        for run_id in [holder, *ahead, last]:
            await release(rt, run_id)


async def test_the_sweep_repairs_nothing_for_runs_held_by_the_bound() -> None:
    from tideflow.testing.clock import ManualClock

    clock = ManualClock()
    async with busy_runtime(MemoryStore(), 1, clock=clock) as rt:
        holder = await rt.start_run(BUSY)
        await busy(rt, holder)
        queued = []
        for _ in range(3):
            clock.advance(1)  # (runs created at one instant are admitted by run id)
            queued.append(await rt.start_run(BUSY))
        clock.advance(3600)  # long pending: but queued, not lost
        assert not await rt._engine.sweep.round()
        for run_id in [holder, *queued]:
            await release(rt, run_id)


# -- parked runs hold no slot ------------------------------------------------------------


async def finish_waiters(rt: Runtime, run_ids: list[str]) -> None:
    for run_id in run_ids:
        await rt.signal(run_id, "go", {})
    for run_id in run_ids:
        assert (await rt.wait(run_id, timeout=10)).status == "succeeded"


async def test_runs_that_only_wait_hold_no_slot() -> None:
    async with Runtime(store=MemoryStore(), max_active_runs=2) as rt:
        waiting = [await rt.start_run(WAITER) for _ in range(3)]
        for run_id in waiting:
            await wait_until(rt, run_id, step_is("hold", "waiting"))
        assert rt.admission[:2] == (0, 2)  # parked: nothing in flight
        quick = await rt.start_run(QUICK)  # starts and finishes while they wait
        assert (await rt.wait(quick, timeout=10)).status == "succeeded"
        await finish_waiters(rt, waiting)
        assert rt.admission[:2] == (0, 2)
        assert await rt.store.count_pending() == 0


async def test_a_parked_run_goes_on_at_once_even_above_the_bound() -> None:
    async with busy_runtime(MemoryStore(), 1) as rt:
        parked = await rt.start_run(WAIT_THEN_WORK)
        await wait_until(rt, parked, step_is("hold", "waiting"))
        holder = await rt.start_run(BUSY)  # admitted: the parked run left the slot free
        await busy(rt, holder)
        assert rt.admission[:2] == (1, 1)
        queued = await rt.start_run(BUSY)
        await rt.signal(parked, "go", {})  # its signal: busy again, without admission
        await wait_until(rt, parked, step_is("work", "running"))
        assert rt.admission[:2] == (2, 1)
        assert (await rt.store.get_run(queued)).status == "pending"
        for run_id in (parked, holder):  # room again only once both ended
            await rt.cancel(run_id)
            await rt.wait(run_id, timeout=10)
        await release(rt, queued)


async def test_a_new_engine_counts_busy_runs_not_parked_ones(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    async with Runtime(store=url, max_active_runs=2) as rt:
        waiting = [await rt.start_run(WAITER) for _ in range(3)]
        for run_id in waiting:
            await wait_until(rt, run_id, step_is("hold", "waiting"))
    async with Runtime(store=url, max_active_runs=2) as rt:
        assert rt.admission[:2] == (0, 2)
        quick = await rt.start_run(QUICK)
        assert (await rt.wait(quick, timeout=10)).status == "succeeded"
        await finish_waiters(rt, waiting)


def test_the_bookkeeping_follows_attempts_in_flight() -> None:
    from tideflow.model.commands import CancelTask, DispatchTask
    from tideflow.model.events import TaskCompleted
    from tideflow.model.run import new_run_state
    from tideflow.model.states import RunStatus
    from tideflow.store.base import AppliedEvent

    book = Admission(1)
    state = new_run_state(run_id="r", workflow="w", version="1", plan_hash="h", created_at=0)
    state.status = RunStatus.RUNNING

    def applied(event: Any, *commands: Any) -> AppliedEvent:
        return AppliedEvent(
            event=event, state=state, transitions=[], commands=list(commands), seq=1
        )

    def dispatch(key: str) -> DispatchTask:
        return DispatchTask(
            run_id="r",
            step_key=key,
            step_id=key,
            type="noop",
            config={},
            input={},
            attempt=1,
            idempotency_key=f"r:{key}:1",
            timeout=None,
        )

    book.reserve(["r"])
    assert not book.applied([applied(started("r"), dispatch("a"), dispatch("b"))])
    assert book.active == {"r"} and book.flight == {"r": {"a": 1, "b": 1}}
    done = TaskCompleted(event_id="e1", run_id="r", time=1.0, step_key="a", attempt=1)
    assert not book.applied([applied(done)])
    assert book.active == {"r"}  # b still in flight
    book.waiting = True  # a pending run waits: parking wakes the admitter
    cancel = CancelTask(run_id="r", step_key="b", attempt=1)
    assert book.applied([applied(done, cancel)])
    assert book.active == set() and book.flight == {}
    assert not book.applied([applied(done, dispatch("c"))])  # busy again, above the bound
    assert book.active == {"r"}
    book.in_flight("s", "x", 2)  # read from the store
    assert book.active == {"r", "s"} and book.room == 0
    book.forget(lambda run_id: run_id == "s")
    assert book.active == {"r"} and "s" not in book.flight


# -- the bound of attempts in flight -----------------------------------------------------


def test_the_task_bound_counts_attempts_in_flight_and_frees_room_as_they_end() -> None:
    from tideflow.model.commands import CancelTask, DispatchTask
    from tideflow.model.events import ErrorInfo, TaskCompleted, TaskFailed
    from tideflow.model.run import new_run_state
    from tideflow.model.states import RunStatus
    from tideflow.store.base import AppliedEvent

    book = Admission(10, task_bound=3)
    state = new_run_state(run_id="r", workflow="w", version="1", plan_hash="h", created_at=0)
    state.status = RunStatus.RUNNING

    def applied(event: Any, *commands: Any) -> AppliedEvent:
        return AppliedEvent(
            event=event, state=state, transitions=[], commands=list(commands), seq=1
        )

    def dispatch(key: str, attempt: int = 1) -> DispatchTask:
        return DispatchTask(
            run_id="r",
            step_key=key,
            step_id=key,
            type="noop",
            config={},
            input={},
            attempt=attempt,
            idempotency_key=f"r:{key}:{attempt}",
            timeout=None,
        )

    assert book.levels() == (0, 10, 0, 3, 0) and book.room == 3
    book.reserve(["r"])
    assert book.room == 2  # being admitted: counts as the attempt it will dispatch
    book.waiting = True
    assert not book.applied([applied(started("r"), dispatch("a"), dispatch("b"), dispatch("c"))])
    assert book.tasks == 3 and book.room == 0  # 9 runs of room, none of attempts
    assert book.levels() == (1, 10, 3, 3, 3)
    again = dispatch("c", attempt=2)  # a retry of c replaces its attempt: still 3
    assert not book.applied([applied(started("r"), again)])
    assert book.tasks == 3
    done = TaskCompleted(event_id="e1", run_id="r", time=1.0, step_key="a", attempt=1)
    assert book.applied([applied(done)])  # room freed while starts wait: wake the admitter
    assert book.tasks == 2 and book.room == 1
    assert not book.applied([applied(done)])  # its duplicate frees nothing
    failed = TaskFailed(
        event_id="e2",
        run_id="r",
        time=1.0,
        step_key="b",
        attempt=1,
        error=ErrorInfo(type="E", message="x"),
    )
    assert book.applied([applied(failed, CancelTask(run_id="r", step_key="c", attempt=2))])
    assert book.tasks == 0 and book.flight == {} and book.active == set()
    book.in_flight("s", "x", 1)
    book.in_flight("s", "y", 1)
    book.in_flight("s", "y", 1)  # read twice (recovery, then takeover): one attempt
    book.in_flight("t", "x", 1)
    assert book.tasks == 3 and book.room == 0
    book.ended("s")  # what an ended run had in flight is stale
    assert book.tasks == 1 and book.room == 2
    book.forget(lambda run_id: run_id == "t")
    assert book.tasks == 0 and book.room == 3


def test_the_task_bound_is_checked_and_read_from_the_environment() -> None:
    from tideflow.runtime.admission import check_task_bound, task_bound_from_environment

    assert Admission(7).task_bound == 7  # by default, the run bound
    assert check_task_bound(3) == 3
    for bad in (0, -1, True, 2.5):
        with pytest.raises(ValueError, match="max tasks in flight"):
            check_task_bound(bad)  # type: ignore[arg-type]
    assert task_bound_from_environment({}) is None
    assert task_bound_from_environment({"TIDEFLOW_MAX_TASKS_IN_FLIGHT": "64"}) == 64
    for bad_text in ("0", "-3", "1.5", "lots"):
        with pytest.raises(ValueError, match="TIDEFLOW_MAX_TASKS_IN_FLIGHT="):
            task_bound_from_environment({"TIDEFLOW_MAX_TASKS_IN_FLIGHT": bad_text})
    with pytest.raises(ValueError, match="max tasks in flight"):
        Runtime(max_tasks_in_flight=0)


WIDE = plan(
    """
    name: wide
    version: "1"
    steps:
      - {id: a, type: python, function: admission.never_run}
      - {id: b, type: python, function: admission.never_run}
      - {id: c, type: python, function: admission.never_run}
    """
)
"""Three attempts in flight at once, held there (no worker)."""


async def test_no_run_is_admitted_while_the_attempts_in_flight_are_at_their_bound() -> None:
    async with busy_runtime(MemoryStore(), 10, max_tasks_in_flight=4) as rt:
        wide = await rt.start_run(WIDE)
        for key in "abc":
            await wait_until(rt, wide, step_is(key, "running"))
        one = await rt.start_run(BUSY)  # 3 in flight, room for one more attempt
        await busy(rt, one)
        waiting = await rt.start_run(BUSY)  # 4 in flight: at the bound, 8 runs of room
        assert rt.admission == (2, 10, 4, 4, 4)
        assert (await rt.store.get_run(waiting)).status == "pending"
        reasons = [r for r in (await rt.client.why(waiting)).reasons if r.kind == "not_started"]
        assert "the active runs claim 4 of the 4 attempts in flight allowed" in reasons[0].text
        assert reasons[0].data["tasks"] == 4 and reasons[0].data["task_bound"] == 4
        await release(rt, one)  # one attempt ends: the next run is admitted
        await busy(rt, waiting)
        assert rt.admission == (2, 10, 4, 4, 4)
        await release(rt, waiting)
        await rt.cancel(wide)
        assert (await rt.wait(wide, timeout=10)).status == "cancelled"
        assert rt.admission == (0, 10, 0, 4, 0)


def test_a_runs_claim_is_the_widest_level_of_its_plan() -> None:
    from tideflow.runtime.admission import peak_attempts

    assert peak_attempts(BUSY) == 1 and peak_attempts(WIDE) == 3
    assert peak_attempts(WAITER) == 1  # nothing to run: still one of the task bound
    assert peak_attempts(WAIT_THEN_WORK) == 1
    diamond = plan(
        """
        name: diamond
        version: "1"
        steps:
          - {id: top, type: python, function: m.f}
          - {id: l, type: python, function: m.f, depends_on: [top]}
          - {id: r, type: python, function: m.f, depends_on: [top]}
          - {id: note, type: set, values: {x: 1}, depends_on: [top]}
          - {id: bottom, type: python, function: m.f, depends_on: [l, r]}
          - {id: each, type: map, items: "{{ [1, 2, 3] }}", max_concurrency: 5,
             depends_on: [top], step: {id: one, type: python, function: m.f}}
        """
    )
    assert peak_attempts(diamond) == 7  # l, r and the map's 5 at depth 2; `set` runs nothing
    chain = compile_definition(
        {
            "name": "long",
            "version": "1",
            "steps": [{"id": "s0", "type": "noop"}]
            + [
                {"id": f"s{i}", "type": "noop", "depends_on": [f"s{i - 1}"]} for i in range(1, 5000)
            ],
        }
    )
    assert peak_attempts(chain) == 1  # 5,000 deep: no recursion


async def test_a_wide_run_waits_until_its_claim_fits_and_the_queue_keeps_its_order() -> None:
    async with busy_runtime(MemoryStore(), 10, max_tasks_in_flight=4) as rt:
        first = await rt.start_run(WIDE)
        for key in "abc":
            await wait_until(rt, first, step_is(key, "running"))
        second = await rt.start_run(WIDE)  # claims 3, 1 left: waits
        light = await rt.start_run(BUSY)  # would fit, but is behind the second
        assert rt.admission == (1, 10, 3, 4, 3)
        for run_id in (second, light):
            assert (await rt.store.get_run(run_id)).status == "pending"
        await rt.cancel(first)
        assert (await rt.wait(first, timeout=10)).status == "cancelled"
        for key in "abc":
            await wait_until(rt, second, step_is(key, "running"))
        await busy(rt, light)
        assert await started_order(rt, [first, second, light]) == [first, second, light]
        for run_id in (second, light):
            await rt.cancel(run_id)
            await rt.wait(run_id, timeout=10)
        assert rt.admission == (0, 10, 0, 4, 0)
