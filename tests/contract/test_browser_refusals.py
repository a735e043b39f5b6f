"""What a page of another site can make a browser send to a `--no-auth` API
(``create_app(auth=False)``) changes nothing, on SQLite and PostgreSQL: a request that
changes something without a JSON Content-Type (none, ``text/plain``, a form's types) is
a 415, and a request for another Host (DNS rebinding) a 421, each before any route runs
(api/browsers.py, docs/security.md "Browsers: CSRF and DNS rebinding")."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute
from tests.contract.conftest import Backend

from tideflow.api import create_app
from tideflow.runtime.runtime import Runtime
from tideflow.testing.waiting import step_is, wait_until

WAITING = {
    "name": "waiting",
    "version": "1",
    "schedule": {"every": "1h"},
    "steps": [
        {"id": "ask", "type": "wait", "signal": "go"},
        {"id": "after", "type": "noop", "depends_on": ["ask"]},
    ],
}
ATTACK = {
    "name": "attack",
    "version": "1",
    "schedule": {"every": "1m"},
    "steps": [{"id": "own", "type": "shell", "command": ["echo", "owned"]}],
}
"""What a page would register on a `--no-auth` server: a schedule that runs a shell step."""
BODIES: dict[tuple[str, str], Any] = {
    ("POST", "/definitions"): ATTACK,
    ("POST", "/definitions/validate"): ATTACK,
    ("POST", "/runs"): {"workflow": "waiting"},
    ("POST", "/runs/{run_id}/cancel"): {"reason": "csrf"},
    ("POST", "/runs/{run_id}/retry"): {"reason": "csrf"},
    ("POST", "/runs/{run_id}/signals"): {"name": "go", "payload": {"ok": True}},
    ("POST", "/schedules"): {"workflow": "waiting", "schedule": {"id": "x", "every": "1h"}},
}
"""A body for each route that takes one (the others are sent the same ``{}``)."""
SIMPLE_TYPES = [None, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data"]
"""What a form or a no-cors fetch can send without a CORS preflight (None: no header)."""


@dataclass
class World:
    rt: Runtime
    app: FastAPI
    api: httpx.AsyncClient
    run_id: str

    def url(self, path: str) -> str:
        return path.format(
            run_id=self.run_id,
            name="waiting",
            version="1",
            workflow="waiting",
            schedule_id="default",
            key="no-such-event",  # an unmatched event's key (none is kept: a 404 if reached)
        )

    async def state(self) -> tuple[object, ...]:
        """What a request could change: runs, their history, definitions, schedules."""
        runs = (await self.rt.client.list(limit=1000)).runs
        histories = [len(await self.rt.client.history(r.run_id)) for r in runs]
        definitions = await self.rt.client.definitions()
        schedules = await self.rt.store.list_schedules()
        return (
            [(r.run_id, r.status) for r in runs],
            histories,
            [(d.name, d.version, d.active) for d in definitions],
            [(s.key, s.paused, s.deleted) for s in schedules],
        )


@pytest.fixture
async def world(sql_backend: Backend) -> AsyncIterator[World]:
    async with Runtime(store=sql_backend.make(), workers=1) as rt:
        await rt.client.register(WAITING)
        run_id, _ = await rt.client.launch("waiting", {})
        await wait_until(rt, run_id, step_is("ask", "waiting"))
        app = create_app(rt.client, auth=False)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost:8080") as api:
            yield World(rt, app, api, run_id)


def changing_routes(app: FastAPI) -> list[tuple[str, str]]:
    """Every route of the app that changes something, but the event gateway."""
    return sorted(
        (method, route.path)
        for route in app.routes
        if isinstance(route, APIRoute)
        for method in route.methods
        if method in {"POST", "PUT", "PATCH", "DELETE"} and route.path != "/events"
    )


def encoded(body: Any, media: str | None) -> tuple[bytes, dict[str, str]]:
    """``body`` as a page would send it with ``media``: JSON text in a text/plain or form
    body, or nothing at all."""
    if media is None:
        return b"", {}
    text = orjson.dumps(body)
    if media == "multipart/form-data":
        boundary = "x-boundary"
        part = (
            f'--{boundary}\r\nContent-Disposition: form-data; name="{text.decode()}"\r\n\r\n'
            f"\r\n--{boundary}--\r\n"
        )
        return part.encode(), {"content-type": f"{media}; boundary={boundary}"}
    return text, {"content-type": media}


async def test_no_request_without_a_json_type_changes_anything(world: World) -> None:
    routes = changing_routes(world.app)
    assert len(routes) >= 12 and ("POST", "/definitions") in routes
    before = await world.state()
    for method, path in routes:
        for media in SIMPLE_TYPES:
            content, headers = encoded(BODIES.get((method, path), {}), media)
            response = await world.api.request(
                method, world.url(path), content=content, headers=headers
            )
            assert response.status_code == 415, (method, path, media, response.text)
            assert response.headers["content-type"] == "application/problem+json"
            body = response.json()
            assert body["type"] == "urn:tideflow:problem:unsupported-media-type"
            assert "Content-Type: application/json" in body["detail"]
    assert await world.state() == before
    assert [d.name for d in await world.rt.client.definitions()] == ["waiting"]


async def test_the_web_uis_own_posts_need_a_json_type_too(world: World) -> None:
    for path in ("/ui/login", "/ui/logout"):
        for media in SIMPLE_TYPES:
            content, headers = encoded({"token": "tf_x"}, media)
            response = await world.api.post(path, content=content, headers=headers)
            assert response.status_code == 415, (path, media, response.text)
    logout = await world.api.post("/ui/logout", headers={"content-type": "application/json"})
    assert logout.status_code == 204


async def test_the_same_requests_with_a_json_type_go_through(world: World) -> None:
    json_type = {"content-type": "application/json; charset=utf-8"}
    paused = await world.api.post(world.url("/schedules/{workflow}/{schedule_id}/pause"),
                                  headers=json_type)  # fmt: skip
    assert paused.status_code == 200 and paused.json()["changed"] is True, paused.text
    deactivated = await world.api.post(world.url("/definitions/{name}/{version}/deactivate"),
                                       headers=json_type)  # fmt: skip
    assert deactivated.status_code == 200, deactivated.text
    cancelled = await world.api.post(world.url("/runs/{run_id}/cancel"), headers=json_type)
    assert cancelled.status_code == 202, cancelled.text
    assert (await world.rt.client.wait(world.run_id, 10)).status == "cancelled"
    yaml = b"name: other\nversion: '1'\nsteps: [{id: a, type: noop}]\n"
    registered = await world.api.post(
        "/definitions", content=yaml, headers={"content-type": "text/yaml"}
    )
    assert registered.status_code == 201, registered.text
    # YAML only where a route takes it
    refused = await world.api.post(
        "/runs", content=b"workflow: other\n", headers={"content-type": "application/yaml"}
    )
    assert refused.status_code == 415
    assert "takes application/json," in refused.json()["detail"]


async def test_a_request_for_another_host_is_refused_and_changes_nothing(world: World) -> None:
    before = await world.state()
    for host in ("evil.example", "evil.example:8080", "localhost.evil.example", "127.0.0.2"):
        headers = {"host": host, "content-type": "application/json"}
        for method, path, body in (
            ("GET", "/runs", None),
            ("POST", "/definitions", ATTACK),
            ("POST", "/runs/{run_id}/cancel", {}),
        ):
            response = await world.api.request(method, world.url(path), json=body, headers=headers)
            assert response.status_code == 421, (host, path, response.text)
            problem = response.json()
            assert problem["type"] == "urn:tideflow:problem:host-not-allowed"
            assert "--allowed-host" in problem["detail"]
            assert "run_id" not in response.text and "runs" not in problem
    assert await world.state() == before
    for host in ("localhost:8080", "LOCALHOST", "127.0.0.1:1234", "[::1]:8080", "[::1]"):
        response = await world.api.get("/runs", headers={"host": host})
        assert response.status_code == 200, (host, response.text)
        assert [r["run_id"] for r in response.json()["runs"]] == [world.run_id]
