"""The Store port's contract: every backend (memory, sqlite, postgres) passes it."""

from __future__ import annotations

from typing import Any

import pytest

from tideflow.dsl import compile_definition
from tideflow.errors import DefinitionConflict, DefinitionInactive, NotFound, RunExists
from tideflow.model import codec
from tideflow.model.events import SignalReceived
from tideflow.model.plan import Plan
from tideflow.model.run import new_run_state
from tideflow.model.states import RunStatus
from tideflow.store.base import (
    OUTBOX_COMMANDS,
    AppliedEvent,
    ConcurrencyConflict,
    RunFilter,
    Store,
)
from tideflow.store.paging import BadCursor

from .conftest import Backend
from .scenarios import (
    T0,
    Driver,
    loaded_state,
    order_plan,
    order_script,
    same_state,
    short_plan,
    short_script,
)


def versioned(version: str, note: str = "") -> Any:
    steps = [{"id": "a", "type": "noop"}, {"id": "b", "type": "noop", "depends_on": ["a"]}]
    if note:
        steps.append({"id": note, "type": "noop"})
    return compile_definition({"name": "greet", "version": version, "steps": steps})


# -- definitions -------------------------------------------------------------------


async def test_save_definition_is_idempotent_and_immutable(store: Store) -> None:
    plan = versioned("1")
    assert await store.save_definition(plan) is True
    assert await store.save_definition(versioned("1")) is False
    with pytest.raises(DefinitionConflict, match="greet 1"):
        await store.save_definition(versioned("1", note="changed"))
    assert (await store.get_definition("greet", "1")).hash == plan.hash


async def test_a_saved_plan_is_read_back_without_compiling_it_again(store: Store) -> None:
    """The API compiles a definition in another process and registers the plan it gets
    back; reading it at once (the schedules' sync does) must not compile its source again
    on the event loop: a 1 MB definition took seconds so."""
    compiled: list[str] = []

    def counting(source: Any) -> Plan:
        compiled.append(source["version"])
        return compile_definition(source)

    store.compile_plan = counting
    plan = versioned("1")
    await store.save_definition(plan)
    assert await store.get_definition("greet", "1") is plan
    assert await store.get_plan(plan.hash) is plan
    assert compiled == []


async def test_get_definition_by_version_and_latest(store: Store) -> None:
    plans = {v: versioned(v) for v in ("1.9", "1.10", "1.2")}
    for plan in plans.values():
        await store.save_definition(plan)
    assert (await store.get_definition("greet")).hash == plans["1.10"].hash
    assert (await store.get_definition("greet", "1.9")).hash == plans["1.9"].hash
    with pytest.raises(NotFound, match="greet"):
        await store.get_definition("greet", "7")
    with pytest.raises(NotFound, match="nothing"):
        await store.get_definition("nothing")


async def test_list_definitions(store: Store) -> None:
    assert await store.list_definitions() == []
    plans = [versioned("1"), versioned("2"), order_plan(), short_plan()]
    for plan in plans:
        await store.save_definition(plan)
    listed = await store.list_definitions()
    assert {(d.name, d.version, d.hash) for d in listed} == {
        (p.name, p.version, p.hash) for p in plans
    }
    names = [d.name for d in listed]
    assert names == sorted(names)
    assert all(d.created_at > 0 for d in listed)
    assert [d.version for d in await store.list_definitions("greet")] == ["1", "2"]


async def test_a_deactivated_version_is_passed_over_by_name_and_kept_by_version(
    store: Store,
) -> None:
    plans = {v: versioned(v) for v in ("1", "2", "3")}
    for plan in plans.values():
        await store.save_definition(plan)
    assert await store.set_definition_active("greet", "3", False) is True
    assert await store.set_definition_active("greet", "3", False) is False
    assert (await store.get_definition("greet")).hash == plans["2"].hash
    assert (await store.get_definition("greet", "3")).hash == plans["3"].hash
    active = {d.version: d.active for d in await store.list_definitions("greet")}
    assert active == {"1": True, "2": True, "3": False}
    for version in ("1", "2"):
        await store.set_definition_active("greet", version, False)
    with pytest.raises(DefinitionInactive, match=r"every version of 'greet' is deactivated"):
        await store.get_definition("greet")
    assert await store.set_definition_active("greet", "1", True) is True
    assert (await store.get_definition("greet")).hash == plans["1"].hash
    with pytest.raises(NotFound, match="greet"):
        await store.set_definition_active("greet", "9", True)


