"""The API served by a real uvicorn on a free loopback port (``http_api``, as
`tideflow server --http` serves it), called over TCP."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import httpx
import pytest

from tideflow.api.auth import issue_token
from tideflow.api.serving import address_of, http_api, listen
from tideflow.lifecycle import Stop
from tideflow.model.tokens import Role
from tideflow.runtime.runtime import Runtime

HELLO = {"name": "hello", "version": "1", "steps": [{"id": "a", "type": "noop"}]}


async def test_uvicorn_serves_the_api_over_tcp_with_tokens() -> None:
    sock = listen("127.0.0.1", 0)
    base = address_of(sock)
    async with Runtime(workers=1) as rt:
        admin = await issue_token(rt.client.store, name="served", role=Role.ADMIN, now=0.0)
        headers = {"authorization": f"Bearer {admin.value}"}
        async with (
            http_api(rt.client, Stop(), sock, max_body=16384),
            httpx.AsyncClient(base_url=base, headers=headers) as api,
        ):
            assert (await api.get("/ready")).json() == {"status": "ready"}
            assert (await api.post("/definitions", json=HELLO)).status_code == 201
            started = await api.post("/runs", json={"workflow": "hello"})
            assert started.status_code == 201
            run_id = started.json()["run_id"]
            await rt.client.wait(run_id, 10)
            run = (await api.get(f"/runs/{run_id}")).json()
            assert run["status"] == "succeeded"
            missing = await api.get("/runs/nope")
            assert missing.status_code == 404
            assert missing.headers["content-type"] == "application/problem+json"
            assert (await api.delete("/runs")).status_code == 405

            async def chunks() -> AsyncIterator[bytes]:
                for _ in range(64):
                    yield b" " * 1024

            big = await api.post(
                "/runs", content=chunks(), headers={"content-type": "application/json"}
            )
            assert big.status_code == 413
            async with httpx.AsyncClient(base_url=base) as anonymous:
                assert (await anonymous.get("/health")).status_code == 200
                assert (await anonymous.get("/ready")).status_code == 200
                refused = await anonymous.get(f"/runs/{run_id}")
                assert refused.status_code == 401
                assert refused.headers["www-authenticate"].startswith("Bearer")


async def test_a_store_without_a_live_token_is_told_how_to_create_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sock = listen("127.0.0.1", 0)
    async with Runtime(workers=0) as rt:
        revoked = await issue_token(rt.client.store, name="old", role=Role.ADMIN, now=0.0)
        await rt.client.store.revoke_token(revoked.token.token_id, 1.0)
        with caplog.at_level(logging.INFO, logger="tideflow.api"):
            async with http_api(rt.client, Stop(), sock):
                pass
    text = caplog.text
    assert "no live one" in text and "tideflow tokens create --name NAME --role admin" in text
    assert "NO AUTHENTICATION" not in text
    assert "(API tokens)" in text


async def test_without_auth_it_serves_anyone_and_says_so_loudly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sock = listen("127.0.0.1", 0)
    base = address_of(sock)
    async with Runtime(workers=0) as rt:
        with caplog.at_level(logging.WARNING, logger="tideflow.api"):
            async with (
                http_api(rt.client, Stop(), sock, auth=False),
                httpx.AsyncClient(base_url=base) as api,
            ):
                assert (await api.get("/runs")).json() == {"runs": [], "next_cursor": None}
                document = (await api.get("/openapi.json")).json()
    assert "NO AUTHENTICATION" in caplog.text
    assert "securitySchemes" not in document.get("components", {})
    assert all(
        "security" not in op and "401" not in op["responses"]
        for path, item in document["paths"].items()
        if path != "/events"  # its sources' own credentials, with or without API tokens
        for op in item.values()
    )
