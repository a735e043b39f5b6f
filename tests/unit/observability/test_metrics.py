"""The engine's metrics after a known set of runs, scraped from ``GET /metrics`` over TCP
(uvicorn) and read with prometheus-client's own parser: exact counter values."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from tideflow.api import create_app
from tideflow.api.auth import issue_token
from tideflow.bus.backends.local import LocalBus
from tideflow.errors import BusError, StoreUnavailable
from tideflow.model.tokens import Role
from tideflow.observability.metrics import EngineMetrics, WorkerMetrics, listen, serve_metrics
from tideflow.runtime.observers import EngineObserver
from tideflow.runtime.runtime import Runtime
from tideflow.store.backends.memory import MemoryStore
from tideflow.testing.waiting import step_is, wait_until
from tideflow.worker.executors.functions import register, unregister

OK = {
    "name": "ok",
    "version": "1",
    "steps": [
        {"id": "work", "type": "python", "function": "metrics.ok"},
        {"id": "after", "type": "noop", "depends_on": ["work"]},
    ],
}
BAD = {
    "name": "bad",
    "version": "1",
    "steps": [
        {
            "id": "boom",
            "type": "python",
            "function": "metrics.boom",
            "retry": {"max_attempts": 3, "backoff": "fixed", "initial_delay": "1ms"},
        }
    ],
}
HELD = {
    "name": "held",
    "version": "1",
    "steps": [{"id": "ask", "type": "wait", "signal": "go"}],
}

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@pytest.fixture(autouse=True)
def functions() -> Any:
    @register("metrics.ok")
    def ok() -> int:
        return 1

    @register("metrics.boom")
    def boom() -> None:
        raise ValueError("always")

    yield
    unregister("metrics.ok")
    unregister("metrics.boom")


@contextlib.asynccontextmanager
async def served(rt: Runtime, metrics: EngineMetrics) -> AsyncIterator[httpx.AsyncClient]:
    """The API with its metrics, served over TCP by uvicorn on a free port (with tokens)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    app = create_app(rt.client, metrics=metrics)
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, lifespan="off"))
    serving = asyncio.create_task(server.serve(sockets=[listener]))
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as api:
            yield api
    finally:
        server.should_exit = True
        await serving
        listener.close()


