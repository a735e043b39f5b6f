"""Nothing the event gateway answers 2xx is lost (docs/events.md), on SQLite and
PostgreSQL: events sent with the official CloudEvents SDK at every stage of a run (before
its wait, at it, after it ended, again) are each delivered, buffered and then taken,
answered ``duplicate``, or kept as ``unmatched`` (listed, replayable)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest
from tests.contract.conftest import Backend
from tests.unit.api.conftest import APPROVALS, PAID, event, served, structured

from tideflow.runtime.runtime import Runtime
from tideflow.testing.waiting import step_is, wait_until

GO = "com.example.order.go"
ORDER = {
    "name": "order",
    "version": "1",
    "input": {"type": "object", "required": ["order_id"]},
    "steps": [
        {"id": "gate", "type": "wait", "signal": GO},  # sent by run id, holds the run back
        {
            "id": "paid",
            "type": "wait",
            "signal": PAID,
            "match": "{{ signal.data.order_id == inputs.order_id }}",
            "depends_on": ["gate"],
        },
    ],
    "output": "{{ steps.paid.output.data }}",
}
SHORT = "com.example.refund.done"
REFUND = {  # keeps early events for one second only
    "name": "refund",
    "version": "1",
    "input": {"type": "object", "required": ["order_id"]},
    "steps": [
        {"id": "gate", "type": "wait", "signal": GO},
        {
            "id": "done",
            "type": "wait",
            "signal": SHORT,
            "match": "{{ signal.data.order_id == inputs.order_id }}",
            "buffer": "1s",
            "depends_on": ["gate"],
        },
    ],
    "output": "{{ steps.done.output.data }}",
}
SHIPPED = "com.example.order.shipped"
SHIP = {
    "name": "ship",
    "version": "1",
    "input": {"type": "object"},
    "triggers": [{"event": SHIPPED}],
    "steps": [{"id": "a", "type": "noop"}],
}


async def until_found(
    find: Callable[[], Awaitable[list[dict[str, Any]]]], timeout: float = 30.0
) -> list[dict[str, Any]]:
    """What ``find()`` returns once it is not empty, polled until ``timeout`` (a condition
    with a deadline: a buffer ends by the wall clock)."""
    deadline = time.monotonic() + timeout
    while not (found := await find()):
        assert time.monotonic() < deadline, "nothing found in time"
        await asyncio.sleep(0.05)
    return found


@pytest.fixture
async def rt(sql_backend: Backend) -> AsyncIterator[Runtime]:
    async with Runtime(store=sql_backend.make(), workers=1) as runtime:
        for definition in (ORDER, REFUND, SHIP):
            await runtime.client.register(definition)
        yield runtime


@pytest.fixture
async def api(rt: Runtime) -> AsyncIterator[httpx.AsyncClient]:
    async with served(rt.client) as client:
        yield client


class Sender:
    """Sends events as the SDK makes them, with an operator's API token."""

    def __init__(self, api: httpx.AsyncClient, headers: dict[str, str]) -> None:
        self.api = api
        self.headers = headers

    async def send(self, type: str, data: Any, **attributes: Any) -> dict[str, Any]:
        headers, body = structured(event(type, APPROVALS + "desk", data, **attributes))
        answer = await self.api.post("/events", content=body, headers={**headers, **self.headers})
        assert answer.status_code == 202, answer.text
        (outcome,) = answer.json()["events"]
        return dict(outcome)

    async def unmatched(self) -> list[dict[str, Any]]:
        answer = await self.api.get("/events/unmatched", headers=self.headers)
        assert answer.status_code == 200, answer.text
        return list(answer.json()["events"])


@pytest.fixture
async def sender(rt: Runtime, api: httpx.AsyncClient) -> Sender:
    from tideflow.api.auth import issue_token
    from tideflow.model.tokens import Role

    issued = await issue_token(rt.client.store, name="ops", role=Role.OPERATOR, now=0.0)
    return Sender(api, {"authorization": f"Bearer {issued.value}"})


async def test_every_event_answered_is_delivered_taken_duplicate_or_unmatched(
    rt: Runtime, sender: Sender
) -> None:
    early_run = await rt.client.start("order", {"order_id": "o-1"})
    await wait_until(rt, early_run, step_is("gate", "waiting"))

    # before its wait: buffered, and a redelivery is a duplicate
    early = await sender.send(PAID, {"order_id": "o-1", "n": 1}, id="pay-1")
    assert (early["status"], early["delivered_to"]) == ("buffered", [])
    again = await sender.send(PAID, {"order_id": "o-1", "n": 1}, id="pay-1")
    assert again["status"] == "duplicate"

    # by run id: delivered, then duplicate; the run reaches its wait and takes the event
    go = await sender.send(GO, None, id="go-1", tideflowrunid=early_run)
    assert (go["status"], go["delivered_to"]) == ("delivered", [early_run])
    go_again = await sender.send(GO, None, id="go-1", tideflowrunid=early_run)
    assert (go_again["status"], go_again["delivered_to"]) == ("duplicate", [early_run])
    result = await rt.client.wait(early_run, 30)
    assert (result.status, result.output) == ("succeeded", {"order_id": "o-1", "n": 1})
    # the buffered event was taken: a redelivery now is still a duplicate, not buffered anew
    assert (await sender.send(PAID, {"order_id": "o-1", "n": 1}, id="pay-1"))[
        "status"
    ] == "duplicate"

    # at its wait: delivered, then duplicate
    at_run = await rt.client.start("order", {"order_id": "o-2"})
    await wait_until(rt, at_run, step_is("gate", "waiting"))
    await rt.client.signal(at_run, GO, None)
    await wait_until(rt, at_run, step_is("paid", "waiting"))
    at = await sender.send(PAID, {"order_id": "o-2"}, id="pay-2")
    assert (at["status"], at["delivered_to"]) == ("delivered", [at_run])
    assert (await sender.send(PAID, {"order_id": "o-2"}, id="pay-2"))["status"] == "duplicate"
    assert (await rt.client.wait(at_run, 30)).output == {"order_id": "o-2"}

    # after the run ended, by its id: unmatched, kept and listed
    late = await sender.send(GO, None, id="go-late", tideflowrunid=at_run)
    assert late["status"] == "unmatched" and at_run in late["reason"]

    # a trigger: delivered (started), then duplicate naming the same run
    started = await sender.send(SHIPPED, {"order_id": "o-3"}, id="ship-1")
    assert started["status"] == "delivered"
    (ship_run,) = started["started"]
    resent = await sender.send(SHIPPED, {"order_id": "o-3"}, id="ship-1")
    assert (resent["status"], resent["started"]) == ("duplicate", [ship_run])
    assert [r.workflow for r in (await rt.client.list(limit=10)).runs].count("ship") == 1

    # a type no wait and no trigger takes: unmatched at once
    stray = await sender.send("com.example.nobody", {"x": 1}, id="stray-1")
    assert stray["status"] == "unmatched"

    listed = {(e["id"], e["type"]) for e in await sender.unmatched()}
    assert listed == {("go-late", GO), ("stray-1", "com.example.nobody")}
    applied = [e.kind for e in await rt.client.history(early_run)].count("signal_received")
    assert applied == 2  # go-1 and pay-1, each once


