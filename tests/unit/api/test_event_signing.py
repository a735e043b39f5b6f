"""What a source's credential lets it do (docs/events.md, Signatures and Sources): a
signature covers everything that routes or identifies an event, so a captured request
re-sent with other ``ce-*`` headers, or a structured one re-sent as binary, is refused
(401) and no run moves; a source sends only the types its policy allows, and names a
run only if it may (403, the field named, nothing changed); two secrets are valid while
one is rotated; a timestamp that is no unix seconds is a 401, never a 500.

On SQLite and PostgreSQL: "no run moves" is read back from the store."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import orjson
import pytest

from tideflow.api.event_sources import EventSources, sign, sign_v2
from tideflow.runtime.runtime import Runtime
from tideflow.testing.waiting import step_is, wait_until

from .conftest import binary, event, served, structured

PAYMENTS = "https://pay.example.com/webhooks"
DESK = "urn:approvals:desk"
PAID = "com.example.payment.succeeded"
APPROVED = "com.example.order.approved"
ENV = {
    "PAY_SECRET": "pay-new-secret-0123456789",
    "PAY_SECRET_OLD": "pay-old-secret-0123456789",
    "DESK_TOKEN": "desk-new-token-0123456789",
    "DESK_TOKEN_OLD": "desk-old-token-0123456789",
}
THIRD = "pay-third-secret-012345678"
POLICY = EventSources.of(
    {
        "sources": [
            {
                "source": PAYMENTS,
                "auth": "hmac",
                "secret_env": "PAY_SECRET",
                "previous_secret_env": "PAY_SECRET_OLD",
                "types": ["com.example.payment.*"],
                "address_runs": True,
            },
            {
                "source": "urn:approvals:*",
                "auth": "bearer",
                "token_env": "DESK_TOKEN",
                "previous_token_env": "DESK_TOKEN_OLD",
                "types": [APPROVED],
            },
        ]
    },
    ENV,
)
DESK_BEARER = {"authorization": f"Bearer {ENV['DESK_TOKEN']}"}
FLOW = {
    "name": "pay",
    "version": "1",
    "input": {"type": "object", "required": ["order_id"]},
    "steps": [
        {"id": "paid", "type": "wait", "signal": PAID},
        {"id": "approved", "type": "wait", "signal": APPROVED,
         "match": "{{ signal.data.order_id == inputs.order_id }}"},
    ],
    "output": "{{ steps.paid.output }}",
}  # fmt: skip


@pytest.fixture(params=["sqlite", "postgres"])
async def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.db'}"
        return
    base = request.getfixturevalue("postgres_url")
    schema = f"signing_{uuid.uuid4().hex[:12]}"
    yield f"{base}?schema={schema}"
    conn = await asyncpg.connect(base)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


class Gateway:
    def __init__(self, rt: Runtime, api: httpx.AsyncClient) -> None:
        self.rt, self.api = rt, api

    async def waiting_run(self, order_id: str) -> str:
        run_id = await self.rt.client.start("pay", {"order_id": order_id})
        await wait_until(self.rt, run_id, step_is("paid", "waiting"))
        return run_id

    async def post(self, body: bytes, headers: dict[str, str]) -> httpx.Response:
        return await self.api.post("/events", content=body, headers=headers)

    async def refused(
        self, status: int, body: bytes, headers: dict[str, str], *runs: str
    ) -> dict[str, Any]:
        """The request is answered ``status`` and none of ``runs`` moves."""
        before = [await self.rt.client.history(run) for run in runs]
        answer = await self.post(body, headers)
        assert answer.status_code == status, answer.text
        assert answer.headers["content-type"] == "application/problem+json"
        for run, history in zip(runs, before, strict=True):
            await self.unmoved(run, history)
        problem: dict[str, Any] = answer.json()
        return problem

    async def unmoved(self, run: str, history: Any) -> None:
        assert await self.rt.client.history(run) == history
        state = await self.rt.client.state(run)
        assert (state.signals, state.seen_signals) == ([], set())
        assert state.steps["paid"].status.value == "waiting"


@pytest.fixture
async def gw(store_url: str) -> AsyncIterator[Gateway]:
    async with Runtime(store=store_url, workers=1) as rt:
        await rt.client.register(FLOW)
        async with served(rt.client, POLICY) as api:
            yield Gateway(rt, api)


def v2(
    secret: str, headers: dict[str, str], body: bytes, at: float | None = None
) -> dict[str, str]:
    """``headers`` signed with v2 for ``POST /events``."""
    timestamp = str(int(time.time() if at is None else at))
    signature = sign_v2(secret, timestamp, "POST", "/events", headers.items(), body)
    return {**headers, "x-tideflow-timestamp": timestamp, "x-tideflow-signature": signature}


def v1(secret: str, headers: dict[str, str], body: bytes) -> dict[str, str]:
    timestamp = str(int(time.time()))
    signature = sign(secret, timestamp, body)
    return {**headers, "x-tideflow-timestamp": timestamp, "x-tideflow-signature": signature}


def payment(run_id: str, **attributes: Any) -> tuple[dict[str, str], bytes]:
    ce = event(PAID, PAYMENTS, {"order_id": "o-1"}, tideflowrunid=run_id, **attributes)
    return binary(ce)


def delivered(answer: httpx.Response) -> list[str]:
    assert answer.status_code == 202, answer.text
    (outcome,) = answer.json()["events"]
    assert outcome["status"] == "delivered", outcome
    runs: list[str] = outcome["delivered_to"]
    return runs


# -- the signature covers what routes ----------------------------------------------


async def test_a_forged_binary_resend_under_a_captured_v2_signature_is_refused(
    gw: Gateway,
) -> None:
    victim, target = await gw.waiting_run("o-1"), await gw.waiting_run("o-2")
    headers, body = payment(victim, id="pay-1")
    captured = v2(ENV["PAY_SECRET"], headers, body)
    assert delivered(await gw.post(body, captured)) == [victim]
    await wait_until(gw.rt, victim, step_is("paid", "succeeded"))  # then it waits, still
    forgeries = [
        {"ce-tideflowrunid": target},
        {"ce-tideflowrunid": target, "ce-id": "pay-2"},
        {"ce-id": "pay-2"},  # a new id: the victim would take it as another payment
        {"ce-type": "com.example.payment.refunded"},
        {"content-type": "text/plain"},
    ]
    history = await gw.rt.client.history(victim)
    for changes in forgeries:
        await gw.refused(401, body, {**captured, **changes}, target)
        assert await gw.rt.client.history(victim) == history
    await gw.refused(401, body.replace(b"o-1", b"o-2"), captured, target)


async def test_a_binary_request_signed_over_its_body_only_is_refused_and_no_run_moves(
    gw: Gateway,
) -> None:
    """A v1 signature (timestamp.body) on a binary request covers none of its ce-*
    headers: re-sent with another ce-id, ce-type or ce-tideflowrunid it would complete
    any run's wait. The request is refused, and so is every re-send."""
    victim, target = await gw.waiting_run("o-1"), await gw.waiting_run("o-2")
    headers, body = payment(victim, id="pay-1")
    captured = v1(ENV["PAY_SECRET"], headers, body)
    await gw.refused(401, body, captured, victim, target)
    forged = {**captured, "ce-id": "pay-2", "ce-tideflowrunid": target}
    await gw.refused(401, body, forged, victim, target)


