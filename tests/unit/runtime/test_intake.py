"""The gateway's intake (runtime/intake.py): the buffer's bounds, a wait that keeps no
early events, and the buffer's expiry by the clock it is given."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tideflow.errors import NotFound
from tideflow.runtime.intake import Inbound, Intake
from tideflow.runtime.runtime import Runtime

PAID = "paid"


def order(buffer: Any = None) -> dict[str, Any]:
    wait: dict[str, Any] = {
        "id": "paid",
        "type": "wait",
        "signal": PAID,
        "match": "{{ signal.data.order_id == inputs.order_id }}",
    }
    if buffer is not None:
        wait["buffer"] = buffer
    return {"name": "order", "version": "1", "input": {"type": "object"}, "steps": [wait]}


def paid(n: int, order_id: str) -> Inbound:
    return Inbound(
        key=f"k{n}", source="urn:t", id=str(n), type=PAID, payload={"data": {"order_id": order_id}}
    )


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def rt() -> AsyncIterator[Runtime]:
    async with Runtime(workers=0) as runtime:
        yield runtime


async def test_the_buffer_is_bounded_per_run_and_in_all(rt: Runtime) -> None:
    await rt.client.register(order())
    intake = Intake(rt.client, now=Clock(), max_buffered=3, max_per_run=2)
    statuses = [(await intake.take(paid(n, "o-1"))).status for n in range(3)]
    assert statuses == ["buffered", "buffered", "unmatched"]  # two for o-1's run at most
    third = await intake.take(paid(2, "o-1"))
    assert third.status == "duplicate"
    assert (await intake.take(paid(3, "o-2"))).status == "buffered"
    over = await intake.take(paid(4, "o-3"))
    assert over.status == "unmatched" and "holds 3 events" in (over.reason or "")
    kept = await rt.client.store.unmatched_events(1_000.0)
    assert [e.key for e in kept] == ["k2", "k4"]


async def test_a_wait_that_keeps_no_early_events_dead_letters_them_at_once(rt: Runtime) -> None:
    await rt.client.register(order(buffer=False))
    outcome = await Intake(rt.client, now=Clock()).take(paid(1, "o-1"))
    assert outcome.status == "unmatched"
    assert "buffer" in (outcome.reason or "")
    assert [e.key for e in await rt.client.store.unmatched_events(1_000.0)] == ["k1"]


async def test_an_event_is_buffered_for_its_wait_s_buffer_then_unmatched(rt: Runtime) -> None:
    await rt.client.register(order(buffer="10m"))
    clock = Clock()
    intake = Intake(rt.client, now=clock)
    assert (await intake.take(paid(1, "o-1"))).status == "buffered"
    store = rt.client.store
    assert await store.unmatched_events(clock.now + 599) == []
    (late,) = await store.unmatched_events(clock.now + 600)
    assert (late.key, late.buffer_until) == ("k1", clock.now + 600)
    with pytest.raises(NotFound):
        await intake.replay("k1")  # still buffered at the intake's now
    clock.now += 600
    replayed = await intake.replay("k1")  # no run waits: it stays in the dead letter
    assert replayed.status == "unmatched"
    assert [e.key for e in await store.unmatched_events(clock.now)] == ["k1"]


OVER = {  # a match that is not indexed: its wait is found by its signal's name
    "name": "over",
    "version": "1",
    "input": {"type": "object"},
    "steps": [
        {"id": "gate", "type": "wait", "signal": "go"},
        {
            "id": "big",
            "type": "wait",
            "signal": "reading",
            "match": "{{ signal.data.n > inputs.min }}",
            "depends_on": ["gate"],
        },
    ],
    "output": "{{ steps.big.output.data.n }}",
}


async def test_an_event_for_waits_that_are_not_indexed_goes_to_each_run_reaching_one(
    rt: Runtime,
) -> None:
    """Handed to a run whose match does not hold, it stays buffered for the next run; once
    handed to a run it is no longer unmatched when its buffer ends."""
    import time

    from tideflow.testing.waiting import step_is, wait_until

    await rt.client.register(OVER)
    strict = await rt.client.start("over", {"min": 10})
    loose = await rt.client.start("over", {"min": 1})
    for run_id in (strict, loose):
        await wait_until(rt, run_id, step_is("gate", "waiting"))
    reading = Inbound(key="r5", source="urn:t", id="5", type="reading", payload={"data": {"n": 5}})
    assert (await Intake(rt.client, now=time.time).take(reading)).status == "buffered"
    store = rt.client.store
    await rt.client.signal(strict, "go", None)
    await wait_until(rt, strict, step_is("big", "waiting"))

    async def handed() -> tuple[str, ...]:
        kept = await store.gateway_event("r5")
        assert kept is not None and kept.status == "buffered"
        return kept.delivered_to

    deadline = time.monotonic() + 10
    while await handed() != (strict,):  # the relay hands it after the commit
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    await rt.client.signal(loose, "go", None)
    assert (await rt.client.wait(loose, 10)).output == 5
    assert (await rt.client.get(strict)).status == "running"  # 5 > 10 does not hold
    assert await handed() == (strict, loose)
    assert await store.unmatched_events(time.time() + 2 * 24 * 3600) == []


async def test_an_event_for_a_run_that_did_not_exist_yet_is_replayed_to_it(
    rt: Runtime,
) -> None:
    import time

    await rt.client.register(OVER)
    early = Inbound(
        key="r9", source="urn:t", id="9", type="reading", payload={"data": {"n": 9}}, run_id="later"
    )
    intake = Intake(rt.client, now=time.time)
    first = await intake.take(early)
    assert (first.status, first.reason) == ("unmatched", "there is no run later")
    await rt.client.start("over", {"min": 1}, run_id="later")
    replayed = await intake.replay("r9")  # at its gate: the run keeps it for its wait
    assert (replayed.status, replayed.delivered_to) == ("buffered", ["later"])
    assert await rt.client.store.unmatched_events(time.time()) == []
    await rt.client.signal("later", "go", None)
    assert (await rt.client.wait("later", 10)).output == 9