def triggered(version: str, *events: str) -> Plan:
    return compile_definition(
        {
            "name": "on-event",
            "version": version,
            "triggers": [{"event": e} for e in events],
            "steps": [{"id": "a", "type": "noop"}],
        }
    )


async def test_a_definition_is_listed_with_its_title(store: Store) -> None:
    """The title is read back with the definition's row (sqlite, postgres: from the stored
    source of its plan), whatever its script."""
    steps = [{"id": "a", "type": "noop"}]
    titled = compile_definition({"name": "order-fulfillment", "title": "订单履约流程",
                                 "version": "1", "steps": steps,
                                 "triggers": [{"event": "order.paid"}]})  # fmt: skip
    await store.save_definition(titled)
    await store.save_definition(versioned("1"))
    listed = {(d.name, d.title) for d in await store.list_definitions()}
    assert listed == {("order-fulfillment", "订单履约流程"), ("greet", None)}
    assert [d.title for d in await store.list_definitions("order-fulfillment")] == ["订单履约流程"]
    assert [d.title for d in await store.triggered_by("order.paid")] == ["订单履约流程"]
    assert (await store.get_definition("order-fulfillment")).title == "订单履约流程"


async def test_definitions_are_found_by_the_event_types_they_are_triggered_by(
    store: Store,
) -> None:
    await store.save_definition(triggered("1", "order.paid", "order.paid", "order.refunded"))
    await store.save_definition(triggered("2", "order.paid"))
    await store.save_definition(versioned("1"))
    paid = await store.triggered_by("order.paid")
    assert [(d.name, d.version, d.active) for d in paid] == [
        ("on-event", "1", True),
        ("on-event", "2", True),
    ]
    assert [d.version for d in await store.triggered_by("order.refunded")] == ["1"]
    assert await store.triggered_by("order.shipped") == []
    await store.set_definition_active("on-event", "1", False)
    assert [d.version for d in await store.triggered_by("order.paid")] == ["2"]
    assert await store.triggered_by("order.refunded") == []


async def test_plan_comes_back_by_hash(store: Store) -> None:
    plan = order_plan()
    await store.save_definition(plan)
    again = await store.get_plan(plan.hash)
    assert again.hash == plan.hash
    assert (again.name, again.version) == (plan.name, plan.version)
    assert set(again.specs) == set(plan.specs)
    with pytest.raises(NotFound):
        await store.get_plan("0" * 64)


# -- runs --------------------------------------------------------------------------


async def test_create_run_with_idempotency_key(store: Store) -> None:
    plan = short_plan()
    first = new_run_state(
        run_id="r1", workflow=plan.name, version="1", plan_hash=plan.hash, created_at=T0
    )
    second = new_run_state(
        run_id="r2", workflow=plan.name, version="1", plan_hash=plan.hash, created_at=T0 + 1
    )
    assert await store.create_run(first, "key-1") == ("r1", True)
    assert await store.create_run(second, "key-1") == ("r1", False)
    with pytest.raises(NotFound):
        await store.get_run("r2")
    assert [r.run_id for r in (await store.list_runs()).runs] == ["r1"]
    assert await store.create_run(second, "key-2") == ("r2", True)