async def test_a_structured_request_resent_as_binary_is_refused(gw: Gateway) -> None:
    victim, target = await gw.waiting_run("o-1"), await gw.waiting_run("o-2")
    ce = event(PAID, PAYMENTS, {"order_id": "o-1"}, tideflowrunid=victim, id="pay-1")
    headers, body = structured(ce)
    captured = v1(ENV["PAY_SECRET"], headers, body)
    history = await gw.rt.client.history(target)
    assert delivered(await gw.post(body, captured)) == [victim]
    as_binary = {
        **captured,
        "content-type": "application/json",
        "ce-specversion": "1.0",
        "ce-id": "pay-2",
        "ce-source": PAYMENTS,
        "ce-type": PAID,
        "ce-tideflowrunid": target,
    }
    await gw.refused(401, body, as_binary, target)
    await gw.unmoved(target, history)


async def test_v2_signs_structured_and_batched_requests_too(gw: Gateway) -> None:
    run_id = await gw.waiting_run("o-1")
    ce = event(PAID, PAYMENTS, {"order_id": "o-1"}, tideflowrunid=run_id)
    headers, body = structured(ce)
    assert delivered(await gw.post(body, v2(ENV["PAY_SECRET"], headers, body))) == [run_id]


async def test_a_repeated_ce_header_is_a_400_naming_it(gw: Gateway) -> None:
    run_id = await gw.waiting_run("o-1")
    headers, body = payment(run_id)
    signed = v2(ENV["PAY_SECRET"], headers, body)
    raw = [*signed.items(), ("ce-tideflowrunid", run_id)]
    answer = await gw.api.post("/events", content=body, headers=raw)
    assert answer.status_code == 400, answer.text
    fields = {e["field"]: e["message"] for e in answer.json()["errors"]}
    assert "more than once" in fields["header ce-tideflowrunid"]


