"""The caps on open event streams (api/stream_slots.py), over a real uvicorn on a free
loopback port: past the cap of one API token a 429 problem with ``Retry-After`` while
another token still gets a stream; past the server's cap a 429 for every token; a stream
whose reader went away gives its slot back at once; a refused stream reads nothing."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from tests.processes import eventually

from tideflow.api import create_app
from tideflow.api.auth import Principal, issue_token
from tideflow.api.run_views import stream_slots
from tideflow.api.serving import address_of, listen
from tideflow.api.stream_slots import LOCAL, RETRY_AFTER, StreamSlots
from tideflow.errors import TooManyStreams
from tideflow.model.tokens import Role
from tideflow.runtime.runtime import Runtime


@contextlib.asynccontextmanager
async def served(app: FastAPI) -> AsyncIterator[str]:
    sock = listen("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, lifespan="off"))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        yield address_of(sock)
    finally:
        server.should_exit = True
        await serving
        sock.close()


class Streams:
    """Event streams held open by one client (one connection each)."""

    def __init__(self, api: httpx.AsyncClient) -> None:
        self.api = api
        self.open: list[tuple[contextlib.AsyncExitStack, AsyncIterator[str]]] = []

    async def open_one(self, path: str = "/streams/runs", **headers: str) -> httpx.Response:
        """The stream's response: a 200 once its first event came (held open), or the
        refusal, read whole."""
        stack = contextlib.AsyncExitStack()
        response = await stack.enter_async_context(self.api.stream("GET", path, headers=headers))
        if response.status_code != 200:
            await response.aread()
            await stack.aclose()
            return response
        lines = response.aiter_lines()
        while not (await anext(lines)).startswith("data: "):
            pass
        self.open.append((stack, lines))  # a reader dropped would close its connection
        return response

    async def close_one(self) -> None:
        stack, _ = self.open.pop()
        await stack.aclose()

    async def close_all(self) -> None:
        while self.open:
            await self.close_one()


def refused(response: httpx.Response, cap: str) -> None:
    assert response.status_code == 429, response.text
    assert response.headers["retry-after"] == str(RETRY_AFTER)
    assert response.headers["content-type"] == "application/problem+json"
    body = response.json()
    assert body["type"] == "urn:tideflow:problem:too-many-streams"
    assert f"({cap}, " in body["detail"] and "retry after" in body["detail"], body


def counting(target: Any, name: str, monkeypatch: pytest.MonkeyPatch) -> Callable[[], int]:
    calls = [0]
    real = getattr(target, name)

    async def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return await real(*args, **kwargs)

    monkeypatch.setattr(target, name, counted)
    return lambda: calls[0]


async def test_past_a_tokens_cap_a_429_while_another_token_still_gets_a_stream(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with Runtime(workers=0, sweep_interval=0) as rt:  # the sweep reads pages too
        store = rt.client.store
        tokens = {
            who: {"authorization": f"Bearer {(await issue_token(store, name=who, role=Role.VIEWER, now=0.0)).value}"}
            for who in ("alice", "bob")
        }  # fmt: skip
        app = create_app(rt.client, max_streams=3, max_streams_per_token=2)
        slots = stream_slots(app)
        reads = counting(store, "list_runs", monkeypatch)
        async with (
            served(app) as base,
            httpx.AsyncClient(base_url=base, timeout=20, limits=httpx.Limits(max_connections=20)) as api,
        ):  # fmt: skip
            streams = Streams(api)
            try:
                for _ in range(2):
                    assert (await streams.open_one(**tokens["alice"])).status_code == 200
                assert reads() == 1  # the second stream of the same list shares the first read
                refused(await streams.open_one(**tokens["alice"]), "max_streams_per_token 2")
                run_stream = await streams.open_one("/streams/runs/nope", **tokens["alice"])
                refused(run_stream, "max_streams_per_token 2")  # before the 404: nothing read
                assert reads() == 1 and slots.open == 2
                assert (await streams.open_one(**tokens["bob"])).status_code == 200
                refused(await streams.open_one(**tokens["bob"]), "max_streams 3")
                assert slots.open == 3 and reads() == 1

                await streams.close_one()  # bob's: the server hears the reader go
                assert await eventually(lambda: slots.open == 2)
                assert (await streams.open_one(**tokens["bob"])).status_code == 200
                await streams.close_one()
                await streams.close_one()  # one of alice's
                assert await eventually(lambda: slots.open == 1)
                assert (await streams.open_one(**tokens["alice"])).status_code == 200
            finally:
                await streams.close_all()
            assert await eventually(lambda: slots.open == 0)


async def test_without_authentication_every_stream_is_the_local_users() -> None:
    async with Runtime(workers=0) as rt:
        app = create_app(rt.client, auth=False, max_streams_per_token=2)
        async with (
            served(app) as base,
            httpx.AsyncClient(base_url=base, timeout=20) as api,
        ):
            streams = Streams(api)
            try:
                for _ in range(2):
                    assert (await streams.open_one()).status_code == 200
                answer = await streams.open_one()
                refused(answer, "max_streams_per_token 2")
                assert "the local user" in answer.json()["detail"]
                await streams.close_one()
                assert await eventually(lambda: stream_slots(app).open == 1)
                assert (await streams.open_one()).status_code == 200
            finally:
                await streams.close_all()


async def test_a_stream_that_ends_by_itself_gives_its_slot_back() -> None:
    async with Runtime(workers=0) as rt:
        app = create_app(rt.client, auth=False, max_streams_per_token=1)
        async with served(app) as base, httpx.AsyncClient(base_url=base, timeout=20) as api:
            for _ in range(3):  # max_events ends each: the next one may open
                done = await api.get("/streams/runs", params={"max_events": 1})
                assert done.status_code == 200 and done.text.count("event: runs") == 1
                assert await eventually(lambda: stream_slots(app).open == 0)
            missing = await api.get("/streams/runs/nope")  # refused after its slot was taken
            assert missing.status_code == 404
            assert stream_slots(app).open == 0


def test_the_caps_count_per_holder_and_in_all() -> None:
    slots = StreamSlots(total=3, per_token=2)
    alice = Principal(token_id="a" * 16, name="alice", role=Role.VIEWER)
    held = [slots.take(alice), slots.take(alice)]
    with pytest.raises(TooManyStreams, match=r"API token a{16} \(alice\) has 2 event streams"):
        slots.take(alice)
    local = slots.take(None)
    with pytest.raises(TooManyStreams, match="the server has 3 event streams open"):
        slots.take(None)
    assert (slots.open, slots.held(alice), slots.held(None)) == (3, 2, 1)
    held[0].release()
    held[0].release()  # once is enough: the same slot is not given back twice
    assert (slots.open, slots.held(alice)) == (2, 1)
    local.release()
    assert (
        slots.held(None) == 0
        and slots.held(Principal(token_id=LOCAL, name="ui", role=Role.ADMIN)) == 0
    )


@pytest.mark.parametrize("cap", [0, -1, True, 2.5])
def test_a_cap_under_one_stream_is_refused(cap: Any) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        StreamSlots(total=cap)
    with pytest.raises(ValueError, match="max_streams_per_token"):
        StreamSlots(per_token=cap)


async def test_the_streams_document_their_429_and_its_retry_after() -> None:
    async with Runtime(workers=0) as rt:
        transport = httpx.ASGITransport(app=create_app(rt.client))
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as api:
            document = (await api.get("/openapi.json")).json()
    for path in ("/streams/runs", "/streams/runs/{run_id}"):
        refused = document["paths"][path]["get"]["responses"]["429"]
        assert refused["content"] == {
            "application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}
        }
        assert refused["headers"]["Retry-After"]["schema"] == {"type": "integer"}
