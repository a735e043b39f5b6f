"""The Store port's record of the event gateway (runtime/intake.py), on every backend:
what became of each event, the buffer found by wait row, the dead letter, the pruning."""

from __future__ import annotations

import dataclasses

from tideflow.store.base import GatewayEvent, Store

from .conftest import Backend
from .scenarios import UNDO_SCHEMA_10, Driver, short_plan

T0 = 1_000_000.0
ROW = 'paid\x1fdata.order_id\x1f"o-1"'


def kept(
    key: str, *, status: str = "buffered", until: float = T0 + 60, **more: object
) -> GatewayEvent:
    fields: dict[str, object] = {
        "key": key,
        "source": "urn:test",
        "id": key.upper(),
        "type": "paid",
        "run_id": None,
        "payload": {"data": {"order_id": "o-1"}, "n": [1, 2.5, "x"]},
        "status": status,
        "received_at": T0,
        "buffer_until": until,
        **more,
    }
    return GatewayEvent(**fields)  # type: ignore[arg-type]


async def test_an_event_reads_back_as_kept_and_a_second_keep_finds_the_first(
    store: Store,
) -> None:
    first = kept("a", delivered_to=("r1",), started=("r2",), reason="why")
    assert await store.keep_event(first, ["paid", ROW]) is None
    assert await store.gateway_event("a") == first
    again = dataclasses.replace(first, status="unmatched", payload=None)
    assert await store.keep_event(again, []) == first  # left as it was
    assert await store.gateway_event("a") == first
    assert await store.gateway_event("b") is None


async def test_buffered_events_are_found_by_wait_row_until_their_buffer_ends(
    store: Store,
) -> None:
    await store.keep_event(kept("a", until=T0 + 10), ["paid", ROW])
    await store.keep_event(kept("b", until=T0 + 20, received_at=T0 + 1), ["paid"])
    await store.keep_event(kept("c", status="delivered", until=T0), ["paid", ROW])
    assert [e.key for e in await store.buffered_events("paid", T0 + 5)] == ["a", "b"]
    assert [e.key for e in await store.buffered_events(ROW, T0 + 5)] == ["a"]
    assert [e.key for e in await store.buffered_events("paid", T0 + 10)] == ["b"]
    assert await store.buffered_events("other", T0) == []
    assert await store.count_buffered(T0 + 5) == 2
    assert await store.count_buffered(T0 + 5, ROW) == 1
    assert await store.count_buffered(T0 + 15) == 1


async def test_settling_changes_an_event_only_from_the_status_named(store: Store) -> None:
    await store.keep_event(kept("a"), [ROW])
    taken = dataclasses.replace(kept("a"), status="delivered", delivered_to=("r1",))
    assert await store.settle_event(taken, "buffered")
    assert await store.gateway_event("a") == taken
    assert not await store.settle_event(
        dataclasses.replace(taken, delivered_to=("r2",)), "buffered"
    )
    assert (await store.gateway_event("a")) == taken
    assert await store.buffered_events(ROW, T0) == []
    assert not await store.settle_event(kept("zzz"), "buffered")


async def test_the_dead_letter_holds_unmatched_events_and_buffers_that_ended(
    store: Store,
) -> None:
    await store.keep_event(kept("d", status="unmatched", until=T0, reason="no run"))
    await store.keep_event(kept("b", until=T0 + 10), [ROW])
    await store.keep_event(kept("a", status="delivered", until=T0))
    await store.keep_event(kept("c", until=T0 + 100), [ROW])
    assert [e.key for e in await store.unmatched_events(T0 + 5)] == ["d"]
    assert [e.key for e in await store.unmatched_events(T0 + 10)] == ["b", "d"]
    assert [e.key for e in await store.unmatched_events(T0 + 10, limit=1)] == ["b"]
    assert [e.key for e in await store.unmatched_events(T0 + 10, after="b")] == ["d"]
    listed = await store.unmatched_events(T0 + 10)
    assert [e.unmatched(T0 + 10) for e in listed] == [True, True]
    handed = dataclasses.replace(kept("b", until=T0 + 10), delivered_to=("r1",))
    assert await store.settle_event(handed, "buffered")  # handed to a run, still buffered
    assert [e.key for e in await store.unmatched_events(T0 + 10)] == ["d"]
    assert not handed.unmatched(T0 + 10)


async def test_pruning_forgets_events_whose_buffer_ended_before_the_cut(store: Store) -> None:
    await store.keep_event(kept("a", status="unmatched", until=T0), ["paid"])
    await store.keep_event(kept("b", until=T0 + 100), ["paid", ROW])
    assert await store.prune_events(T0 + 1) == 1
    assert await store.gateway_event("a") is None
    assert [e.key for e in await store.buffered_events("paid", T0)] == ["b"]
    assert await store.keep_event(kept("a", until=T0 + 50), ["paid"]) is None  # new again
    assert [e.key for e in await store.buffered_events("paid", T0)] == ["a", "b"]


async def test_a_store_at_schema_9_upgrades_to_keep_events(sql_backend: Backend) -> None:
    """Migration 10 on a store an older tideflow wrote: its runs are kept, events too."""
    store = await sql_backend.open()
    driver = Driver(store)
    h = await driver.new_run(short_plan(), "kept")
    await driver.play([lambda: h.start()])
    await store.close()
    upgraded = await sql_backend.upgraded_from(9, UNDO_SCHEMA_10)
    assert (await upgraded.load_run("kept")).last_seq == 2
    assert await upgraded.keep_event(kept("a"), [ROW]) is None
    assert [e.key for e in await upgraded.buffered_events(ROW, T0)] == ["a"]


async def test_events_buffered_under_a_row_some_run_waits_under_are_found_with_it(
    store: Store,
) -> None:
    from tideflow.dsl import compile_definition

    from .test_store_rows import WAITER

    driver = Driver(store, batch_size=10)
    runs = [await driver.new_run(compile_definition(WAITER), f"r{i}") for i in range(2)]
    for h in runs:
        h.start()
        h.complete("work")
    await driver.flush()  # both wait for `go` (rows under the name)
    await store.keep_event(kept("a", type="go"), ["go"])
    await store.keep_event(kept("b", type="go", received_at=T0 + 1), ["go"])
    await store.keep_event(kept("c", type="go", until=T0), ["go"])  # its buffer ended
    await store.keep_event(kept("d", type="other"), ["other"])  # nobody waits under it
    found = [(run_id, row, e.key) for run_id, row, e in await store.buffered_for_waits(T0)]
    assert found == [("r0", "go", "a"), ("r1", "go", "a"), ("r0", "go", "b"), ("r1", "go", "b")]
    assert len(await store.buffered_for_waits(T0, limit=3)) == 3
    await store.settle_event(
        dataclasses.replace(kept("a", type="go"), status="delivered"), "buffered"
    )
    runs[1].signal("go")
    await driver.flush()
    assert [(r, e.key) for r, _, e in await store.buffered_for_waits(T0)] == [("r0", "b")]
