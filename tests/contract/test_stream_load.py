"""Many event streams open, on SQLite and PostgreSQL, over a real uvicorn on a free loopback
port: 100 viewers of one list of runs cost one page read of the store per change, not one
per stream, so ``/health`` and the signals that flow meanwhile stay quick; 20 viewers of
one run share its reads too. The store's reads are counted by wrapping it."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import orjson
import pytest
from tests.contract.conftest import Backend
from tests.processes import eventually

import tideflow.api.feeds as feeds
import tideflow.api.run_views as run_views
from tideflow.api.changes import RunChanges
from tideflow.api.serving import address_of, http_api, listen
from tideflow.lifecycle import Stop
from tideflow.runtime.runtime import Runtime
from tideflow.testing.waiting import step_is, wait_until

pytestmark = [pytest.mark.timeout(180)]

STREAMS = 100
SIGNALS = 8
HEALTH_BOUND = 1.0
"""Seconds: the issue's bound for ``/health`` while the streams are open."""
SIGNAL_BOUND = 10.0
"""Seconds: a generous bound for one signal's HTTP call (it took seconds before)."""
GATE = {"name": "gate", "version": "1", "steps": [{"id": "go", "type": "wait", "signal": "go"}]}
STEPS = {
    "name": "steps",
    "version": "1",
    "steps": [
        {"id": "a", "type": "wait", "signal": "a"},
        {"id": "b", "type": "wait", "signal": "b", "depends_on": ["a"]},
        {"id": "c", "type": "wait", "signal": "c", "depends_on": ["b"]},
    ],
}


def counting(target: Any, name: str, monkeypatch: pytest.MonkeyPatch) -> Callable[[], int]:
    calls = [0]
    real = getattr(target, name)

    async def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return await real(*args, **kwargs)

    monkeypatch.setattr(target, name, counted)
    return lambda: calls[0]


class Follower:
    """One viewer: the newest event data of its stream."""

    def __init__(self) -> None:
        self.latest: dict[str, Any] | None = None
        self.events = 0

    async def follow(self, api: httpx.AsyncClient, path: str, params: dict[str, Any]) -> None:
        async with api.stream("GET", path, params=params) as response:
            assert response.status_code == 200, await response.aread()
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    self.latest = orjson.loads(line.removeprefix("data: "))
                    self.events += 1


@contextlib.asynccontextmanager
async def viewers(
    rt: Runtime, changes: RunChanges, path: str, params: dict[str, Any]
) -> AsyncIterator[tuple[httpx.AsyncClient, list[Follower]]]:
    """The API served on a free port with ``STREAMS`` streams of ``path`` open (each has
    its first event), and a client of its own for the other calls."""
    sock = listen("127.0.0.1", 0)
    limits = httpx.Limits(max_connections=STREAMS + 10)
    async with (
        http_api(rt.client, Stop(), sock, auth=False, changes=changes, max_streams_per_token=STREAMS),
        httpx.AsyncClient(base_url=address_of(sock), timeout=60, limits=limits) as streams,
        httpx.AsyncClient(base_url=address_of(sock), timeout=60) as api,
    ):  # fmt: skip
        followers = [Follower() for _ in range(STREAMS)]
        tasks = [asyncio.create_task(f.follow(streams, path, params)) for f in followers]
        try:
            opened = await eventually(lambda: all(f.latest for f in followers), timeout=60)
            assert opened, [t.exception() for t in tasks if t.done()]
            yield api, followers
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def timed(call: Callable[[], Any]) -> tuple[httpx.Response, float]:
    began = time.monotonic()
    response = await call()
    return response, time.monotonic() - began


async def test_a_hundred_list_streams_cost_one_page_read_per_change(
    sql_backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(feeds, "RECHECK", 600.0)  # only changes wake a feed: reads are theirs
    store = sql_backend.make()
    page_reads = counting(store, "list_runs", monkeypatch)
    changes = RunChanges()
    async with Runtime(store=store, workers=1, sweep_interval=0) as rt:
        rt.add_listener(changes.listener)
        await rt.register(GATE)
        runs = [await rt.start_run("gate", {}) for _ in range(SIGNALS)]
        for run_id in runs:
            await wait_until(rt, run_id, step_is("go", "waiting"))
        params = {"workflow": "gate", "limit": 50}
        engines = page_reads()  # the engine's own (recovery's pages of pending runs)
        async with viewers(rt, changes, "/streams/runs", params) as (api, followers):
            assert page_reads() - engines == 1  # the first page: one read for the hundred
            health: list[float] = []
            probing = asyncio.create_task(probe(api, health))
            signals: list[float] = []
            try:
                for run_id in runs:
                    sent, took = await timed(
                        lambda run_id=run_id: api.post(f"/runs/{run_id}/signals", json={"name": "go"})
                    )  # fmt: skip
                    assert sent.status_code == 202, sent.text
                    signals.append(took)
                    seen = await eventually(
                        lambda run_id=run_id: all(
                            status_in(f.latest, run_id) == "succeeded" for f in followers
                        ),
                        timeout=60,
                    )
                    assert seen, f"not every stream showed {run_id} succeeded"
            finally:
                probing.cancel()
                await asyncio.gather(probing, return_exceptions=True)
            reads = page_reads() - engines - 1
    # a signal commits a change or two, a burst read once for all streams (before: at
    # least one read per stream per change, STREAMS * SIGNALS)
    assert SIGNALS <= reads <= 3 * SIGNALS, reads
    assert max(signals) < SIGNAL_BOUND, signals
    assert health and max(health) < HEALTH_BOUND, health


async def test_the_streams_of_one_run_share_its_reads(
    sql_backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(feeds, "RECHECK", 600.0)
    views = counting(run_views, "run_view", monkeypatch)  # one read of the run's state each
    changes = RunChanges()
    async with Runtime(store=sql_backend.make(), workers=1, sweep_interval=0) as rt:
        rt.add_listener(changes.listener)
        await rt.register(STEPS)
        run_id = await rt.start_run("steps", {})
        await wait_until(rt, run_id, step_is("a", "waiting"))
        async with viewers(rt, changes, f"/streams/runs/{run_id}", {}) as (api, followers):
            assert views() == 1
            for step in ("a", "b", "c"):
                sent = await api.post(f"/runs/{run_id}/signals", json={"name": step})
                assert sent.status_code == 202, sent.text
                seen = await eventually(
                    lambda step=step: all(step_status(f.latest, step) == "succeeded" for f in followers),
                    timeout=60,
                )  # fmt: skip
                assert seen, f"not every stream showed step {step} succeeded"
            assert await eventually(lambda: all(f.latest and f.latest["status"] == "succeeded" for f in followers), timeout=60)  # fmt: skip
            reads = views() - 1
    assert 3 <= reads <= 3 * 3, reads  # before: each of the STREAMS streams read each change


async def probe(api: httpx.AsyncClient, took: list[float]) -> None:
    """``/health``, again and again, each answer's time in ``took``."""
    while True:
        answer, seconds = await timed(lambda: api.get("/health"))
        assert answer.status_code == 200
        took.append(seconds)
        await asyncio.sleep(0.05)  # a pace, not a wait for anything


def status_in(page: dict[str, Any] | None, run_id: str) -> str | None:
    for run in (page or {}).get("runs", []):
        if run["run_id"] == run_id:
            return str(run["status"])
    return None


def step_status(view: dict[str, Any] | None, step: str) -> str | None:
    found = (view or {}).get("steps", {}).get(step)
    return None if found is None else str(found["status"])