# -- rotation ------------------------------------------------------------------------


async def test_the_new_and_the_previous_secret_are_taken_and_a_third_is_not(
    gw: Gateway,
) -> None:
    run_ids = [await gw.waiting_run("o-1") for _ in range(3)]
    for secret, run_id in zip((ENV["PAY_SECRET"], ENV["PAY_SECRET_OLD"]), run_ids, strict=False):
        headers, body = payment(run_id)
        assert delivered(await gw.post(body, v2(secret, headers, body))) == [run_id]
    headers, body = payment(run_ids[2])
    await gw.refused(401, body, v2(THIRD, headers, body), run_ids[2])
    # a sender rotating its own key sends both signatures, space-separated
    now = time.time()
    both = v2(THIRD, headers, body, at=now)
    both["x-tideflow-signature"] += (
        " " + v2(ENV["PAY_SECRET"], headers, body, at=now)["x-tideflow-signature"]
    )
    assert delivered(await gw.post(body, both)) == [run_ids[2]]


async def test_a_bearer_source_takes_its_new_and_its_previous_token(gw: Gateway) -> None:
    run_id = await gw.waiting_run("o-1")
    ce = event(APPROVED, DESK, {"order_id": "o-9"})
    headers, body = structured(ce)
    for token in (ENV["DESK_TOKEN"], ENV["DESK_TOKEN_OLD"]):
        answer = await gw.post(body, {**headers, "authorization": f"Bearer {token}"})
        assert answer.status_code == 202, answer.text
    await gw.refused(401, body, {**headers, "authorization": f"Bearer {THIRD}"}, run_id)


# -- per-source policy -----------------------------------------------------------------


async def test_a_source_sending_a_type_it_may_not_is_refused_whole(gw: Gateway) -> None:
    run_id = await gw.waiting_run("o-1")
    # the approvals desk's token, a payment event: it would complete the payment wait
    headers, body = structured(event(PAID, DESK, {"order_id": "o-1"}))
    problem = await gw.refused(403, body, {**headers, **DESK_BEARER}, run_id)
    assert problem["type"] == "urn:tideflow:problem:forbidden"
    (error,) = problem["errors"]
    assert error["field"] == "body.type"
    assert PAID in error["message"] and APPROVED in error["message"]
    # in a batch, the allowed event is not delivered either
    ok = {"specversion": "1.0", "id": "a-1", "source": DESK, "type": APPROVED}
    bad = {**ok, "id": "a-2", "type": PAID, "data": {"order_id": "o-1"}}
    batch = orjson.dumps([ok, bad])
    headers = {"content-type": "application/cloudevents-batch+json", **DESK_BEARER}
    problem = await gw.refused(403, batch, headers, run_id)
    assert [e["field"] for e in problem["errors"]] == ["body[1].type"]
    # binary mode names the header
    headers, body = binary(event(PAID, DESK, {"order_id": "o-1"}))
    problem = await gw.refused(403, body, {**headers, **DESK_BEARER}, run_id)
    assert [e["field"] for e in problem["errors"]] == ["header ce-type"]