async def test_past_its_buffer_an_event_is_unmatched_listed_and_a_replay_delivers_it(
    rt: Runtime, sender: Sender, api: httpx.AsyncClient
) -> None:
    run_id = await rt.client.start("refund", {"order_id": "o-9"})
    await wait_until(rt, run_id, step_is("gate", "waiting"))
    early = await sender.send(SHORT, {"order_id": "o-9"}, id="refund-9")
    assert early["status"] == "buffered"

    async def listed() -> list[dict[str, Any]]:
        return [e for e in await sender.unmatched() if e["id"] == "refund-9"]

    (kept,) = await until_found(listed)  # its buffer (1 s) ended
    assert kept["type"] == SHORT and kept["payload"]["data"] == {"order_id": "o-9"}
    await rt.client.signal(run_id, GO, None)
    await wait_until(rt, run_id, step_is("done", "waiting"))
    assert (await rt.client.get(run_id)).status == "running"  # the event past its buffer

    viewer_replay = await api.post(
        f"/events/unmatched/{kept['key']}/replay",
        headers={"authorization": "Bearer x", "content-type": "application/json"},
    )
    assert viewer_replay.status_code == 401
    json_type = {**sender.headers, "content-type": "application/json"}
    replay = await api.post(f"/events/unmatched/{kept['key']}/replay", headers=json_type)
    assert replay.status_code == 200, replay.text
    assert (replay.json()["status"], replay.json()["delivered_to"]) == ("delivered", [run_id])
    assert (await rt.client.wait(run_id, 30)).output == {"order_id": "o-9"}
    assert await listed() == []
    missing = await api.post(f"/events/unmatched/{kept['key']}/replay", headers=json_type)
    assert missing.status_code == 404


async def test_an_event_by_run_id_before_its_wait_is_answered_buffered_and_taken(
    rt: Runtime, sender: Sender
) -> None:
    run_id = await rt.client.start("order", {"order_id": "o-5"})
    await wait_until(rt, run_id, step_is("gate", "waiting"))
    early = await sender.send(PAID, {"order_id": "o-5"}, id="pay-5", tideflowrunid=run_id)
    assert (early["status"], early["delivered_to"]) == ("buffered", [run_id])
    again = await sender.send(PAID, {"order_id": "o-5"}, id="pay-5", tideflowrunid=run_id)
    assert (again["status"], again["delivered_to"]) == ("duplicate", [run_id])
    await rt.client.signal(run_id, GO, None)
    assert (await rt.client.wait(run_id, 30)).output == {"order_id": "o-5"}
    assert await sender.unmatched() == []


async def test_a_run_that_reached_its_wait_unhanded_takes_the_event_at_the_next_start(
    sql_backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server stopped between the commit that started the wait and the relay that
    hands the buffer over: the next engine's recovery hands it."""
    from tideflow.runtime import relay
    from tideflow.runtime.intake import Inbound, Intake

    monkeypatch.setattr(relay, "waits_started", lambda state, transitions: [])  # lost
    async with Runtime(store=sql_backend.make(), workers=1) as rt:
        await rt.client.register(ORDER)
        run_id = await rt.client.start("order", {"order_id": "o-7"})
        await wait_until(rt, run_id, step_is("gate", "waiting"))
        early = Inbound(
            key="k-7", source="urn:t", id="7", type=PAID, payload={"data": {"order_id": "o-7"}}
        )
        assert (await Intake(rt.client, now=time.time).take(early)).status == "buffered"
        await rt.client.signal(run_id, GO, None)
        await wait_until(rt, run_id, step_is("paid", "waiting"))
        (still,) = await rt.client.store.buffered_for_waits(time.time())
        assert still[0] == run_id and still[2].key == "k-7"
    monkeypatch.undo()
    async with Runtime(store=sql_backend.make(), workers=1) as rt:
        assert (await rt.client.wait(run_id, 30)).output == {"order_id": "o-7"}
        assert (await rt.client.store.gateway_event("k-7")).delivered_to == (run_id,)  # type: ignore[union-attr]
