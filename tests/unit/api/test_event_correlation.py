"""Events without ``tideflowrunid`` find their runs by correlation (``Client.deliver_event``):
through a real uvicorn, the official SDK sending, many waiting runs each woken by its own
event, and a redelivery applied once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx
import pytest

from tideflow.model.events import Transition
from tideflow.model.run import RunState
from tideflow.runtime.runtime import Runtime
from tideflow.testing.waiting import step_is, wait_until

from .conftest import (
    APPROVALS,
    BEARER,
    ORDER,
    PAID,
    PAY_SECRET,
    PAYMENTS,
    SOURCES,
    batch,
    binary,
    event,
    served,
    signed,
    structured,
)


@pytest.fixture
async def rt() -> AsyncIterator[Runtime]:
    async with Runtime(workers=1) as runtime:
        await runtime.client.register(ORDER)
        yield runtime


@pytest.fixture
async def api(rt: Runtime) -> AsyncIterator[httpx.AsyncClient]:
    async with served(rt.client, SOURCES) as client:
        yield client


async def waiting_runs(rt: Runtime, orders: list[str]) -> dict[str, str]:
    """``order id -> run id`` of a run waiting for its payment, for each order."""
    runs = {o: await rt.client.start("order", {"order_id": o}) for o in orders}
    for run_id in runs.values():
        await wait_until(rt, run_id, step_is("paid", "waiting"), timeout=60)
    return runs


async def signals_applied(rt: Runtime, run_id: str) -> int:
    return sum(1 for e in await rt.client.history(run_id) if e.kind == "signal_received")


@pytest.mark.parametrize("encode", [structured, binary], ids=["structured", "binary"])
async def test_an_event_finds_the_run_whose_match_holds(
    rt: Runtime, api: httpx.AsyncClient, encode: Any
) -> None:
    runs = await waiting_runs(rt, ["o-1", "o-2", "o-3"])
    ce = event(PAID, APPROVALS + "desk", {"order_id": "o-2"})
    headers, body = encode(ce)
    answer = await api.post("/events", content=body, headers={**headers, **BEARER})
    assert answer.status_code == 202, answer.text
    (outcome,) = answer.json()["events"]
    assert (outcome["status"], outcome["delivered_to"]) == ("delivered", [runs["o-2"]])
    result = await rt.client.wait(runs["o-2"], 10)
    assert result.output["data"] == {"order_id": "o-2"}
    for other in ("o-1", "o-3"):
        assert (await rt.client.get(runs[other])).status == "running"
        assert await signals_applied(rt, runs[other]) == 0


async def test_an_event_no_wait_matches_now_is_buffered_and_changes_no_run(
    rt: Runtime, api: httpx.AsyncClient
) -> None:
    runs = await waiting_runs(rt, ["o-1"])
    before = await rt.client.history(runs["o-1"])
    headers, body = structured(event(PAID, APPROVALS + "desk", {"order_id": "o-404"}))
    answer = await api.post("/events", content=body, headers={**headers, **BEARER})
    assert answer.status_code == 202
    (outcome,) = answer.json()["events"]
    assert (outcome["status"], outcome["delivered_to"]) == ("buffered", [])
    assert await rt.client.history(runs["o-1"]) == before
    assert (await rt.client.state(runs["o-1"])).signals == []


async def test_concurrent_redeliveries_by_correlation_are_applied_once(
    rt: Runtime, api: httpx.AsyncClient
) -> None:
    runs = await waiting_runs(rt, ["o-1"])
    ce = event(PAID, PAYMENTS, {"order_id": "o-1"})
    headers, body = structured(ce)
    answers = await asyncio.gather(
        *(
            api.post("/events", content=body, headers=signed(PAY_SECRET, headers, body))
            for _ in range(3)
        )
    )
    assert [a.status_code for a in answers] == [202, 202, 202]
    assert any(a.json()["events"][0]["status"] == "delivered" for a in answers)
    await rt.client.wait(runs["o-1"], 10)
    again = await api.post("/events", content=body, headers=signed(PAY_SECRET, headers, body))
    assert again.status_code == 202
    assert again.json()["events"][0]["status"] == "duplicate"
    assert await signals_applied(rt, runs["o-1"]) == 1


async def test_a_thousand_waiting_runs_each_woken_by_its_own_event(
    rt: Runtime, api: httpx.AsyncClient
) -> None:
    orders = [f"o-{i:04d}" for i in range(1000)]
    runs = await waiting_runs(rt, orders)
    ended: dict[str, Any] = {}
    all_ended = asyncio.Event()

    def listener(state: RunState, transitions: Sequence[Transition]) -> None:
        if state.is_terminal and state.run_id not in ended:
            ended[state.run_id] = state.output
            if len(ended) == len(orders):
                all_ended.set()

    rt.add_listener(listener)
    # half as single events (binary mode), half in batches of 50 (the last order first,
    # so no event finds its run by arriving in the order the runs started)
    singles, batched = orders[:500], orders[500:][::-1]

    def paid(order: str) -> Any:
        return event(PAID, APPROVALS + "desk", {"order_id": order}, id=f"pay-{order}")

    bodies = [binary(paid(o)) for o in singles]
    bodies += [batch(*map(paid, batched[i : i + 50])) for i in range(0, len(batched), 50)]
    semaphore = asyncio.Semaphore(8)

    async def send(headers: dict[str, str], body: bytes) -> list[dict[str, Any]]:
        async with semaphore:
            answer = await api.post("/events", content=body, headers={**headers, **BEARER})
        assert answer.status_code == 202, answer.text
        outcomes: list[dict[str, Any]] = answer.json()["events"]
        return outcomes

    outcomes = [o for got in await asyncio.gather(*(send(h, b) for h, b in bodies)) for o in got]
    assert len(outcomes) == len(orders)
    assert all(o["status"] == "delivered" for o in outcomes)
    for outcome in outcomes:
        assert outcome["delivered_to"] == [runs[outcome["id"].removeprefix("pay-")]]
    await asyncio.wait_for(all_ended.wait(), 120)
    for order, run_id in runs.items():
        assert ended[run_id]["data"] == {"order_id": order}


FULFIL = {
    "name": "fulfil",
    "version": "1",
    "input": {"type": "object", "required": ["order_id"]},
    "triggers": [{"event": PAID, "match": "{{ event.data.amount > 0 }}"}],
    "steps": [{"id": "a", "type": "noop", "input": {"order": "{{ inputs.order_id }}"}}],
    "output": "{{ steps.a.output.order }}",
}


async def test_an_event_starts_the_runs_its_type_triggers_once(
    rt: Runtime, api: httpx.AsyncClient
) -> None:
    await rt.client.register(FULFIL)
    ce = event(PAID, APPROVALS + "desk", {"order_id": "o-9", "amount": 5})
    headers, body = structured(ce)
    answer = await api.post("/events", content=body, headers={**headers, **BEARER})
    assert answer.status_code == 202, answer.text
    (outcome,) = answer.json()["events"]
    assert (outcome["status"], outcome["delivered_to"]) == ("delivered", [])
    (started,) = outcome["started"]
    assert (await rt.client.wait(started, 10)).output == "o-9"
    again = await api.post("/events", content=body, headers={**headers, **BEARER})
    assert again.json()["events"][0]["status"] == "duplicate"
    assert again.json()["events"][0]["started"] == [started]  # the same run: none new
    assert len((await rt.client.list(limit=10)).runs) == 1
    free = event(PAID, APPROVALS + "desk", {"order_id": "o-10", "amount": 0})
    headers, body = structured(free)
    (nothing,) = (await api.post("/events", content=body, headers={**headers, **BEARER})).json()[
        "events"
    ]
    # no run waits for o-10 yet: the order workflow's wait keeps it (its default buffer)
    assert (nothing["status"], nothing["started"]) == ("buffered", [])