@pytest.mark.parametrize("key", [None, "another-key"])
async def test_a_run_id_taken_already_is_refused_and_the_stored_run_kept(
    store: Store, key: str | None
) -> None:
    plan = short_plan()
    first = new_run_state(
        run_id="r1", workflow=plan.name, version="1", plan_hash=plan.hash, created_at=T0
    )
    first.input = {"first": True}
    assert await store.create_run(first, "key-1") == ("r1", True)
    again = new_run_state(
        run_id="r1", workflow=plan.name, version="1", plan_hash=plan.hash, created_at=T0 + 1
    )
    again.input = {"first": False}
    with pytest.raises(RunExists, match="r1"):
        await store.create_run(again, key)
    assert (await store.load_run("r1")).snapshot.input == {"first": True}
    if key is not None:  # the refused start did not take the key
        third = new_run_state(
            run_id="r3", workflow=plan.name, version="1", plan_hash=plan.hash, created_at=T0
        )
        assert await store.create_run(third, key) == ("r3", True)


async def test_create_runs_stores_a_batch_and_honours_every_idempotency_key(
    store: Store,
) -> None:
    """A batch of starts is one call: each run gets what ``create_run`` alone would give
    it, in order: a key used before names the old run, a key used twice in the batch
    creates the first run only, a taken run id fails that run alone."""
    plan = short_plan()

    def state(run_id: str, at: float = T0) -> Any:
        made = new_run_state(
            run_id=run_id, workflow=plan.name, version="1", plan_hash=plan.hash, created_at=at
        )
        made.input = {"id": run_id}
        return made

    assert await store.create_run(state("old"), "used") == ("old", True)
    results = await store.create_runs(
        [
            (state("a"), "k-a"),
            (state("b"), "used"),  # a key of an earlier batch
            (state("c"), None),
            (state("d"), "k-a"),  # the key of "a", in the same batch
            (state("old"), "k-old"),  # a run id taken already
            (state("e"), None),
            (state("e", T0 + 1), "k-e"),  # a run id taken in the same batch
            (state("f"), "k-f"),
        ]
    )
    assert results[:4] == [("a", True), ("old", False), ("c", True), ("a", False)]
    assert isinstance(results[4], RunExists) and "old" in str(results[4])
    assert results[5] == ("e", True)
    assert isinstance(results[6], RunExists) and "e" in str(results[6])
    assert results[7] == ("f", True)
    stored = sorted(r.run_id for r in (await store.list_runs()).runs)
    assert stored == ["a", "c", "e", "f", "old"]
    assert (await store.load_run("e")).snapshot.input == {"id": "e"}
    assert (await store.load_run("e")).snapshot.created_at == T0
    # the keys the refused runs named are free; those taken stay taken
    assert await store.create_runs([(state("g"), "k-old"), (state("h"), "k-e")]) == [
        ("g", True),
        ("h", True),
    ]
    assert await store.create_runs([(state("i"), "k-f"), (state("j"), "k-a")]) == [
        ("f", False),
        ("a", False),
    ]
    assert await store.create_runs([]) == []


@pytest.mark.parametrize(("batch_size", "snapshot_every"), [(1, 0), (3, 2), (4, 3), (100, 4)])
async def test_committed_runs_load_back_to_the_same_state(
    store: Store, batch_size: int, snapshot_every: int
) -> None:
    plan = order_plan()
    await store.save_definition(plan)
    driver = Driver(store, batch_size=batch_size, snapshot_every=snapshot_every)
    done = await driver.new_run(plan, "done")
    half = await driver.new_run(plan, "half")
    await driver.play(order_script(done), order_script(half)[:5])
    assert done.state.status is RunStatus.SUCCEEDED
    for h in (done, half):
        stored = await store.load_run(h.run_id)
        assert stored.last_seq == driver.seqs[h.run_id]
        assert same_state(await loaded_state(store, plan, h.run_id), h.state)
    summary = await store.get_run("done")
    assert (summary.status, summary.output) == ("succeeded", done.state.output)
    assert summary.finished_at == done.state.finished_at
    assert (await store.get_run("half")).status == "running"


