"""The /schedules routes through `HttpClient` against a real uvicorn over an embedded
runtime with real API tokens: list, get, pause, resume, trigger, delete, and the roles
(viewer reads, operator steers, admin deletes)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest

from tideflow import errors
from tideflow.api.auth import issue_token
from tideflow.api.serving import address_of, http_api, listen
from tideflow.lifecycle import Stop
from tideflow.model.tokens import Role
from tideflow.remote_http import HttpClient
from tideflow.runtime.runtime import Runtime

NIGHTLY = {
    "name": "nightly",
    "version": "1",
    "schedule": [
        {"id": "early", "cron": "0 2 * * *", "timezone": "Europe/Paris", "input": {"n": 1}},
        {"id": "often", "every": "15m"},
    ],
    "steps": [{"id": "a", "type": "noop"}],
}


@dataclass
class Served:
    rt: Runtime
    url: str
    tokens: dict[Role, str]


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    sock = listen("127.0.0.1", 0)
    async with Runtime(workers=1) as rt:
        tokens = {
            role: (await issue_token(rt.client.store, name=role, role=role, now=0.0)).value
            for role in Role
        }
        await rt.client.register(NIGHTLY)
        async with http_api(rt.client, Stop(), sock):
            yield Served(rt, address_of(sock), tokens)


async def test_schedules_over_http(served: Served) -> None:
    async with HttpClient(served.url, token=served.tokens[Role.OPERATOR]) as c:
        rows = await c.schedules()
        assert [(r["workflow"], r["id"]) for r in rows] == [
            ("nightly", "early"),
            ("nightly", "often"),
        ]
        early = rows[0]
        assert early["spec"]["cron"] == "0 2 * * *" and early["next_fire_at"].endswith("Z")
        assert await c.schedules("other") == []

        assert await c.pause_schedule("nightly", "often")
        assert not await c.pause_schedule("nightly", "often")
        often = (await c.schedules())[1]
        assert often["paused"] and often["next_fire_at"] is None
        assert await c.resume_schedule("nightly", "often")

        run_id = await c.trigger_schedule("nightly", "early")
        result = await c.wait(run_id, timeout=30)
        assert result.status == "succeeded"
        state = await served.rt.state(run_id)
        assert state.input["n"] == 1 and state.input["scheduled_at"].endswith("Z")

        with pytest.raises(errors.NotFound, match="no schedule 'nope' of workflow 'nightly'"):
            await c.pause_schedule("nightly", "nope")
        with pytest.raises(errors.Forbidden):
            await c.delete_schedule("nightly", "often")  # an operator may not delete

    async with HttpClient(served.url, token=served.tokens[Role.ADMIN]) as admin:
        made = await admin.create_schedule("nightly", {"id": "late", "cron": "0 23 * * *"})
        assert made["origin"] == "client" and made["version"] is None
        with pytest.raises(errors.DefinitionConflict, match="has a schedule 'late' already"):
            await admin.create_schedule("nightly", {"id": "late", "every": "1h"})
        with pytest.raises(errors.DefinitionError, match="invalid cron expression"):
            await admin.create_schedule("nightly", {"id": "bad", "cron": "0 25 * * *"})
        with pytest.raises(errors.NotFound):
            await admin.create_schedule("nope", {"id": "x", "every": "1h"})
        await admin.delete_schedule("nightly", "late")
        await admin.delete_schedule("nightly", "often")
        assert [r["id"] for r in await admin.schedules()] == ["early"]
        with pytest.raises(errors.NotFound):
            await admin.delete_schedule("nightly", "often")


async def test_a_viewer_reads_schedules_and_steers_none(served: Served) -> None:
    async with httpx.AsyncClient(base_url=served.url) as http:
        headers = {
            "authorization": f"Bearer {served.tokens[Role.VIEWER]}",
            "content-type": "application/json",
        }
        one = await http.get("/schedules/nightly/early", headers=headers)
        assert one.status_code == 200 and one.json()["id"] == "early"
        pause = await http.post("/schedules/nightly/early/pause", headers=headers)
        assert pause.status_code == 403
        assert "needs role operator" in pause.json()["detail"]
    assert not (await served.rt.client.schedule("nightly", "early")).paused
