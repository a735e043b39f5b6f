"""Tracing across a real broker: a cluster engine (``Runtime(cluster=True)``, PostgreSQL
store) and a worker pool on its own bus connection and a ``Client.connect`` client, each with its own
tracer provider (three processes' exporters). The task and event headers survive Redis Streams
and NATS JetStream: the worker's attempt spans are children of the engine's run span, the
``http`` step's request carries the attempt's context, and the engine's apply spans link to
the contexts the worker's outcomes and the client's signal carried."""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import asyncpg
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tideflow.bus import open_bus
from tideflow.bus.backends.nats import NatsBus
from tideflow.bus.backends.redis import RedisBus
from tideflow.client import Client
from tideflow.observability.tracing import Tracing
from tideflow.runtime.runtime import Runtime
from tideflow.testing.nats import delete_prefix
from tideflow.worker.executors.registry import ExecutorRegistry
from tideflow.worker.pool import WorkerPool

pytestmark = [pytest.mark.timeout(120)]


@dataclass
class Recorder:
    port: int = 0
    seen: list[dict[str, str]] = field(default_factory=list)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")[1:]
        self.seen.append(
            {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in head if h)}
        )
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")
        await writer.drain()
        writer.close()


def flow(port: int) -> dict[str, object]:
    return {
        "name": "remote",
        "version": "1",
        "steps": [
            {"id": "a", "type": "noop"},
            {
                "id": "call",
                "type": "http",
                "url": f"http://127.0.0.1:{port}/x",
                "depends_on": ["a"],
            },
            {"id": "w", "type": "wait", "signal": "go"},
        ],
    }


def exporting() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


@pytest.fixture(params=["redis", "nats"])
def bus_url(request: pytest.FixtureRequest) -> str:
    base = request.getfixturevalue(f"{request.param}_url")
    prefix = f"trace-{uuid.uuid4().hex[:10]}"
    return f"{base}{'&' if '?' in base else '?'}prefix={prefix}&partitions=2"


@pytest.fixture
async def store_url(postgres_url: str) -> AsyncIterator[str]:
    schema = f"trace_{uuid.uuid4().hex[:12]}"
    yield f"{postgres_url}?schema={schema}"
    conn = await asyncpg.connect(postgres_url)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


async def _clean(bus_url: str) -> None:
    bus = open_bus(bus_url)
    await bus.open()
    try:
        if isinstance(bus, NatsBus):
            await delete_prefix(bus)
        else:
            assert isinstance(bus, RedisBus)
            keys = [key async for key in bus.client.scan_iter(match=f"{bus.prefix}:*")]
            if keys:
                await bus.client.delete(*keys)
    finally:
        await bus.close()


def span_ids(span: ReadableSpan) -> tuple[str, str, str | None]:
    ctx = span.get_span_context()
    assert ctx is not None
    parent = None if span.parent is None else f"{span.parent.span_id:016x}"
    return f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}", parent


async def test_a_cluster_run_is_one_trace_across_client_engine_and_worker(
    store_url: str, bus_url: str
) -> None:
    recorder = Recorder()
    server = await asyncio.start_server(recorder.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client_provider, client_spans = exporting()
    engine_provider, engine_spans = exporting()
    worker_provider, worker_spans = exporting()
    engine = Runtime(
        store=store_url, bus=bus_url, cluster=True, workers=0, tracer_provider=engine_provider
    )
    worker_bus = open_bus(bus_url)
    executors = ExecutorRegistry()
    ids = itertools.count()
    pool = WorkerPool(
        worker_bus,
        executors,
        concurrency=2,
        clock=time.time,
        new_event_id=lambda: f"w-{next(ids)}",
        interceptors=[Tracing(worker_provider).interceptor],
    )
    try:
        async with server, engine:
            await worker_bus.open()
            pool.start()
            try:
                async with Client.connect(
                    store_url, bus_url, tracer_provider=client_provider
                ) as client:
                    await client.register(flow(port))
                    caller = client_provider.get_tracer("caller")
                    with caller.start_as_current_span("caller"):
                        run_id = await client.start("remote", {})
                    # after the start on the run's partition: the wait is waiting by then
                    with caller.start_as_current_span("operator"):
                        await client.signal(run_id, "go", {})
                    result = await asyncio.wait_for(client.wait(run_id), 30)
                assert result.status == "succeeded", result.error
            finally:
                await pool.close()
                await executors.aclose()
                await worker_bus.close()
    finally:
        await _clean(bus_url)

    spans = {span.name: span_ids(span) for span in client_spans.get_finished_spans()}
    trace_id, caller_span, _ = spans["caller"]
    run_trace, run_span, run_parent = spans["run remote"]
    assert (run_trace, run_parent) == (trace_id, caller_span)  # joined the caller's trace
    attempts = {span.name: span_ids(span) for span in worker_spans.get_finished_spans()}
    assert set(attempts) == {"step a", "step call"}
    assert {(t, parent) for t, _, parent in attempts.values()} == {(trace_id, run_span)}
    (request,) = recorder.seen
    assert request["traceparent"].split("-")[1:3] == [trace_id, attempts["step call"][1]]

    # The engine's apply spans (its own process): in the run's trace under its span, linked
    # to what the events carried over the broker: the attempts' and the signal's spans.
    applied = engine_spans.get_finished_spans()
    assert applied and {s.name for s in applied} == {"apply remote"}
    assert {span_ids(s)[::2] for s in applied} == {(trace_id, run_span)}
    linked = {
        (f"{k.context.trace_id:032x}", f"{k.context.span_id:016x}")
        for s in applied
        for k in s.links
    }
    signal_trace, signal_span, _ = spans["signal go"]
    assert (signal_trace, signal_span) in linked
    assert {(t, span) for t, span, _ in attempts.values()} <= linked