def parse(text: str) -> Samples:
    """Every sample of the exposition by (name, labels); the parser must take all of it."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


async def scrape(api: httpx.AsyncClient, token: str) -> Samples:
    response = await api.get("/metrics", headers={"authorization": f"Bearer {token}"})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=")
    return parse(response.text)


async def test_exact_counters_after_a_known_set_of_runs_scraped_over_http() -> None:
    async with Runtime(workers=4) as rt:
        metrics = EngineMetrics().attach(rt)
        viewer = (await issue_token(rt.store, name="prom", role=Role.VIEWER, now=0.0)).value
        operator = (await issue_token(rt.store, name="ops", role=Role.OPERATOR, now=0.0)).value
        for definition in (OK, BAD, HELD):
            await rt.register(definition)
        async with served(rt, metrics) as api:
            results = [await rt.run("ok") for _ in range(3)]
            assert [r.status for r in results] == ["succeeded"] * 3
            assert (await rt.run("bad")).status == "failed"
            held = await rt.start_run("held")
            await wait_until(rt, held, step_is("ask", "waiting"))

            during = await scrape(api, viewer)
            assert value(during, "tideflow_active_runs") == 1
            assert value(during, "tideflow_queue_depth", queue="default", priority="normal") == 0

            await rt.cancel(held)
            assert (await rt.wait(held)).status == "cancelled"
            refused = await api.post(
                "/events",
                content=orjson.dumps(
                    {"specversion": "1.0", "id": "e1", "source": "s", "type": "x"}
                ),
                headers={"content-type": "application/cloudevents+json"},
            )
            assert refused.status_code == 401
            event = {"specversion": "1.0", "id": "e2", "source": "s", "type": "nobody.waits"}
            taken = await api.post(
                "/events",
                content=orjson.dumps([event, event]),
                headers={
                    "content-type": "application/cloudevents-batch+json",
                    "authorization": f"Bearer {operator}",
                },
            )
            assert taken.status_code == 202, taken.text
            after = await scrape(api, viewer)

    expected = {
        ("tideflow_runs_started_total", "ok"): 3,
        ("tideflow_runs_started_total", "bad"): 1,
        ("tideflow_runs_started_total", "held"): 1,
    }
    for (name, workflow), count in expected.items():
        assert value(after, name, workflow=workflow) == count, (name, workflow)
    finished = "tideflow_runs_finished_total"
    assert value(after, finished, workflow="ok", status="succeeded") == 3
    assert value(after, finished, workflow="bad", status="failed") == 1
    assert value(after, finished, workflow="held", status="cancelled") == 1
    assert not [k for k in after if k[0] == finished and dict(k[1])["status"] == "running"]
    step = {"workflow": "bad", "step": "boom", "type": "python"}
    assert value(after, "tideflow_step_failures_total", **step) == 1
    assert value(after, "tideflow_step_retries_total", **step) == 2
    assert value(after, "tideflow_step_duration_seconds_count", **step) == 3
    good = {"workflow": "ok", "step": "work", "type": "python"}
    assert value(after, "tideflow_step_duration_seconds_count", **good) == 3
    assert value(after, "tideflow_step_failures_total", **good) is None
    noop = {"workflow": "ok", "step": "after", "type": "noop"}
    assert value(after, "tideflow_step_duration_seconds_count", **noop) == 3
    # every attempt is dispatched and started: 3 x (work, after) + 3 attempts of boom
    assert value(after, "tideflow_dispatch_latency_seconds_count", queue="default") == 9
    # every applied event is timed, by kind
    assert value(after, "tideflow_event_apply_latency_seconds_count", kind="run_started") == 5
    assert value(after, "tideflow_event_apply_latency_seconds_count", kind="task_failed") == 3
    assert value(after, "tideflow_event_apply_latency_seconds_count", kind="cancel_requested") == 1
    assert value(after, "tideflow_active_runs") == 0
    assert value(after, "tideflow_relay_pending") == 0
    assert value(after, "tideflow_outbox_backlog") == 0
    assert value(after, "tideflow_lease_expirations_total") == 0
    gateway = "tideflow_gateway_events_total"
    assert value(after, gateway, outcome="rejected") == 1
    assert value(after, gateway, outcome="unmatched") == 1
    assert value(after, gateway, outcome="duplicate") == 1
    assert value(after, gateway, outcome="delivered") is None


async def test_metrics_need_a_token_like_every_read() -> None:
    async with Runtime(workers=0) as rt, served(rt, EngineMetrics().attach(rt)) as api:
        assert (await api.get("/metrics")).status_code == 401


async def test_two_runtimes_in_one_process_keep_their_own_counts() -> None:
    async with Runtime(workers=2) as one, Runtime(workers=2) as two:
        first, second = EngineMetrics().attach(one), EngineMetrics().attach(two)
        for rt in (one, two):
            await rt.register(OK)
        await one.run("ok")
        await one.run("ok")
        await two.run("ok")
        a = parse((await first.exposition()).decode())
        b = parse((await second.exposition()).decode())
    assert value(a, "tideflow_runs_started_total", workflow="ok") == 2
    assert value(b, "tideflow_runs_started_total", workflow="ok") == 1


class _Broken(EngineObserver):
    def applied(self, batch: Any, now: float) -> None:
        raise RuntimeError("observer bug")


async def test_an_observer_that_raises_changes_neither_the_runs_nor_the_other_observers() -> None:
    async with Runtime(workers=2) as rt:
        rt.add_observer(_Broken())
        metrics = EngineMetrics().attach(rt)
        await rt.register(OK)
        assert (await rt.run("ok")).status == "succeeded"
        samples = parse((await metrics.exposition()).decode())
    assert value(samples, "tideflow_runs_finished_total", workflow="ok", status="succeeded") == 1


class _FailingStore:
    """Reads that fail, for the scrape-time levels."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    async def unfinished_runs(self) -> list[str]:
        from tideflow.errors import StoreError

        raise StoreError("the store is down")


async def test_a_store_that_cannot_be_read_leaves_its_gauges_out_and_is_counted() -> None:
    async with Runtime(workers=0) as rt:
        metrics = EngineMetrics().attach(rt)
        real = rt.store
        rt.store = _FailingStore(real)  # type: ignore[assignment]
        try:
            samples = parse((await metrics.exposition()).decode())
        finally:
            rt.store = real
    assert value(samples, "tideflow_active_runs") is None
    assert value(samples, "tideflow_outbox_backlog") == 0
    assert value(samples, "tideflow_store_errors_total", operation="scrape") == 1