async def test_the_summary_follows_the_status_through_failure_and_retry(store: Store) -> None:
    """Commits that leave the status as it is (a SQL store may then leave it out of its
    update) and commits that move it, one event at a time."""
    driver = Driver(store)
    h = await driver.new_run(short_plan(), "again")
    seen = []
    for action in (
        h.start,
        lambda: h.fail("only", retryable=False),
        h.retry,
        lambda: h.signal("nobody-waits"),
        lambda: h.complete("only", {"second": True}),
    ):
        action()
        await driver.flush()
        summary = await store.get_run("again")
        assert (summary.finished_at, summary.output) == (h.state.finished_at, h.state.output)
        seen.append((summary.status, summary.finished_at is None, summary.error is None))
    assert seen == [
        ("running", True, True),
        ("failed", False, False),
        ("running", True, True),
        ("running", True, True),
        ("succeeded", False, True),
    ]


async def test_load_unknown_run(store: Store) -> None:
    with pytest.raises(NotFound, match="nope"):
        await store.load_run("nope")
    with pytest.raises(NotFound, match="nope"):
        await store.get_run("nope")


async def test_stale_commit_conflicts_and_writes_nothing(store: Store) -> None:
    plan = order_plan()
    driver = Driver(store, batch_size=2)
    a = await driver.new_run(plan, "a")
    b = await driver.new_run(plan, "b")
    await driver.play(order_script(a)[:3], order_script(b)[:1])
    before = {run_id: await store.history(run_id) for run_id in ("a", "b")}
    outbox_before = await store.pending_outbox()

    def signal(run_id: str, seq: int) -> AppliedEvent:
        event = SignalReceived(
            event_id=f"late-{run_id}-{seq}", run_id=run_id, time=T0 + 50, name="late"
        )
        h = driver.harnesses[run_id]
        return AppliedEvent(event=event, state=h.state, transitions=[], commands=[], seq=seq)

    fresh_b = signal("b", driver.seqs["b"] + 1)
    stale_a = signal("a", driver.seqs["a"])  # another applier already wrote this seq
    with pytest.raises(ConcurrencyConflict, match=r"^run a was advanced by another applier$"):
        await store.commit([fresh_b, stale_a])
    for run_id, entries in before.items():
        assert await store.history(run_id) == entries
        assert (await store.load_run(run_id)).last_seq == driver.seqs[run_id]
    assert await store.pending_outbox() == outbox_before
    await store.commit([fresh_b])
    assert len(await store.history("b")) == len(before["b"]) + 1


async def test_history_is_ordered_with_events_and_transitions(store: Store) -> None:
    plan = order_plan()
    driver = Driver(store, batch_size=4)
    h = await driver.new_run(plan, "r")
    await driver.play(order_script(h))
    entries = await store.history("r")
    assert [e.seq for e in entries] == list(range(1, len(driver.committed) + 1))
    assert [e.kind for e in entries] == [codec.event_kind(a.event) for a in driver.committed]
    for entry, applied in zip(entries, driver.committed, strict=True):
        assert entry.run_id == "r"
        assert entry.time == applied.event.time
        assert entry.event == codec.event_to_data(applied.event)
        assert entry.transitions == [codec.transition_to_data(t) for t in applied.transitions]
        assert entry.to_dict()["kind"] == entry.kind
    assert any(e.transitions for e in entries)
    with pytest.raises(NotFound, match="ghost"):
        await store.history("ghost")


async def test_a_run_without_events_has_an_empty_history(store: Store) -> None:
    await Driver(store).new_run(short_plan(), "idle")
    assert await store.history("idle") == []


# -- listing -----------------------------------------------------------------------


async def make_listing(store: Store) -> list[tuple[float, str, str, str]]:
    """25 runs: two workflows, some running, pairs created at the same instant."""
    plan = short_plan()
    rows = []
    for i in range(25):
        workflow = "alpha" if i % 2 else "beta"
        state = new_run_state(
            run_id=f"run-{i:02d}",
            workflow=workflow,
            version="1",
            plan_hash=plan.hash,
            created_at=T0 + i // 2,
        )
        if i % 3 == 0:
            state.status = RunStatus.RUNNING
        await store.create_run(state)
        rows.append((state.created_at, state.run_id, workflow, state.status.value))
    return sorted(rows, reverse=True)


