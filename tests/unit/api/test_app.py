"""The REST API over an embedded runtime's client, called with httpx through ASGI: every
route, its happy path and its errors, all in the one problem shape. Requests carry an
admin token (who may do what is tests/unit/api/test_authorisation.py)."""

from __future__ import annotations

import asyncio
import os
import textwrap
import time
from collections.abc import AsyncIterator, Iterator
from datetime import datetime
from typing import Any

import httpx
import pytest

from tideflow.api import create_app
from tideflow.api.auth import issue_token
from tideflow.model.tokens import Role
from tideflow.runtime.runtime import Runtime
from tideflow.testing.waiting import step_is, wait_until
from tideflow.worker.executors.functions import register, unregister

WAITING = textwrap.dedent(
    """
    name: waiting
    version: "1"
    input:
      type: object
      required: [order_id]
      properties: {order_id: {type: string}}
    steps:
      - {id: ask, type: wait, signal: go}
      - {id: after, type: noop, depends_on: [ask]}
    output: "{{ steps.ask.output }}"
    """
)
BREAKING = {
    "name": "breaking",
    "version": "1",
    "steps": [{"id": "boom", "type": "python", "function": "api_test.boom"}],
}
MAX_BODY = 4096
JSON_TYPE = {"content-type": "application/json"}
"""What a request that changes something sends without a body (api/browsers.py)."""


@pytest.fixture(autouse=True)
def boom() -> Iterator[None]:
    @register("api_test.boom")
    def failing() -> None:
        raise ValueError("broken on purpose")

    yield
    unregister("api_test.boom")


@pytest.fixture
async def rt() -> AsyncIterator[Runtime]:
    async with Runtime(workers=2) as runtime:
        yield runtime


@pytest.fixture
async def api(rt: Runtime) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(rt.client, max_body=MAX_BODY)
    admin = await issue_token(rt.client.store, name="test", role=Role.ADMIN, now=0.0)
    transport = httpx.ASGITransport(app=app)
    headers = {"authorization": f"Bearer {admin.value}"}
    async with httpx.AsyncClient(
        transport=transport, base_url="http://api", headers=headers
    ) as client:
        yield client


def problem(response: httpx.Response, status: int) -> dict[str, object]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body = response.json()
    assert body["status"] == status
    assert str(body["type"]).startswith("urn:tideflow:problem:")
    assert body["title"] and body["instance"] == response.request.url.path
    assert isinstance(body, dict)
    return body


def fields(body: dict[str, object]) -> list[str]:
    errors = body["errors"]
    assert isinstance(errors, list)
    return [e["field"] for e in errors]


async def register_waiting(api: httpx.AsyncClient) -> None:
    created = await api.post(
        "/definitions", content=WAITING, headers={"content-type": "application/yaml"}
    )
    assert created.status_code == 201, created.text


async def test_health_and_ready(api: httpx.AsyncClient) -> None:
    assert (await api.get("/health")).json() == {"status": "ok"}
    assert (await api.get("/ready")).json() == {"status": "ready"}


async def test_ready_is_503_when_the_store_fails(rt: Runtime, api: httpx.AsyncClient) -> None:
    from tideflow.errors import StoreUnavailable

    async def down(*args: object, **kwargs: object) -> None:
        raise StoreUnavailable("the store is down")

    rt.store.list_runs = down  # type: ignore[method-assign]
    body = problem(await api.get("/ready"), 503)
    assert body["type"] == "urn:tideflow:problem:store-unavailable"


async def test_validate_compiles_without_registering(api: httpx.AsyncClient) -> None:
    response = await api.post(
        "/definitions/validate", content=WAITING, headers={"content-type": "application/yaml"}
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["name"], body["version"], body["steps"]) == ("waiting", "1", ["ask", "after"])
    assert len(body["hash"]) >= 12
    assert (await api.get("/definitions")).json() == {"definitions": []}
    as_json = await api.post("/definitions/validate", json=BREAKING)
    assert as_json.json()["name"] == "breaking"


