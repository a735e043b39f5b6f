"""The routes the web UI reads, over a real uvicorn: a run's state by plan step (a map's
items together), a step's instances a page at a time (sensitive fields masked), the
attempts with their retries, and the event streams, woken by the engine's listener."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest

import tideflow.api.feeds as feeds
from tideflow.api.changes import RunChanges
from tideflow.api.serving import address_of, http_api, listen
from tideflow.lifecycle import Stop
from tideflow.runtime.runtime import Runtime
from tideflow.testing.waiting import step_is, wait_until
from tideflow.worker.executors.functions import register, unregister

FAN = {
    "name": "fan",
    "version": "1",
    "input": {"type": "object"},
    "steps": [
        {
            "id": "each",
            "type": "map",
            "items": "{{ inputs.items }}",
            "step": {"id": "double", "type": "set", "values": {"n": "{{ item * 2 }}"}},
        },
        {"id": "gate", "type": "wait", "signal": "go", "depends_on": ["each"]},
        {
            "id": "flaky",
            "type": "python",
            "function": "run_views_test.flaky",
            "depends_on": ["gate"],
            "sensitive": ["secret"],
            "retry": {"max_attempts": 3, "initial_delay": "10ms"},
        },
    ],
}
CALLS: list[int] = []


@pytest.fixture
def flaky() -> Any:
    @register("run_views_test.flaky")
    def fails_once() -> dict[str, Any]:
        CALLS.append(1)
        if len(CALLS) == 1:
            raise ConnectionError("not yet")
        return {"secret": "s3cr3t", "ok": True}

    CALLS.clear()
    yield fails_once
    unregister("run_views_test.flaky")


@contextlib.asynccontextmanager
async def served(rt: Runtime, changes: RunChanges) -> AsyncIterator[httpx.AsyncClient]:
    sock = listen("127.0.0.1", 0)
    async with (
        http_api(rt.client, Stop(), sock, auth=False, changes=changes),
        httpx.AsyncClient(base_url=address_of(sock), timeout=20) as api,
    ):
        yield api


async def events(response: httpx.Response) -> AsyncIterator[tuple[str, Any]]:
    name = None
    async for line in response.aiter_lines():
        if line.startswith("event: "):
            name = line.removeprefix("event: ")
        elif line.startswith("data: "):
            yield str(name), orjson.loads(line.removeprefix("data: "))


async def test_a_run_is_read_by_plan_step_and_its_stream_follows_it_to_the_end(
    flaky: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(feeds, "RECHECK", 60.0)  # only the listener can wake a stream
    changes = RunChanges()
    async with Runtime(workers=1) as rt, served(rt, changes) as api:
        rt.add_listener(changes.listener)
        await rt.register(FAN)
        run_id = await rt.start_run("fan", {"items": list(range(30))})
        await wait_until(rt, run_id, step_is("gate", "waiting"))

        state = (await api.get(f"/runs/{run_id}/state")).json()
        assert state["steps"]["double"] == {
            "status": "succeeded", "instances": 30, "counts": {"succeeded": 30},
            "attempts": 0, "started_at": state["steps"]["double"]["started_at"],
            "finished_at": state["steps"]["double"]["finished_at"],
        }  # fmt: skip
        assert state["steps"]["gate"]["status"] == "waiting"
        assert [(w["step_key"], w["signal"]) for w in state["waiting_for"]] == [("gate", "go")]
        page = (await api.get(f"/runs/{run_id}/steps/double", params={"offset": 25})).json()
        assert (page["total"], page["offset"], len(page["instances"])) == (30, 25, 5)
        assert page["instances"][0]["key"] == "each[25]"
        assert page["instances"][0]["output"] == {"n": 50}
        missing = await api.get(f"/runs/{run_id}/steps/nope")
        assert missing.status_code == 404 and "no step 'nope'" in missing.json()["detail"]
        graph = (await api.get(f"/runs/{run_id}/graph")).json()
        assert {n["id"] for n in graph["nodes"]} == {"each", "double", "gate", "flaky"}

        async with api.stream("GET", f"/streams/runs/{run_id}") as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            seen = events(response)
            name, first = await anext(seen)
            assert (name, first["steps"]["gate"]["status"]) == ("run", "waiting")
            assert changes.watching == 1
            await rt.signal(run_id, "go", {})
            last = first
            async for name, view in seen:  # ends with the run
                assert name == "run"
                last = view
        assert last["status"] == "succeeded"
        assert last["steps"]["flaky"]["attempts"] == 2
        assert changes.watching == 0

        flaky_step = (await api.get(f"/runs/{run_id}/steps/flaky")).json()
        assert flaky_step["instances"][0]["output"] == {"secret": "***", "ok": True}
        attempts = (await api.get(f"/runs/{run_id}/attempts")).json()
        rows = [(a["step_key"], a["attempt"], a["outcome"]) for a in attempts["attempts"]]
        assert rows == [("flaky", 1, "failed"), ("flaky", 2, "succeeded")]
        assert attempts["attempts"][0]["error"] == "not yet"
        assert all(a["started_at"] <= a["ended_at"] for a in attempts["attempts"])


async def test_the_runs_stream_sends_the_list_when_any_run_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(feeds, "RECHECK", 60.0)
    changes = RunChanges()
    async with Runtime(workers=1) as rt, served(rt, changes) as api:
        rt.add_listener(changes.listener)
        await rt.register(FAN)
        params = {"workflow": "fan", "max_events": 2}
        async with api.stream("GET", "/streams/runs", params=params) as response:
            seen = events(response)
            name, page = await anext(seen)
            assert (name, page["runs"]) == ("runs", [])
            run_id = await rt.start_run("fan", {"items": [1]})
            pages = [page async for _, page in seen]
        assert len(pages) == 1  # max_events: 2 in all
        assert pages[-1]["runs"][0]["run_id"] == run_id
        assert (await api.get("/streams/runs/nope")).status_code == 404
        refused = await api.get("/streams/runs", params={"max_events": 0})
        assert refused.status_code == 422


async def test_the_runs_stream_follows_an_older_page_by_its_cursor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(feeds, "RECHECK", 60.0)
    changes = RunChanges()
    async with Runtime(workers=1) as rt, served(rt, changes) as api:
        rt.add_listener(changes.listener)
        await rt.register(FAN)
        oldest = await rt.start_run("fan", {"items": [1]})
        newer = [await rt.start_run("fan", {"items": [1]}) for _ in range(2)]
        await wait_until(rt, oldest, step_is("gate", "waiting"))
        first = (await api.get("/runs", params={"workflow": "fan", "limit": 2})).json()
        assert {r["run_id"] for r in first["runs"]} == set(newer)
        params = {"workflow": "fan", "limit": 2, "cursor": first["next_cursor"], "max_events": 2}
        async with api.stream("GET", "/streams/runs", params=params) as response:
            seen = events(response)
            _, page = await anext(seen)
            assert [(r["run_id"], r["status"]) for r in page["runs"]] == [(oldest, "running")]
            assert page["next_cursor"] is None
            await rt.cancel(oldest)
            _, page = await anext(seen)  # the same page, live
        assert [(r["run_id"], r["status"]) for r in page["runs"]] == [(oldest, "cancelled")]
        bad = await api.get("/streams/runs", params={"cursor": "nope", "max_events": 1})
        assert bad.status_code == 422


async def test_a_server_that_stops_ends_its_streams_cleanly() -> None:
    """Open streams end when the API stops (uvicorn would otherwise wait for them, its open
    requests, and then cut them): the reader sees the stream end, not a broken one."""
    changes = RunChanges()
    async with Runtime(workers=1) as rt:
        rt.add_listener(changes.listener)
        await rt.register(FAN)
        run_id = await rt.start_run("fan", {"items": [1]})
        await wait_until(rt, run_id, step_is("gate", "waiting"))
        sock = listen("127.0.0.1", 0)
        api_served = http_api(rt.client, Stop(), sock, auth=False, changes=changes)
        await api_served.__aenter__()
        stopped = False
        try:
            async with (
                httpx.AsyncClient(base_url=address_of(sock), timeout=20) as api,
                api.stream("GET", f"/streams/runs/{run_id}") as response,
            ):
                seen = events(response)
                name, _ = await anext(seen)
                assert name == "run" and changes.watching == 1
                await api_served.__aexit__(None, None, None)
                stopped = True
                rest = [event async for event in seen]  # ends, without a protocol error
            assert rest == [] and changes.closed and changes.watching == 0
        finally:
            if not stopped:
                await api_served.__aexit__(None, None, None)


async def test_streams_of_other_filters_each_get_their_own_page(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The streams share a read only when they show the same view: the same filters,
    limit and cursor."""
    monkeypatch.setattr(feeds, "RECHECK", 60.0)
    changes = RunChanges()
    async with Runtime(workers=1) as rt, served(rt, changes) as api:
        rt.add_listener(changes.listener)
        await rt.register(FAN)
        runs = [await rt.start_run("fan", {"items": [1]}) for _ in range(3)]
        for run_id in runs:
            await wait_until(rt, run_id, step_is("gate", "waiting"))
        await rt.cancel(runs[0])
        await wait_until(rt, runs[0], lambda state: state.status.value == "cancelled")
        asked = [
            {"limit": 1},
            {"limit": 2},
            {"status": "cancelled"},
            {"status": "running", "limit": 1},
        ]
        pages, readers = [], []
        async with contextlib.AsyncExitStack() as open_streams:  # all open at once
            for params in asked:
                response = await open_streams.enter_async_context(
                    api.stream("GET", "/streams/runs", params=params)
                )
                readers.append(events(response))  # held: a reader dropped closes its stream
                _, page = await anext(readers[-1])
                pages.append([r["run_id"] for r in page["runs"]])
    newest_first = runs[::-1]
    assert pages == [newest_first[:1], newest_first[:2], [runs[0]], newest_first[:1]]