async def test_a_worker_port_serves_its_attempts_and_its_queues() -> None:
    worker = WorkerMetrics()
    async with Runtime(workers=2, interceptors=[worker.interceptor]) as rt:
        worker.watch(rt.bus)
        await rt.register(OK)
        await rt.register(BAD)
        await rt.run("ok")
        await rt.run("bad")
        server = await serve_metrics(worker, listen("127.0.0.1", 0))
        port = server.sockets[0].getsockname()[1]
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
                response = await http.get("/metrics")
                missing = await http.get("/other")
        finally:
            server.close()
            await server.wait_closed()
    assert response.status_code == 200
    assert missing.status_code == 404
    samples = parse(response.text)
    attempts = "tideflow_worker_attempts_total"
    assert value(samples, attempts, type="python", outcome="succeeded") == 1
    assert value(samples, attempts, type="python", outcome="failed") == 3
    assert value(samples, attempts, type="noop", outcome="succeeded") == 1
    assert value(samples, "tideflow_worker_attempts_running") == 0
    assert value(samples, "tideflow_queue_depth", queue="default", priority="high") == 0


SAGA = {
    "name": "saga",
    "version": "1",
    "on_failure": "compensate",
    "steps": [
        {
            "id": "reserve",
            "type": "python",
            "function": "metrics.ok",
            "compensate": {"type": "noop"},
        },
        {"id": "charge", "type": "python", "function": "metrics.boom", "depends_on": ["reserve"]},
    ],
}


async def test_a_compensated_run_counts_once_in_the_state_it_ends_in() -> None:
    async with Runtime(workers=2) as rt:
        metrics = EngineMetrics().attach(rt)
        await rt.register(SAGA)
        assert (await rt.run("saga")).status == "compensated"
        samples = parse((await metrics.exposition()).decode())
    finished = {
        dict(labels)["status"]: count
        for (name, labels), count in samples.items()
        if name == "tideflow_runs_finished_total"
    }
    assert finished == {"compensated": 1}
    step = {"workflow": "saga", "step": "charge", "type": "python"}
    assert value(samples, "tideflow_step_failures_total", **step) == 1
    assert value(samples, "tideflow_step_retries_total", **step) is None
    # the compensation's attempt is dispatched and started, and not a step duration
    assert value(samples, "tideflow_dispatch_latency_seconds_count", queue="default") == 3
    reserve = {"workflow": "saga", "step": "reserve", "type": "python"}
    assert value(samples, "tideflow_step_duration_seconds_count", **reserve) == 1


async def test_an_embedded_servers_workers_count_into_the_engines_registry() -> None:
    engine = EngineMetrics()
    async with Runtime(workers=2, interceptors=[engine.workers().interceptor]) as rt:
        engine.attach(rt)
        await rt.register(OK)
        await rt.run("ok")
        samples = parse((await engine.exposition()).decode())
    attempts = "tideflow_worker_attempts_total"
    assert value(samples, attempts, type="python", outcome="succeeded") == 1
    assert value(samples, "tideflow_runs_finished_total", workflow="ok", status="succeeded") == 1


class _RefusingBus(LocalBus):
    """Refuses the first ``refuse`` task publishes (the broker connection reset)."""

    def __init__(self, refuse: int) -> None:
        super().__init__()
        self.refuse = refuse

    async def publish_tasks(self, tasks: Any) -> None:
        if self.refuse:
            self.refuse -= 1
            raise BusError("the broker connection was reset")
        await super().publish_tasks(tasks)


class _BusyStore(MemoryStore):
    """Fails the first commit of a batch (the store is unavailable for a moment)."""

    def __init__(self) -> None:
        super().__init__()
        self.fail = True

    async def commit(self, batch: Any, relayed: Any = ()) -> None:
        if batch and self.fail:
            self.fail = False
            raise StoreUnavailable("the disk is busy")
        await super().commit(batch, relayed)


async def test_bus_and_store_errors_are_counted_and_the_run_carries_on() -> None:
    async with Runtime(workers=2, bus=_RefusingBus(2), store=_BusyStore()) as rt:
        metrics = EngineMetrics().attach(rt)
        await rt.register(OK)
        assert (await rt.run("ok")).status == "succeeded"
        samples = parse((await metrics.exposition()).decode())
    assert value(samples, "tideflow_bus_errors_total", operation="relay") == 2
    assert value(samples, "tideflow_store_errors_total", operation="commit") == 1
    assert value(samples, "tideflow_runs_finished_total", workflow="ok", status="succeeded") == 1
