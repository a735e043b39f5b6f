"""The authorisation matrix: every route of the app against no token, a malformed one, an
unknown id, a wrong secret, a revoked token and each role. The routes are taken from
``app.routes``, so a route added without a row here fails the first test; what a role
may do is what ``PERMISSIONS`` says, and a refused request changes nothing."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from starlette.routing import BaseRoute, Mount

from tideflow.api import create_app
from tideflow.api.auth import issue_token
from tideflow.api.auth_http import action_of
from tideflow.api.problems import UNAUTHENTICATED_DETAIL
from tideflow.model.tokens import PERMISSIONS, Action, Role
from tideflow.observability.metrics import EngineMetrics
from tideflow.runtime.runtime import Runtime
from tideflow.testing.waiting import step_is, wait_until

WAITING = {
    "name": "waiting",
    "version": "1",
    "input": {"type": "object", "required": ["order_id"]},
    "schedule": {"every": "1h", "input": {"order_id": "scheduled"}},
    "steps": [
        {"id": "ask", "type": "wait", "signal": "go"},
        {"id": "after", "type": "noop", "depends_on": ["ask"]},
    ],
}
OTHER = {"name": "other", "version": "1", "steps": [{"id": "a", "type": "noop"}]}

ROUTES: dict[tuple[str, str], Action | None] = {
    ("GET", "/health"): None,
    ("GET", "/ready"): None,
    ("GET", "/openapi.json"): None,
    ("GET", "/docs"): None,
    ("GET", "/docs/oauth2-redirect"): None,
    ("GET", "/redoc"): None,
    ("GET", "/queues"): Action.READ,
    ("GET", "/workers"): Action.READ,
    ("GET", "/metrics"): Action.READ,  # a scraper sends a viewer token (docs/observability.md)
    ("POST", "/definitions/validate"): Action.READ,
    ("POST", "/definitions"): Action.DEFINITIONS,
    ("GET", "/definitions"): Action.READ,
    ("GET", "/definitions/{name}/{version}"): Action.READ,
    ("POST", "/definitions/{name}/{version}/activate"): Action.DEFINITIONS,
    ("POST", "/definitions/{name}/{version}/deactivate"): Action.DEFINITIONS,
    ("POST", "/runs"): Action.START,
    ("GET", "/runs"): Action.READ,
    ("GET", "/runs/{run_id}"): Action.READ,
    ("GET", "/runs/{run_id}/history"): Action.READ,
    ("GET", "/runs/{run_id}/why"): Action.READ,
    ("POST", "/runs/{run_id}/cancel"): Action.CANCEL,
    ("POST", "/runs/{run_id}/retry"): Action.RETRY,
    ("POST", "/runs/{run_id}/signals"): Action.SIGNAL,
    ("GET", "/schedules"): Action.READ,
    ("POST", "/schedules"): Action.DEFINITIONS,
    ("GET", "/schedules/{workflow}/{schedule_id}"): Action.READ,
    ("POST", "/schedules/{workflow}/{schedule_id}/pause"): Action.SCHEDULES,
    ("POST", "/schedules/{workflow}/{schedule_id}/resume"): Action.SCHEDULES,
    ("POST", "/schedules/{workflow}/{schedule_id}/trigger"): Action.SCHEDULES,
    ("DELETE", "/schedules/{workflow}/{schedule_id}"): Action.DEFINITIONS,
    ("GET", "/runs/{run_id}/state"): Action.READ,
    ("GET", "/runs/{run_id}/graph"): Action.READ,
    ("GET", "/runs/{run_id}/steps/{step_id}"): Action.READ,
    ("GET", "/runs/{run_id}/attempts"): Action.READ,
    ("GET", "/runs/{run_id}/logs"): Action.READ,
    ("GET", "/definitions/{name}/{version}/graph"): Action.READ,
    ("GET", "/streams/runs/{run_id}"): Action.READ,
    ("GET", "/streams/runs"): Action.READ,
    ("GET", "/events/unmatched"): Action.READ,
    ("POST", "/events/unmatched/{key}/replay"): Action.SIGNAL,
}
"""Every route and the action it needs (None: open to anyone)."""
BODIES: dict[tuple[str, str], Any] = {
    ("POST", "/definitions/validate"): WAITING,
    ("POST", "/definitions"): OTHER,
    ("POST", "/runs"): {"workflow": "waiting", "input": {"order_id": "m1"}},
    ("POST", "/runs/{run_id}/cancel"): {"reason": "matrix"},
    ("POST", "/runs/{run_id}/retry"): {"reason": "matrix"},
    ("POST", "/runs/{run_id}/signals"): {"name": "go", "payload": {"ok": True}},
    ("POST", "/schedules"): {
        "workflow": "waiting",
        "schedule": {"id": "extra", "every": "1h", "input": {"order_id": "x"}},
    },
}
QUERIES: dict[tuple[str, str], dict[str, Any]] = {
    ("GET", "/streams/runs/{run_id}"): {"max_events": 1},  # the run waits: the stream would not end
    ("GET", "/streams/runs"): {"max_events": 1},
}
GATEWAY = {("POST", "/events")}
REFUSED = ["no header", "malformed", "unknown id", "wrong secret", "revoked"]


def routes_of(app: FastAPI) -> dict[tuple[str, str], Any]:
    return {
        (method, route.path): route
        for route in app.routes
        for method in getattr(route, "methods", None) or ()
        if method != "HEAD"
    }


SECURITY = Path(__file__).resolve().parents[3] / "docs" / "security.md"
ROUTE_IN_DOCS = re.compile(r"`(GET|POST|PUT|PATCH|DELETE) (/[^`]*)`")


def every_route_of(routes: list[BaseRoute], prefix: str = "") -> dict[tuple[str, str], Any]:
    """(method, path) of every route, those of mounted apps (the web UI) included: a mount
    with no routes of its own (static files) is ``GET <mount>/{path}``."""
    found: dict[tuple[str, str], Any] = {}
    for route in routes:
        if isinstance(route, Mount):
            inner = route.routes
            if inner:
                found |= every_route_of(inner, prefix + route.path)
            else:
                found[("GET", f"{prefix}{route.path}/{{path}}")] = route
            continue
        for method in getattr(route, "methods", None) or ():
            if method != "HEAD":
                found[(method, prefix + getattr(route, "path", ""))] = route
    return found


def security_table() -> dict[tuple[str, str], list[str]]:
    """The rows of docs/security.md's "Roles per route" table, by each route they name:
    the cells after the first (action, viewer, operator, admin)."""
    text = SECURITY.read_text(encoding="utf-8")
    section = text[text.index("### Roles per route") :]
    section = section[: section.index("\n## ")]
    rows: dict[tuple[str, str], list[str]] = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) != 5:
            continue
        for method, path in ROUTE_IN_DOCS.findall(cells[0]):
            assert (method, path) not in rows, f"{method} {path} has two rows"
            rows[(method, path)] = cells[1:]
    return rows


@dataclass
class World:
    rt: Runtime
    api: httpx.AsyncClient
    run_id: str
    headers: dict[str, dict[str, str]]

    async def call(self, key: tuple[str, str], credentials: str) -> httpx.Response:
        method, path = key
        url = path.format(
            run_id=self.run_id,
            name="waiting",
            version="1",
            step_id="ask",
            workflow="waiting",
            schedule_id="default",
            key="ce:none",
        )
        body, params = BODIES.get(key), QUERIES.get(key)
        headers = dict(self.headers[credentials])
        if method != "GET":  # with a body or without (api/browsers.py)
            headers["content-type"] = "application/json"
        return await self.api.request(method, url, json=body, params=params, headers=headers)

    async def state(self) -> tuple[object, ...]:
        """What a request could change: runs, their history, definitions, tokens."""
        runs = (await self.rt.client.list(limit=1000)).runs
        histories = [len(await self.rt.client.history(r.run_id)) for r in runs]
        definitions = await self.rt.client.definitions()
        tokens = [(t.token_id, t.revoked_at) for t in await self.rt.store.list_tokens()]
        schedules = [(s.key, s.paused, s.deleted) for s in await self.rt.store.list_schedules()]
        return (
            schedules,
            [(r.run_id, r.status) for r in runs],
            histories,
            [(d.name, d.version, d.active) for d in definitions],
            tokens,
        )


def bearer(value: str) -> dict[str, str]:
    return {"authorization": f"Bearer {value}"}


@pytest.fixture
async def world() -> AsyncIterator[World]:
    async with Runtime(workers=1) as rt:
        store = rt.client.store
        roles = {
            role.value: bearer((await issue_token(store, name=role, role=role, now=0.0)).value)
            for role in Role
        }
        revoked = await issue_token(store, name="gone", role=Role.ADMIN, now=0.0)
        await store.revoke_token(revoked.token.token_id, 1.0)
        admin_id = roles["admin"]["authorization"].split("_")[1]
        headers = {
            "no header": {},
            "malformed": {"authorization": "Bearer not-a-token"},
            "unknown id": bearer(f"tf_{'0' * 16}_{'A' * 43}"),
            "wrong secret": bearer(f"tf_{admin_id}_{'A' * 43}"),
            "revoked": bearer(revoked.value),
            **roles,
        }
        await rt.client.register(WAITING)
        run_id, _ = await rt.client.launch("waiting", {"order_id": "o1"})
        await wait_until(rt, run_id, step_is("ask", "waiting"))
        metrics = EngineMetrics().attach(rt)
        transport = httpx.ASGITransport(app=create_app(rt.client, metrics=metrics))
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as api:
            yield World(rt, api, run_id, headers)


async def test_every_route_of_the_app_has_its_row_and_its_action() -> None:
    async with Runtime(workers=0) as rt:
        routes = routes_of(create_app(rt.client))
    # POST /events authenticates each event's source (or an API token that may signal)
    # itself: tests/unit/api/test_event_refusals.py
    assert set(routes) >= GATEWAY
    routes = {key: route for key, route in routes.items() if key not in GATEWAY}
    assert set(routes) == set(ROUTES), "give each route its row in ROUTES (and BODIES)"
    assert {key: action_of(route) for key, route in routes.items()} == ROUTES
    assert set(BODIES) <= set(ROUTES)


async def test_security_md_has_one_row_per_route_and_its_action() -> None:
    async with Runtime(workers=0) as rt:
        routes = every_route_of(create_app(rt.client, metrics=EngineMetrics()).routes)
    rows = security_table()
    assert sorted(set(routes) - set(rows)) == [], "give each route its row in docs/security.md"
    assert sorted(set(rows) - set(routes)) == [], "docs/security.md names a route that is gone"
    for key, (action_cell, *roles) in rows.items():
        action = action_of(routes[key])
        written = re.match(r"`([a-z]+)`", action_cell)
        if action is None:  # open, or checks its own credentials (the gateway, the UI)
            assert written is None, (key, action_cell)
            continue
        assert written is not None and written.group(1) == action.value, (key, action_cell)
        allowed = ["yes" if action in PERMISSIONS[role] else "403" for role in Role]
        assert roles == allowed, (key, roles)


@pytest.mark.parametrize("key", list(ROUTES), ids=" ".join)
async def test_each_credential_is_answered_as_permissions_decide(
    world: World, key: tuple[str, str]
) -> None:
    action = ROUTES[key]
    refused: list[dict[str, Any]] = []
    for credentials in REFUSED:
        before = await world.state()
        response = await world.call(key, credentials)
        if action is None:
            assert response.status_code == 200, (credentials, response.text)
            continue
        assert response.status_code == 401, (credentials, response.text)
        assert response.headers["content-type"] == "application/problem+json"
        assert response.headers["www-authenticate"].startswith('Bearer realm="tideflow"')
        assert await world.state() == before, credentials
        refused.append(response.json())
    if action is not None:  # one body for every reason: nothing tells which ids exist
        assert all(body == refused[0] for body in refused), refused
        assert refused[0]["detail"] == UNAUTHENTICATED_DETAIL
    for role in Role:  # lowest first: every refusal comes before a request that changes state
        before = await world.state()
        response = await world.call(key, role.value)
        if action is None or action in PERMISSIONS[role]:
            assert response.status_code not in (401, 403), (role, response.text)
            assert response.status_code < 500, (role, response.text)
        else:
            assert response.status_code == 403, (role, response.text)
            body = response.json()
            assert body["type"] == "urn:tideflow:problem:forbidden"
            assert f"needs role {Role.lowest_allowing(action)}" in body["detail"]
            assert await world.state() == before, role


async def test_a_viewer_never_runs_work_and_an_operator_never_registers(world: World) -> None:
    runs_work = [k for k, a in ROUTES.items() if a in {Action.START, Action.CANCEL,
                                                          Action.SIGNAL, Action.RETRY}]  # fmt: skip
    registers = [k for k, a in ROUTES.items() if a is Action.DEFINITIONS]
    assert len(runs_work) == 5 and len(registers) == 5
    before = await world.state()
    for key in runs_work:
        assert (await world.call(key, "viewer")).status_code == 403, key
    for key in registers:
        assert (await world.call(key, "operator")).status_code == 403, key
    assert await world.state() == before
    # and the state is the one the run was in: still waiting, no run started
    (run,) = (await world.rt.client.list()).runs
    assert (run.run_id, run.status) == (world.run_id, "running")
    assert [d.name for d in await world.rt.client.definitions()] == ["waiting"]


async def test_an_app_never_told_how_to_check_tokens_lets_nobody_in() -> None:
    from tideflow.api.auth_http import allow
    from tideflow.api.problems import install

    app = FastAPI()
    install(app, 1024)

    @app.get("/guarded", dependencies=[allow(Action.READ)])
    async def guarded() -> dict[str, str]:
        return {"in": "yes"}

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as api:
        response = await api.get("/guarded")
    assert response.status_code == 500
    assert "yes" not in response.text
