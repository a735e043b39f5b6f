"""Every request ``POST /events`` refuses: a clear 4xx naming what is wrong, and no run
changes (the run waiting here has the same history and no signal kept after each)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest

from tideflow.api.auth import issue_token
from tideflow.model.tokens import Role
from tideflow.runtime.runtime import Runtime
from tideflow.testing.waiting import step_is, wait_until

from .conftest import (
    APPROVALS,
    BATCH,
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

STRUCTURED = {"content-type": "application/cloudevents+json"}


class Gateway:
    def __init__(self, rt: Runtime, api: httpx.AsyncClient, run_id: str) -> None:
        self.rt, self.api, self.run_id = rt, api, run_id

    def good(self, **changes: Any) -> dict[str, Any]:
        """A valid structured event for the waiting run, with ``changes``."""
        ce = {
            "specversion": "1.0",
            "id": "e-1",
            "source": APPROVALS + "desk",
            "type": PAID,
            "tideflowrunid": self.run_id,
            "data": {"order_id": "o-1"},
        }
        ce.update(changes)
        return {k: v for k, v in ce.items() if v is not ...}

    async def refused(
        self, status: int, body: bytes, headers: dict[str, str], auth: bool = True
    ) -> dict[str, Any]:
        before = await self.rt.client.history(self.run_id)
        answer = await self.api.post(
            "/events", content=body, headers={**headers, **(BEARER if auth else {})}
        )
        assert answer.status_code == status, answer.text
        assert answer.headers["content-type"] == "application/problem+json"
        assert await self.rt.client.history(self.run_id) == before
        state = await self.rt.client.state(self.run_id)
        assert (state.signals, state.seen_signals) == ([], set())
        assert state.steps["paid"].status.value == "waiting"
        problem: dict[str, Any] = answer.json()
        return problem


@pytest.fixture
async def rt() -> AsyncIterator[Runtime]:
    async with Runtime(workers=1) as runtime:
        await runtime.client.register(ORDER)
        yield runtime


@pytest.fixture
async def gw(rt: Runtime) -> AsyncIterator[Gateway]:
    run_id = await rt.client.start("order", {"order_id": "o-1"})
    await wait_until(rt, run_id, step_is("paid", "waiting"))
    async with served(rt.client, SOURCES, max_body=4096) as api:
        yield Gateway(rt, api, run_id)


def fields(problem: dict[str, Any]) -> dict[str, str]:
    return {e["field"]: e["message"] for e in problem.get("errors", [])}


@pytest.mark.parametrize("missing", ["id", "source", "specversion", "type"])
async def test_a_missing_required_attribute_is_named(gw: Gateway, missing: str) -> None:
    body = orjson.dumps(gw.good(**{missing: ...}))
    problem = await gw.refused(400, body, STRUCTURED)
    assert problem["type"] == "urn:tideflow:problem:event-invalid"
    assert f"required attribute {missing} is missing" in fields(problem)[f"body.{missing}"]
    assert f"body.{missing}" in problem["detail"]


async def test_every_missing_attribute_is_named_at_once(gw: Gateway) -> None:
    problem = await gw.refused(400, b"{}", STRUCTURED)
    assert set(fields(problem)) == {"body.id", "body.source", "body.specversion", "body.type"}


@pytest.mark.parametrize("version", ["0.3", "2.0", 1.0])
async def test_a_wrong_specversion_is_refused(gw: Gateway, version: Any) -> None:
    problem = await gw.refused(400, orjson.dumps(gw.good(specversion=version)), STRUCTURED)
    assert "body.specversion" in fields(problem)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"id": ""}, "body.id"),
        ({"type": 7}, "body.type"),
        ({"time": "yesterday"}, "body.time"),
        ({"time": "2026-13-01T00:00:00Z"}, "body.time"),
        ({"Bad_Name": "x"}, "body.Bad_Name"),
        ({"nested": {"a": 1}}, "body.nested"),
        ({"big": 2**40}, "body.big"),
        ({"data_base64": "not base64!"}, "body.data_base64"),
        ({"data_base64": "AAAA"}, "body.data_base64"),  # with data: not both
    ],
)
async def test_a_wrong_attribute_is_named(gw: Gateway, changes: dict[str, Any], field: str) -> None:
    problem = await gw.refused(400, orjson.dumps(gw.good(**changes)), STRUCTURED)
    assert field in fields(problem)


async def test_malformed_json_is_400(gw: Gateway) -> None:
    problem = await gw.refused(400, b'{"id": "e-1",', STRUCTURED)
    assert problem["detail"] == "malformed JSON"
    assert "malformed JSON" in fields(problem)["body"]


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("application/cloudevents+json", b"[]"),
        ("application/cloudevents+json", b'"text"'),
        (BATCH, b"{}"),
    ],
)
async def test_a_body_of_the_wrong_shape_is_400(
    gw: Gateway, content_type: str, body: bytes
) -> None:
    problem = await gw.refused(400, body, {"content-type": content_type})
    assert "body" in fields(problem)


async def test_a_batch_names_the_index_at_fault_and_delivers_none(gw: Gateway) -> None:
    good = gw.good()
    bad = gw.good(id="e-2", specversion=...)
    body = orjson.dumps([good, bad, "not an event"])
    problem = await gw.refused(400, body, {"content-type": BATCH})
    assert set(fields(problem)) == {"body[1].specversion", "body[2]"}
    assert problem["detail"].startswith("body[1].specversion")


async def test_binary_mode_names_the_missing_headers(gw: Gateway) -> None:
    ce = event(PAID, APPROVALS + "desk", {"order_id": "o-1"}, tideflowrunid=gw.run_id)
    headers, body = binary(ce)
    del headers["ce-id"]
    problem = await gw.refused(400, body, headers)
    assert "header ce-id" in fields(problem)


async def test_binary_mode_refuses_a_json_body_that_is_not_json(gw: Gateway) -> None:
    ce = event(PAID, APPROVALS + "desk", None, tideflowrunid=gw.run_id)
    headers, _ = binary(ce)
    problem = await gw.refused(400, b"{not json", {**headers, "content-type": "application/json"})
    assert "malformed JSON" in fields(problem)["body"]


async def test_a_request_without_any_cloudevent_says_how_to_send_one(gw: Gateway) -> None:
    body = orjson.dumps(gw.good())
    problem = await gw.refused(400, body, {"content-type": "application/json"})
    assert "application/cloudevents+json" in problem["detail"]
    assert "ce-id" in problem["detail"]


async def test_another_cloudevents_format_is_415(gw: Gateway) -> None:
    problem = await gw.refused(415, b"<event/>", {"content-type": "application/cloudevents+xml"})
    assert problem["type"] == "urn:tideflow:problem:unsupported-media-type"


async def test_an_oversized_body_is_413(gw: Gateway) -> None:
    body = orjson.dumps(gw.good(data={"order_id": "o-1", "pad": "x" * 5000}))
    problem = await gw.refused(413, body, STRUCTURED)
    assert "4096" in problem["detail"]


# -- authentication ----------------------------------------------------------------


async def unauthorised(gw: Gateway, body: bytes, headers: dict[str, str]) -> None:
    before = await gw.rt.client.history(gw.run_id)
    answer = await gw.api.post("/events", content=body, headers=headers)
    assert answer.status_code == 401, answer.text
    assert answer.headers["www-authenticate"].startswith("Bearer")
    assert answer.json()["type"] == "urn:tideflow:problem:unauthenticated"
    assert "source" in answer.json()["detail"]
    assert await gw.rt.client.history(gw.run_id) == before
    assert (await gw.rt.client.state(gw.run_id)).seen_signals == set()


async def test_an_unknown_source_without_an_api_token_is_401(gw: Gateway) -> None:
    body = orjson.dumps(gw.good(source="https://elsewhere.example"))
    await unauthorised(gw, body, {**STRUCTURED, **BEARER})


@pytest.mark.parametrize(
    "authorization",
    [None, "Bearer wrong-token-0123456789", "Basic YTpi", f"{BEARER['authorization']}x"],
)
async def test_a_bearer_source_needs_its_token(gw: Gateway, authorization: str | None) -> None:
    headers = {**STRUCTURED, **({"authorization": authorization} if authorization else {})}
    await unauthorised(gw, orjson.dumps(gw.good()), headers)


def payment(gw: Gateway) -> bytes:
    return orjson.dumps(gw.good(source=PAYMENTS))


async def test_an_hmac_source_needs_a_good_signature(gw: Gateway) -> None:
    body = payment(gw)
    await unauthorised(gw, body, STRUCTURED)  # unsigned
    await unauthorised(gw, body, signed("another-secret-0123456789", STRUCTURED, body))
    tampered = signed(PAY_SECRET, STRUCTURED, body)
    await unauthorised(gw, body.replace(b"o-1", b"o-2"), tampered)
    bad = {**signed(PAY_SECRET, STRUCTURED, body), "x-tideflow-signature": "sha256=00"}
    await unauthorised(gw, body, bad)
    nonnumeric = {**signed(PAY_SECRET, STRUCTURED, body), "x-tideflow-timestamp": "now"}
    await unauthorised(gw, body, nonnumeric)


# 302, not 301: the header's timestamp is whole seconds, so time() + 301 truncated can be
# under 301 s ahead by the time the server reads its clock
@pytest.mark.parametrize("offset", [-302, 302, -86400])
async def test_a_timestamp_outside_the_replay_window_is_401(gw: Gateway, offset: int) -> None:
    body = payment(gw)
    await unauthorised(gw, body, signed(PAY_SECRET, STRUCTURED, body, at=time.time() + offset))


async def test_a_good_signature_inside_the_window_is_taken(gw: Gateway) -> None:
    body = payment(gw)
    headers = signed(PAY_SECRET, STRUCTURED, body, at=time.time() - 200)
    answer = await gw.api.post("/events", content=body, headers=headers)
    assert answer.status_code == 202, answer.text
    assert answer.json()["events"][0]["status"] == "delivered"


async def test_a_batch_with_one_source_not_authorised_is_refused_whole(gw: Gateway) -> None:
    ok = event(PAID, PAYMENTS, {"order_id": "o-1"}, tideflowrunid=gw.run_id)
    other = event(PAID, APPROVALS + "desk", {"order_id": "o-1"}, tideflowrunid=gw.run_id)
    headers, body = batch(ok, other)
    # signed for the payments source, but no bearer token for the approvals one
    await unauthorised(gw, body, signed(PAY_SECRET, headers, body))
    answer = await gw.api.post(
        "/events", content=body, headers={**signed(PAY_SECRET, headers, body), **BEARER}
    )
    assert answer.status_code == 202  # with both, both are taken


async def test_an_api_token_that_may_signal_is_taken_for_any_source(gw: Gateway) -> None:
    store = gw.rt.client.store
    operator = await issue_token(store, name="ops", role=Role.OPERATOR, now=time.time())
    viewer = await issue_token(store, name="eyes", role=Role.VIEWER, now=time.time())
    body = orjson.dumps(gw.good(source="https://anywhere.example"))
    await unauthorised(gw, body, {**STRUCTURED, "authorization": f"Bearer {operator.value}x"})
    forbidden = await gw.refused(
        403, body, {**STRUCTURED, "authorization": f"Bearer {viewer.value}"}, auth=False
    )
    assert forbidden["type"] == "urn:tideflow:problem:forbidden"
    headers = {**STRUCTURED, "authorization": f"Bearer {operator.value}"}
    answer = await gw.api.post("/events", content=body, headers=headers)
    assert answer.status_code == 202
    assert answer.json()["events"][0]["status"] == "delivered"


async def test_structured_events_from_the_sdk_are_refused_without_credentials(
    gw: Gateway,
) -> None:
    headers, body = structured(event(PAID, PAYMENTS, {"order_id": "o-1"}, tideflowrunid=gw.run_id))
    await unauthorised(gw, body, headers)