async def test_validate_lists_every_definition_error_with_its_path(
    api: httpx.AsyncClient,
) -> None:
    broken = {
        "name": "broken",
        "version": "1",
        "steps": [{"id": "a", "type": "nope"}, {"id": "b", "type": "noop", "depends_on": ["z"]}],
    }
    body = problem(await api.post("/definitions/validate", json=broken), 422)
    assert body["type"] == "urn:tideflow:problem:definition-invalid"
    errors = body["errors"]
    assert isinstance(errors, list) and len(errors) >= 2
    assert any(e["field"].startswith("body.steps[0]") for e in errors), errors
    assert any("z" in e["message"] for e in errors), errors
    yaml_body = problem(
        await api.post(
            "/definitions/validate",
            content="name: x\nsteps: [\n",
            headers={"content-type": "application/yaml"},
        ),
        422,
    )
    assert fields(yaml_body) == ["body"] and yaml_body["errors"][0]["line"]  # type: ignore[index]


async def test_a_one_line_yaml_body_is_text_never_a_file_on_the_server(
    api: httpx.AsyncClient, tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pathlib import Path

    assert isinstance(tmp_path, Path)
    (tmp_path / "secret.yaml").write_text(WAITING)
    monkeypatch.chdir(tmp_path)
    response = await api.post(
        "/definitions/validate", content="secret.yaml", headers={"content-type": "text/yaml"}
    )
    problem(response, 422)


async def test_a_definition_body_that_is_not_an_object(api: httpx.AsyncClient) -> None:
    assert fields(problem(await api.post("/definitions/validate", json=[1, 2]), 422)) == ["body"]
    malformed = await api.post(
        "/definitions", content=b"{nope", headers={"content-type": "application/json"}
    )
    assert fields(problem(malformed, 400)) == ["body"]


async def test_register_list_and_get_definitions(api: httpx.AsyncClient) -> None:
    await register_waiting(api)
    again = await api.post(
        "/definitions", content=WAITING, headers={"content-type": "application/yaml"}
    )
    assert again.status_code == 201
    listed = (await api.get("/definitions")).json()["definitions"]
    assert [(d["name"], d["version"]) for d in listed] == [("waiting", "1")]
    assert (await api.get("/definitions", params={"name": "other"})).json() == {"definitions": []}
    shown = (await api.get("/definitions/waiting/1")).json()
    assert shown["name"] == "waiting" and shown["source"]["name"] == "waiting"
    assert shown["hash"] == listed[0]["hash"]
    problem(await api.get("/definitions/waiting/9"), 404)
    other = WAITING.replace("{id: after, type: noop, depends_on: [ask]}", "{id: x, type: noop}")
    conflict = await api.post(
        "/definitions", content=other, headers={"content-type": "application/yaml"}
    )
    assert problem(conflict, 409)["type"] == "urn:tideflow:problem:definition-conflict"


async def test_a_deactivated_version_starts_no_run_until_it_is_activated(
    api: httpx.AsyncClient,
) -> None:
    await register_waiting(api)
    off = await api.post("/definitions/waiting/1/deactivate", headers=JSON_TYPE)
    assert off.status_code == 200, off.text
    assert off.json() == {"name": "waiting", "version": "1", "active": False, "changed": True}
    assert (await api.get("/definitions")).json()["definitions"][0]["active"] is False
    refused = problem(await api.post("/runs", json={"workflow": "waiting", "version": "1"}), 409)
    assert refused["type"] == "urn:tideflow:problem:definition-inactive"
    assert "tideflow definitions activate waiting 1" in refused["detail"]
    by_name = problem(await api.post("/runs", json={"workflow": "waiting"}), 409)
    assert "every version of 'waiting' is deactivated" in by_name["detail"]
    assert (await api.get("/runs")).json()["runs"] == []
    assert (await api.get("/definitions/waiting/1")).status_code == 200  # still readable
    on = await api.post("/definitions/waiting/1/activate", headers=JSON_TYPE)
    assert on.json()["changed"] is True
    assert (await api.post("/definitions/waiting/1/activate", headers=JSON_TYPE)).json()[
        "changed"
    ] is False
    started = await api.post("/runs", json={"workflow": "waiting", "input": {"order_id": "A1"}})
    assert started.status_code == 201, started.text
    problem(await api.post("/definitions/waiting/9/deactivate", headers=JSON_TYPE), 404)


async def test_a_run_started_with_a_priority_keeps_it(rt: Runtime, api: httpx.AsyncClient) -> None:
    await register_waiting(api)
    body = {"workflow": "waiting", "input": {"order_id": "A1"}, "priority": "high"}
    started = await api.post("/runs", json=body)
    assert started.status_code == 201, started.text
    state = await wait_until(rt, started.json()["run_id"], step_is("ask", "waiting"))
    assert state.priority == "high"
    refused = problem(await api.post("/runs", json={**body, "priority": "urgent"}), 422)
    assert "priority" in str(refused)


async def test_start_a_run_signal_it_and_read_it(rt: Runtime, api: httpx.AsyncClient) -> None:
    await register_waiting(api)
    started = await api.post("/runs", json={"workflow": "waiting", "input": {"order_id": "A1"}})
    assert started.status_code == 201, started.text
    run_id = started.json()["run_id"]
    assert started.json()["created"] is True
    assert started.headers["location"] == f"/runs/{run_id}"
    await wait_until(rt, run_id, step_is("ask", "waiting"))
    run = (await api.get(f"/runs/{run_id}")).json()
    assert (run["workflow"], run["status"]) == ("waiting", "running")
    assert run["steps"]["ask"]["status"] == "waiting"
    sent = await api.post(
        f"/runs/{run_id}/signals", json={"name": "go", "payload": {"ok": 1}, "signal_id": "s1"}
    )
    assert sent.status_code == 202, sent.text
    assert sent.json() == {"run_id": run_id, "name": "go", "signal_id": "s1", "status": "delivered"}
    result = await rt.client.wait(run_id, 10)
    assert result.output == {"ok": 1}
    late = await api.post(f"/runs/{run_id}/signals", json={"name": "go", "payload": {"ok": 2}})
    assert late.status_code == 202, late.text
    assert late.json()["status"] == "unmatched"
    assert (await rt.client.wait(run_id, 10)).output == {"ok": 1}
    history = (await api.get(f"/runs/{run_id}/history")).json()
    kinds = [e["kind"] for e in history["entries"]]
    assert history["run_id"] == run_id
    assert kinds[0] == "run_started" and "signal_received" in kinds


async def test_a_reused_idempotency_key_answers_200_with_the_same_run(
    api: httpx.AsyncClient,
) -> None:
    await register_waiting(api)
    body = {"workflow": "waiting", "input": {"order_id": "A1"}, "idempotency_key": "k1"}
    first = await api.post("/runs", json=body)
    second = await api.post("/runs", json=body)
    assert (first.status_code, second.status_code) == (201, 200)
    assert second.json() == {"run_id": first.json()["run_id"], "created": False}
    runs = (await api.get("/runs")).json()["runs"]
    assert [r["run_id"] for r in runs] == [first.json()["run_id"]]


async def test_bad_run_input_is_422_naming_the_field(api: httpx.AsyncClient) -> None:
    await register_waiting(api)
    response = await api.post("/runs", json={"workflow": "waiting", "input": {"order_id": 7}})
    body = problem(response, 422)
    assert body["type"] == "urn:tideflow:problem:input-invalid"
    assert fields(body) == ["body.input.order_id"]
    missing = problem(await api.post("/runs", json={"workflow": "waiting", "input": {}}), 422)
    assert fields(missing) == ["body.input"]
    assert "order_id" in str(missing["errors"])


async def test_a_request_of_the_wrong_shape_is_422_naming_each_field(
    api: httpx.AsyncClient,
) -> None:
    body = problem(await api.post("/runs", json={"input": 1, "extra": True}), 422)
    assert set(fields(body)) == {"body.workflow", "body.extra"}
    assert fields(problem(await api.get("/runs", params={"limit": 0}), 422)) == ["query.limit"]
    assert fields(problem(await api.get("/runs", params={"status": "asleep"}), 422)) == [
        "query.status"
    ]
    assert fields(problem(await api.get("/runs", params={"cursor": "junk"}), 422)) == [
        "query.cursor"
    ]
    signal = await api.post("/runs/r1/signals", json={"payload": 1})
    assert fields(problem(signal, 422)) == ["body.name"]


async def test_malformed_json_is_400(api: httpx.AsyncClient) -> None:
    response = await api.post(
        "/runs", content=b'{"workflow": ', headers={"content-type": "application/json"}
    )
    body = problem(response, 400)
    assert body["type"] == "urn:tideflow:problem:malformed-json"
    assert fields(body) == ["body"]


async def test_a_body_too_deep_to_parse_is_400_naming_the_body(api: httpx.AsyncClient) -> None:
    deep = b'{"workflow": "w", "input": ' + b"[" * 2000 + b"]" * 2000 + b"}"
    response = await api.post("/runs", content=deep, headers={"content-type": "application/json"})
    assert fields(problem(response, 400)) == ["body"]


async def test_an_oversized_body_is_413_before_it_is_parsed(api: httpx.AsyncClient) -> None:
    big = {"workflow": "waiting", "input": {"order_id": "x" * MAX_BODY}}
    body = problem(await api.post("/runs", json=big), 413)
    assert str(MAX_BODY) in str(body["detail"])

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: chunked
        yield b'{"workflow": "waiting", "input": "'
        for _ in range(8):
            yield b"x" * 1024
        yield b'"}'

    streamed = await api.post(
        "/runs", content=chunks(), headers={"content-type": "application/json"}
    )
    assert "content-length" not in streamed.request.headers
    problem(streamed, 413)


async def test_unknown_runs_are_404(api: httpx.AsyncClient) -> None:
    for response in (
        await api.get("/runs/nope"),
        await api.get("/runs/nope/history"),
        await api.post("/runs/nope/cancel", headers=JSON_TYPE),
        await api.post("/runs/nope/retry", headers=JSON_TYPE),
        await api.post("/runs/nope/signals", json={"name": "go"}),
        await api.post("/runs", json={"workflow": "nope"}),
    ):
        assert problem(response, 404)["type"] == "urn:tideflow:problem:not-found"


async def test_a_signal_no_wait_of_the_run_declares_is_422(
    rt: Runtime, api: httpx.AsyncClient
) -> None:
    await register_waiting(api)
    run_id = await api.post("/runs", json={"workflow": "waiting", "input": {"order_id": "A"}})
    run = run_id.json()["run_id"]
    await wait_until(rt, run, step_is("ask", "waiting"))
    body = problem(await api.post(f"/runs/{run}/signals", json={"name": "nope"}), 422)
    assert body["type"] == "urn:tideflow:problem:unknown-signal"
    assert fields(body) == ["body.name"]
    assert (await api.get(f"/runs/{run}")).json()["steps"]["ask"]["status"] == "waiting"


async def test_cancel_a_waiting_run(rt: Runtime, api: httpx.AsyncClient) -> None:
    await register_waiting(api)
    started = await api.post("/runs", json={"workflow": "waiting", "input": {"order_id": "A"}})
    run_id = started.json()["run_id"]
    await wait_until(rt, run_id, step_is("ask", "waiting"))
    cancelled = await api.post(f"/runs/{run_id}/cancel", json={"reason": "no longer wanted"})
    assert cancelled.status_code == 202
    assert cancelled.json() == {"run_id": run_id, "status": "running"}
    assert (await rt.client.wait(run_id, 10)).status == "cancelled"
    again = await api.post(f"/runs/{run_id}/cancel", headers=JSON_TYPE)
    assert again.json()["status"] == "cancelled"
    problem(await api.post(f"/runs/{run_id}/retry", headers=JSON_TYPE), 409)


async def test_retry_a_failed_run(rt: Runtime, api: httpx.AsyncClient) -> None:
    assert (await api.post("/definitions", json=BREAKING)).status_code == 201
    run_id = (await api.post("/runs", json={"workflow": "breaking"})).json()["run_id"]
    assert (await rt.client.wait(run_id, 10)).status == "failed"
    retried = await api.post(f"/runs/{run_id}/retry", json={"reason": "try again"})
    assert retried.status_code == 200, retried.text
    assert retried.json() == {"run_id": run_id, "status": "running"}
    assert (await rt.client.wait(run_id, 10)).status == "failed"


async def test_list_runs_filters_and_pages(rt: Runtime, api: httpx.AsyncClient) -> None:
    await register_waiting(api)
    assert (await api.post("/definitions", json=BREAKING)).status_code == 201
    ids = []
    for n in range(3):
        body = {"workflow": "waiting", "input": {"order_id": str(n)}}
        ids.append((await api.post("/runs", json=body)).json()["run_id"])
    failed = (await api.post("/runs", json={"workflow": "breaking"})).json()["run_id"]
    await rt.client.wait(failed, 10)
    first = (await api.get("/runs", params={"workflow": "waiting", "limit": 2})).json()
    assert len(first["runs"]) == 2 and first["next_cursor"]
    rest = (
        await api.get(
            "/runs", params={"workflow": "waiting", "limit": 2, "cursor": first["next_cursor"]}
        )
    ).json()
    assert rest["next_cursor"] is None
    assert sorted(r["run_id"] for r in first["runs"] + rest["runs"]) == sorted(ids)
    only_failed = (await api.get("/runs", params={"status": "failed"})).json()["runs"]
    assert [r["run_id"] for r in only_failed] == [failed]
    created = only_failed[0]["created_at"]
    after = (await api.get("/runs", params={"created_after": created})).json()["runs"]
    assert failed in [r["run_id"] for r in after]  # from created_after on
    before = (await api.get("/runs", params={"created_before": created})).json()["runs"]
    assert failed not in [r["run_id"] for r in before]  # up to created_before
    assert ids[0] in [r["run_id"] for r in before]


async def test_unknown_route_and_wrong_method(api: httpx.AsyncClient) -> None:
    problem(await api.get("/nowhere"), 404)
    wrong = await api.delete("/runs")
    problem(wrong, 405)
    assert wrong.headers["allow"]


async def test_an_unexpected_error_is_a_generic_500(rt: Runtime, api: httpx.AsyncClient) -> None:
    async def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a secret detail of the server")

    rt.store.list_definitions = broken  # type: ignore[method-assign]
    body = problem(await api.get("/definitions"), 500)
    assert "secret" not in str(body) and "Traceback" not in str(body)


TASKS = {
    "name": "tasks",
    "version": "1",
    "steps": [{"id": "a", "type": "noop", "queue": "billing"}],
}


async def test_queues_show_what_waits_on_the_bus() -> None:
    async with Runtime(workers=0) as rt:
        await rt.client.register(TASKS)
        run_id = await rt.client.start("tasks", {})
        transport = httpx.ASGITransport(app=create_app(rt.client, auth=False))
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as api:
            await wait_until(rt, run_id, step_is("a", "running"))
            body: dict[str, Any] = (await api.get("/queues")).json()
        rows = {(q["queue"], q["priority"]): q for q in body["queues"]}
        assert rows[("billing", "normal")]["depth"] == 1
        assert rows[("billing", "normal")]["consumers"] == 0
        assert body["unserved"] == ["billing"]


async def test_workers_are_listed_with_their_heartbeat() -> None:
    async with Runtime(workers=2) as rt:
        transport = httpx.ASGITransport(app=create_app(rt.client, auth=False))
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as api:
            for _ in range(1000):  # the pool's readers open as its tasks start
                body: dict[str, Any] = (await api.get("/workers")).json()
                if body["workers"]:
                    break
                await asyncio.sleep(0.01)
    (worker,) = {w["worker"] for w in body["workers"]}
    assert worker.endswith(f"/{os.getpid()}")
    assert all(w["live"] and w["queues"] is None for w in body["workers"])
    beats = [datetime.fromisoformat(w["last_beat"]).timestamp() for w in body["workers"]]
    assert all(beat <= time.time() for beat in beats)  # ISO 8601, as every time
