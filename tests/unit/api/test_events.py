"""``POST /events`` served by a real uvicorn, the official CloudEvents SDK as the sender:
each content mode, the signal payload, the runs an event reaches, deduplication."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from tideflow.api.events import signal_id
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


async def waiting_run(rt: Runtime, order_id: str) -> str:
    run_id = await rt.client.start("order", {"order_id": order_id})
    await wait_until(rt, run_id, step_is("paid", "waiting"))
    return run_id


async def signals_applied(rt: Runtime, run_id: str) -> list[dict[str, Any]]:
    return [e.event for e in await rt.client.history(run_id) if e.kind == "signal_received"]


@pytest.mark.parametrize("encode", [structured, binary], ids=["structured", "binary"])
async def test_an_event_from_the_sdk_wakes_the_run_it_names(
    rt: Runtime, api: httpx.AsyncClient, encode: Any
) -> None:
    run_id = await waiting_run(rt, "o-1")
    ce = event(
        PAID,
        APPROVALS + "desk",
        {"order_id": "o-1", "amount": 12},
        tideflowrunid=run_id,
        subject="order o-1",
    )
    headers, body = encode(ce)
    answer = await api.post("/events", content=body, headers={**headers, **BEARER})
    assert answer.status_code == 202, answer.text
    mode = "structured" if encode is structured else "binary"
    assert answer.json() == {
        "mode": mode,
        "events": [
            {
                "id": ce.get_id(),
                "source": APPROVALS + "desk",
                "type": PAID,
                "status": "delivered",
                "delivered_to": [run_id],
                "started": [],
                "reason": None,
            }
        ],
    }
    result = await rt.client.wait(run_id, 10)
    assert result.status == "succeeded"
    payload = result.output
    assert payload["data"] == {"order_id": "o-1", "amount": 12}
    assert payload["id"] == ce.get_id()
    assert (payload["source"], payload["type"], payload["specversion"]) == (
        APPROVALS + "desk",
        PAID,
        "1.0",
    )
    assert payload["subject"] == "order o-1"  # percent-decoded in binary mode
    assert payload["tideflowrunid"] == run_id
    assert payload["time"].endswith("Z")
    (applied,) = await signals_applied(rt, run_id)
    assert applied["event_id"] == signal_id(APPROVALS + "desk", ce.get_id())


async def test_a_batch_from_the_sdk_wakes_each_run(rt: Runtime, api: httpx.AsyncClient) -> None:
    runs = [await waiting_run(rt, f"o-{i}") for i in range(3)]
    events = [
        event(PAID, PAYMENTS, {"order_id": f"o-{i}"}, tideflowrunid=run)
        for i, run in enumerate(runs)
    ]
    headers, body = batch(*events)
    answer = await api.post("/events", content=body, headers=signed(PAY_SECRET, headers, body))
    assert answer.status_code == 202, answer.text
    assert answer.json()["mode"] == "batch"
    assert [e["delivered_to"] for e in answer.json()["events"]] == [[r] for r in runs]
    for i, run in enumerate(runs):
        result = await rt.client.wait(run, 10)
        assert result.output["data"] == {"order_id": f"o-{i}"}


async def test_binary_data_that_is_not_text_arrives_base64(
    rt: Runtime, api: httpx.AsyncClient
) -> None:
    run_id = await waiting_run(rt, "o-1")
    ce = event(
        PAID,
        APPROVALS + "desk",
        b"\xff\x00",
        tideflowrunid=run_id,
        datacontenttype="application/octet-stream",
    )
    for encode in (binary, structured):
        headers, body = encode(ce)
        answer = await api.post("/events", content=body, headers={**headers, **BEARER})
        assert answer.status_code == 202, answer.text
    # the wait's match looks at data.order_id, which base64 data has not: the signal is
    # kept for a later wait (and the second delivery was the same event, applied once)
    state = await rt.client.state(run_id)
    (kept,) = state.signals
    assert kept.payload["data_base64"] == "/wA="
    assert "data" not in kept.payload
    assert kept.payload["datacontenttype"] == "application/octet-stream"


async def test_a_redelivery_is_acknowledged_and_applied_once(
    rt: Runtime, api: httpx.AsyncClient
) -> None:
    run_id = await waiting_run(rt, "o-1")
    ce = event(PAID, APPROVALS + "desk", {"order_id": "other"}, tideflowrunid=run_id)
    headers, body = structured(ce)  # not matched: kept, so the run stays to be looked at
    first = await api.post("/events", content=body, headers={**headers, **BEARER})
    again = await api.post("/events", content=body, headers={**headers, **BEARER})
    assert (first.status_code, again.status_code) == (202, 202)
    assert first.json()["events"][0]["status"] == "delivered"
    assert again.json()["events"][0]["status"] == "duplicate"
    assert again.json()["events"][0]["delivered_to"] == [run_id]
    assert len(await signals_applied(rt, run_id)) == 1
    assert len((await rt.client.state(run_id)).signals) == 1


async def test_two_concurrent_deliveries_are_applied_once(
    rt: Runtime, api: httpx.AsyncClient
) -> None:
    run_id = await waiting_run(rt, "o-1")
    ce = event(PAID, APPROVALS + "desk", {"order_id": "o-1"}, tideflowrunid=run_id)
    headers, body = binary(ce)
    answers = await asyncio.gather(
        *(api.post("/events", content=body, headers={**headers, **BEARER}) for _ in range(2))
    )
    assert [a.status_code for a in answers] == [202, 202]
    assert {a.json()["events"][0]["status"] for a in answers} <= {"delivered", "duplicate"}
    result = await rt.client.wait(run_id, 10)
    assert result.status == "succeeded"
    assert len(await signals_applied(rt, run_id)) == 1


async def test_the_same_event_twice_in_a_batch_is_applied_once(
    rt: Runtime, api: httpx.AsyncClient
) -> None:
    run_id = await waiting_run(rt, "o-1")
    ce = event(PAID, PAYMENTS, {"order_id": "x"}, tideflowrunid=run_id)
    headers, body = batch(ce, ce)
    answer = await api.post("/events", content=body, headers=signed(PAY_SECRET, headers, body))
    assert [e["status"] for e in answer.json()["events"]] == ["delivered", "duplicate"]
    assert len(await signals_applied(rt, run_id)) == 1


async def test_the_same_id_from_another_source_is_another_event(
    rt: Runtime, api: httpx.AsyncClient
) -> None:
    run_id = await waiting_run(rt, "o-1")
    for source in (APPROVALS + "a", APPROVALS + "b"):
        ce = event(PAID, source, {"order_id": "x"}, tideflowrunid=run_id, id="same-id")
        headers, body = structured(ce)
        answer = await api.post("/events", content=body, headers={**headers, **BEARER})
        assert answer.json()["events"][0]["status"] == "delivered"
    assert len(await signals_applied(rt, run_id)) == 2


async def test_an_event_for_no_run_or_an_ended_run_is_unmatched_and_changes_nothing(
    rt: Runtime, api: httpx.AsyncClient
) -> None:
    run_id = await waiting_run(rt, "o-1")
    await rt.client.cancel(run_id)
    await rt.client.wait(run_id, 10)
    before = await rt.client.history(run_id)
    for target in ("no-such-run", run_id):
        ce = event(PAID, APPROVALS + "desk", {"order_id": "o-1"}, tideflowrunid=target)
        headers, body = structured(ce)
        answer = await api.post("/events", content=body, headers={**headers, **BEARER})
        assert answer.status_code == 202
        (outcome,) = answer.json()["events"]
        assert (outcome["status"], outcome["delivered_to"]) == ("unmatched", [])
        assert target in outcome["reason"]
    assert await rt.client.history(run_id) == before


async def test_an_event_whose_type_no_wait_declares_is_unmatched(
    rt: Runtime, api: httpx.AsyncClient
) -> None:
    run_id = await waiting_run(rt, "o-1")
    ce = event("com.example.other", APPROVALS + "desk", None, tideflowrunid=run_id)
    headers, body = structured(ce)
    answer = await api.post("/events", content=body, headers={**headers, **BEARER})
    (outcome,) = answer.json()["events"]
    assert outcome["status"] == "unmatched"
    assert "com.example.other" in outcome["reason"]
    assert await signals_applied(rt, run_id) == []