async def test_an_hmac_source_with_a_type_outside_its_patterns_is_refused(gw: Gateway) -> None:
    run_id = await gw.waiting_run("o-1")
    ce = event(APPROVED, PAYMENTS, {"order_id": "o-1"})
    headers, body = structured(ce)
    problem = await gw.refused(403, body, v2(ENV["PAY_SECRET"], headers, body), run_id)
    assert problem["errors"][0]["field"] == "body.type"
    assert "com.example.payment.*" in problem["errors"][0]["message"]


async def test_a_source_not_allowed_to_address_runs_is_refused_a_tideflowrunid(
    gw: Gateway,
) -> None:
    run_id = await gw.waiting_run("o-1")
    ce = event(APPROVED, DESK, {"order_id": "o-1"}, tideflowrunid=run_id)
    headers, body = structured(ce)
    problem = await gw.refused(403, body, {**headers, **DESK_BEARER}, run_id)
    (error,) = problem["errors"]
    assert error["field"] == "body.tideflowrunid"
    assert "address_runs: true" in error["message"]


async def test_an_api_token_that_may_signal_is_not_bound_by_any_policy(gw: Gateway) -> None:
    from tideflow.api.auth import issue_token
    from tideflow.model.tokens import Role

    run_id = await gw.waiting_run("o-1")
    operator = await issue_token(gw.rt.client.store, name="ops", role=Role.OPERATOR, now=0.0)
    headers, body = structured(event(PAID, DESK, {"order_id": "o-1"}, tideflowrunid=run_id))
    answer = await gw.post(body, {**headers, "authorization": f"Bearer {operator.value}"})
    assert delivered(answer) == [run_id]


# -- timestamps that are not unix seconds --------------------------------------------


@pytest.mark.parametrize(
    "timestamp", ["9" * 400, "1" * 5000, "1700000000.5", "-1", "²", "0x10", "1e9"]
)
async def test_a_timestamp_that_is_not_unix_seconds_is_401_never_500(
    gw: Gateway, timestamp: str
) -> None:
    run_id = await gw.waiting_run("o-1")
    headers, body = payment(run_id)
    signed: dict[str, Any] = v2(ENV["PAY_SECRET"], headers, body)
    signed["x-tideflow-timestamp"] = timestamp.encode("latin-1")  # '²' is no ASCII
    problem = await gw.refused(401, body, signed, run_id)
    assert problem["type"] == "urn:tideflow:problem:unauthenticated"


# -- the OpenAPI document --------------------------------------------------------------


async def test_the_openapi_document_describes_the_headers_events_reads() -> None:
    from tideflow.api import create_app

    async with Runtime(workers=1) as rt:
        operation = create_app(rt.client, event_sources=POLICY).openapi()["paths"]["/events"]
    described = {p["name"]: p for p in operation["post"]["parameters"]}
    assert {"ce-id", "ce-source", "ce-specversion", "ce-type", "ce-tideflowrunid"} <= set(described)
    assert {"x-tideflow-timestamp", "x-tideflow-signature"} <= set(described)
    assert all(p["in"] == "header" and not p["required"] for p in described.values())
    assert "v2=" in described["x-tideflow-signature"]["description"]
    assert "403" in operation["post"]["responses"]
