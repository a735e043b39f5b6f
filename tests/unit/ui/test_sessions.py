"""Browser sessions: the one-time link of `tideflow ui` (works once, guards the API too),
API-token logins on a server (the token's role, revocation ends the session), the
header that a cookie alone cannot replace, and the page's own headers."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from tideflow.api import create_app
from tideflow.api.auth import issue_token
from tideflow.model.tokens import Role
from tideflow.runtime.runtime import Runtime
from tideflow.store.backends.memory import MemoryStore
from tideflow.ui.sessions import COOKIE, MAX_PER_TOKEN, Sessions

HELLO = {"name": "hello", "version": "1", "steps": [{"id": "a", "type": "noop"}]}
UI = {"X-Tideflow-UI": "1"}


@pytest.fixture
async def rt() -> AsyncIterator[Runtime]:
    async with Runtime(workers=1) as runtime:
        await runtime.register(HELLO)
        yield runtime


def client_of(app: object) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
    return httpx.AsyncClient(transport=transport, base_url="http://localhost")


async def test_the_one_time_link_opens_one_session_and_nothing_else_gets_in(rt: Runtime) -> None:
    sessions = Sessions.local()
    code = sessions.code
    assert code is not None
    async with client_of(create_app(rt.client, auth=False, sessions=sessions)) as api:
        assert (await api.get("/runs")).status_code == 401  # no session: not even reads
        assert (await api.get("/ui/login", params={"code": "wrong"})).status_code == 401
        opened = await api.get("/ui/login", params={"code": code})
        assert (opened.status_code, opened.headers["location"]) == (303, "/ui/")
        cookie = opened.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie and "path=/" in cookie
        assert (await api.get("/ui/login", params={"code": code})).status_code == 401  # spent
        assert (await api.get("/runs")).status_code == 200  # the cookie the link set
        me = (await api.get("/ui/whoami")).json()
        assert (me["role"], me["login"]) == ("admin", "link")
        without = await api.post("/runs", json={"workflow": "hello"})
        assert without.status_code == 401  # a cookie alone cannot act: the UI's header too
        assert (await api.post("/runs", json={"workflow": "hello"}, headers=UI)).status_code == 201
        logout = await api.post("/ui/logout", headers={"content-type": "application/json"})
        assert logout.status_code == 204
        api.cookies.clear()
        assert (await api.get("/runs")).status_code == 401
        assert (await api.get("/ui/whoami")).json()["login"] == "link"


async def test_a_token_login_has_the_tokens_role_until_it_is_revoked(rt: Runtime) -> None:
    viewer = await issue_token(rt.client.store, name="eyes", role=Role.VIEWER, now=0.0)
    async with client_of(create_app(rt.client)) as api:
        body = {"token": viewer.value}
        assert (await api.post("/ui/login", json=body)).status_code == 401  # no UI header
        bad = await api.post("/ui/login", json={"token": "tf_nope"}, headers=UI)
        assert bad.status_code == 401 and "not a live API token" in bad.json()["detail"]
        assert COOKIE not in api.cookies
        logged = await api.post("/ui/login", json=body, headers=UI)
        assert logged.status_code == 200
        assert (logged.json()["role"], logged.json()["actions"]) == ("viewer", ["read"])
        assert (await api.get("/runs")).status_code == 200
        run_id = await rt.start_run("hello")
        refused = await api.post(f"/runs/{run_id}/cancel", json={}, headers=UI)
        assert refused.status_code == 403 and "needs role operator" in refused.json()["detail"]
        await rt.client.store.revoke_token(viewer.token.token_id, 1.0)
        assert (await api.get("/runs")).status_code == 401
        assert (await api.get("/ui/whoami")).status_code == 401


async def test_the_page_and_its_assets_are_served_with_a_strict_policy(rt: Runtime) -> None:
    async with client_of(create_app(rt.client, auth=False)) as api:
        page = await api.get("/ui/")
        assert page.status_code == 200 and '<script type="module"' in page.text
        policy = page.headers["content-security-policy"]
        assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
        script = await api.get("/ui/static/app.js")
        assert script.status_code == 200
        assert "javascript" in script.headers["content-type"]
        assert "new EventSource" in script.text and "setInterval" not in script.text
        assert (await api.get("/ui/static/nope.js")).status_code == 404
        me = (await api.get("/ui/whoami")).json()  # --no-auth: nobody to log in
        assert (me["login"], me["role"]) == ("none", "admin")


async def test_sessions_are_bounded_the_least_recently_used_goes(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tideflow.ui.sessions as module

    monkeypatch.setattr(module, "MAX_SESSIONS", 2)
    token = await issue_token(rt.client.store, name="many", role=Role.VIEWER, now=0.0)
    sessions = Sessions(store=rt.client.store)
    first, _ = await sessions.login(token.value)
    second, _ = await sessions.login(token.value)
    assert await sessions.principal(first) is not None  # used now: second is the oldest
    third, _ = await sessions.login(token.value)
    assert await sessions.principal(second) is None
    assert await sessions.principal(first) is not None
    assert await sessions.principal(third) is not None


async def test_ten_thousand_logins_with_one_token_leave_another_tokens_session_alive() -> None:
    store = MemoryStore()
    await store.open()
    viewer = await issue_token(store, name="flood", role=Role.VIEWER, now=0.0)
    other = await issue_token(store, name="ann", role=Role.OPERATOR, now=0.0)
    sessions = Sessions(store=store)
    kept, _ = await sessions.login(other.value)
    flood = [(await sessions.login(viewer.value))[0] for _ in range(10_000)]
    ann = await sessions.principal(kept)
    assert ann is not None and ann.name == "ann"
    alive = [s for s in flood if await sessions.principal(s) is not None]
    assert alive == flood[-MAX_PER_TOKEN:]  # the flood ended only its own sessions
    await store.close()


async def test_a_tokens_own_least_recently_used_session_goes_past_its_cap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import tideflow.ui.sessions as module

    monkeypatch.setattr(module, "MAX_PER_TOKEN", 3)
    store = MemoryStore()
    await store.open()
    token = await issue_token(store, name="many", role=Role.VIEWER, now=0.0)
    sessions = Sessions(store=store)
    first, second, third = [(await sessions.login(token.value))[0] for _ in range(3)]
    assert await sessions.principal(first) is not None  # used now: second is its oldest
    fourth, _ = await sessions.login(token.value)
    assert await sessions.principal(second) is None
    assert all([await sessions.principal(s) is not None for s in (first, third, fourth)])
    await store.close()


async def test_when_every_slot_is_taken_the_heaviest_holder_pays(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import tideflow.ui.sessions as module

    monkeypatch.setattr(module, "MAX_SESSIONS", 4)
    store = MemoryStore()
    await store.open()
    a, b, c, d = [await issue_token(store, name=name, role=Role.VIEWER, now=0.0) for name in "abcd"]
    sessions = Sessions(store=store)
    b_only, _ = await sessions.login(b.value)  # the least recently used of all
    a_old, _ = await sessions.login(a.value)
    a_new, _ = await sessions.login(a.value)
    c_only, _ = await sessions.login(c.value)
    d_only, _ = await sessions.login(d.value)  # full: a holds the most, its oldest goes
    assert await sessions.principal(a_old) is None
    for kept in (b_only, a_new, c_only, d_only):
        assert await sessions.principal(kept) is not None
    await store.close()