async def test_list_runs_filters_newest_first(store: Store) -> None:
    rows = await make_listing(store)

    async def ids(**kwargs: Any) -> list[str]:
        return [r.run_id for r in (await store.list_runs(RunFilter(**kwargs), limit=100)).runs]

    assert await ids() == [r[1] for r in rows]
    assert await ids(status="running") == [r[1] for r in rows if r[3] == "running"]
    assert await ids(workflow="alpha") == [r[1] for r in rows if r[2] == "alpha"]
    assert await ids(workflow="alpha", status="pending") == [
        r[1] for r in rows if r[2] == "alpha" and r[3] == "pending"
    ]
    assert await ids(created_after=T0 + 5) == [r[1] for r in rows if r[0] >= T0 + 5]
    assert await ids(created_before=T0 + 5) == [r[1] for r in rows if r[0] < T0 + 5]
    assert await ids(created_after=T0 + 3, created_before=T0 + 6, workflow="beta") == [
        r[1] for r in rows if T0 + 3 <= r[0] < T0 + 6 and r[2] == "beta"
    ]
    assert await ids(workflow="nothing") == []
    first = (await store.list_runs(limit=1)).runs[0]
    assert (first.run_id, first.workflow, first.version) == ("run-24", "beta", "1")
    assert (first.created_at, first.finished_at, first.output) == (T0 + 12, None, None)


async def test_list_runs_pages_through_everything_once(store: Store) -> None:
    rows = await make_listing(store)
    seen: list[str] = []
    sizes = []
    cursor = None
    while True:
        page = await store.list_runs(limit=10, cursor=cursor)
        seen.extend(r.run_id for r in page.runs)
        sizes.append(len(page.runs))
        cursor = page.next_cursor
        if cursor is None:
            break
    assert sizes == [10, 10, 5]
    assert seen == [r[1] for r in rows]
    filtered = await store.list_runs(RunFilter(workflow="beta"), limit=5)
    rest = await store.list_runs(RunFilter(workflow="beta"), limit=5, cursor=filtered.next_cursor)
    betas = [r[1] for r in rows if r[2] == "beta"]
    assert [r.run_id for r in filtered.runs + rest.runs] == betas[:10]


@pytest.mark.parametrize("cursor", ["not a cursor", "!!!", "Zm9v"])
async def test_list_runs_refuses_a_bad_cursor(store: Store, cursor: str) -> None:
    await make_listing(store)
    with pytest.raises(BadCursor):
        await store.list_runs(limit=10, cursor=cursor)


async def test_unfinished_runs(store: Store) -> None:
    driver = Driver(store, batch_size=3)
    plan = order_plan()
    done = await driver.new_run(plan, "done")
    running = await driver.new_run(plan, "running")
    await driver.new_run(plan, "pending")
    await driver.play(order_script(done), order_script(running)[:4])
    assert sorted(await store.unfinished_runs()) == ["pending", "running"]


# -- outbox ------------------------------------------------------------------------


async def test_outbox_holds_committed_effects_until_relayed(store: Store) -> None:
    plan = order_plan()
    driver = Driver(store, batch_size=5)
    a = await driver.new_run(plan, "a")
    b = await driver.new_run(plan, "b")
    await driver.play(order_script(a), order_script(b)[:5])
    expected = {
        outbox_id: codec.command_to_data(command)
        for applied in driver.committed
        for outbox_id, command in applied.outbox
    }
    kinds = {data["command"] for data in expected.values()}
    assert kinds == {"EmitEvent", "StartChildRun", "RunFinished"}
    pending = await store.pending_outbox()
    assert all(isinstance(item.command, OUTBOX_COMMANDS) for item in pending)
    assert {item.id: codec.command_to_data(item.command) for item in pending} == expected
    assert {item.run_id for item in pending} == {"a", "b"}
    assert len(await store.pending_outbox(limit=2)) == 2

    relayed = [item.id for item in pending if item.run_id == "a"]
    await store.commit([], relayed=relayed)
    assert {item.run_id for item in await store.pending_outbox()} == {"b"}
    # relayed ids usually ride along with the next batch, in the same transaction
    driver.relayed = [item.id for item in await store.pending_outbox()]
    await driver.play(order_script(b)[5:])
    rest = await store.pending_outbox()
    assert [codec.command_to_data(item.command)["command"] for item in rest] == ["RunFinished"]
    await store.commit([], relayed=[rest[0].id, "unknown#0"])
    assert await store.pending_outbox() == []


