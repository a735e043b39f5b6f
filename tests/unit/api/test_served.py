"""The API served by a real uvicorn on a free loopback port, called over TCP."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import httpx
import uvicorn

from tideflow.api import create_app
from tideflow.runtime.runtime import Runtime


async def test_uvicorn_serves_the_api_over_tcp() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()  # connections wait in the backlog until uvicorn accepts them
    port = listener.getsockname()[1]
    async with Runtime(workers=1) as rt:
        config = uvicorn.Config(
            create_app(rt.client, max_body=16384), log_config=None, lifespan="off"
        )
        server = uvicorn.Server(config)
        serving = asyncio.create_task(server.serve(sockets=[listener]))
        try:
            base = f"http://127.0.0.1:{port}"
            async with httpx.AsyncClient(base_url=base) as api:
                assert (await api.get("/ready")).json() == {"status": "ready"}
                definition = {
                    "name": "hello",
                    "version": "1",
                    "steps": [{"id": "a", "type": "noop"}],
                }
                assert (await api.post("/definitions", json=definition)).status_code == 201
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
                assert (await api.get("/health")).status_code == 200
        finally:
            server.should_exit = True
            await serving
            listener.close()