# -- retention ---------------------------------------------------------------------


async def test_prune_removes_only_old_finished_runs(store: Store) -> None:
    plan = short_plan()
    order = order_plan()
    driver = Driver(store, batch_size=3)
    old = [await driver.new_run(plan, f"old-{i}", now=T0 + i, key=f"k{i}") for i in range(5)]
    recent = [await driver.new_run(plan, f"recent-{i}", now=T0 + 1000 + i) for i in range(2)]
    live = await driver.new_run(order, "live", now=T0)
    await driver.new_run(plan, "idle", now=T0)
    await driver.play(*(short_script(h) for h in old + recent), order_script(live)[:3])
    archived: list[dict[str, Any]] = []
    removed = await store.prune(T0 + 500, batch_size=2, archive=archived.append)
    assert removed == 5
    assert sorted(item["run"]["run_id"] for item in archived) == [h.run_id for h in old]
    for item in archived:
        assert set(item) == {"run", "history"}
        assert item["run"]["status"] == "succeeded"
        assert [e["seq"] for e in item["history"]] == [1, 2, 3]
        assert [e["kind"] for e in item["history"]] == [
            "run_started",
            "task_started",
            "task_completed",
        ]
    for h in old:
        with pytest.raises(NotFound):
            await store.get_run(h.run_id)
    kept = {r.run_id for r in (await store.list_runs()).runs}
    assert kept == {"recent-0", "recent-1", "live", "idle"}
    assert {item.run_id for item in await store.pending_outbox()} <= kept
    again = new_run_state(
        run_id="again", workflow=plan.name, version="1", plan_hash=plan.hash, created_at=T0
    )
    assert await store.create_run(again, "k0") == ("again", True)  # the key went with its run
    kept.add("again")
    assert same_state(await loaded_state(store, order, "live"), live.state)
    assert sorted(await store.unfinished_runs()) == ["again", "idle", "live"]
    assert await store.prune(T0 + 500) == 0
    assert await store.prune(T0 + 5000) == 2


# -- durability --------------------------------------------------------------------


async def test_everything_survives_a_reopen(sql_backend: Backend) -> None:
    store = await sql_backend.open()
    plan = order_plan()
    await store.save_definition(plan)
    driver = Driver(store, batch_size=3, snapshot_every=4)
    done = await driver.new_run(plan, "done")
    half = await driver.new_run(plan, "half")
    await driver.play(order_script(done), order_script(half)[:6])
    await store.create_run(
        new_run_state(
            run_id="keyed", workflow="order", version="1", plan_hash=plan.hash, created_at=T0
        ),
        "the-key",
    )
    history = await store.history("done")
    outbox = await store.pending_outbox()
    runs = await store.list_runs()
    await store.close()

    reopened = await sql_backend.open()
    assert [d.hash for d in await reopened.list_definitions()] == [plan.hash]
    assert (await reopened.get_definition("order")).hash == plan.hash
    assert (await reopened.get_plan(plan.hash)).hash == plan.hash
    for h in (done, half):
        assert same_state(await loaded_state(reopened, plan, h.run_id), h.state)
        assert (await reopened.load_run(h.run_id)).last_seq == driver.seqs[h.run_id]
    assert await reopened.history("done") == history
    assert [(i.id, i.command) for i in await reopened.pending_outbox()] == [
        (i.id, i.command) for i in outbox
    ]
    assert await reopened.list_runs() == runs
    assert sorted(await reopened.unfinished_runs()) == ["half", "keyed"]
    other = new_run_state(
        run_id="other", workflow="order", version="1", plan_hash=plan.hash, created_at=T0
    )
    assert await reopened.create_run(other, "the-key") == ("keyed", False)
