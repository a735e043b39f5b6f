"""The API and the event gateway with tracing on: a request's W3C ``traceparent`` (or a
CloudEvent's ``traceparent`` attribute) makes the run it starts join the caller's trace; a
signal is a span in the caller's trace linked to the run's span."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from tideflow.api import create_app
from tideflow.runtime.runtime import Runtime
from tideflow.testing.waiting import step_is, wait_until

from .conftest import APPROVALS, BEARER, PAID, SOURCES, binary, event, structured

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"

TRIGGERED = {
    "name": "fulfil",
    "version": "1",
    "triggers": [{"event": PAID}],
    "steps": [{"id": "a", "type": "noop"}],
}
WAITS = {
    "name": "waits",
    "version": "1",
    "steps": [{"id": "approval", "type": "wait", "signal": "approved"}],
}


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    spans = InMemorySpanExporter()
    yield spans
    spans.shutdown()


@pytest.fixture
async def rt(exporter: InMemorySpanExporter) -> AsyncIterator[Runtime]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    async with Runtime(workers=1, tracer_provider=provider) as runtime:
        await runtime.client.register(TRIGGERED)
        await runtime.client.register(WAITS)
        yield runtime
    provider.shutdown()


@pytest.fixture
async def api(rt: Runtime) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(rt.client, auth=False, event_sources=SOURCES)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://tideflow") as client:
        yield client


def ids(span: ReadableSpan) -> tuple[str, str | None]:
    ctx = span.get_span_context()
    assert ctx is not None
    return f"{ctx.trace_id:032x}", None if span.parent is None else f"{span.parent.span_id:016x}"


def named(exporter: InMemorySpanExporter, name: str) -> ReadableSpan:
    (span,) = [s for s in exporter.get_finished_spans() if s.name == name]
    return span


async def test_a_run_started_over_http_with_a_traceparent_joins_the_callers_trace(
    rt: Runtime, api: httpx.AsyncClient, exporter: InMemorySpanExporter
) -> None:
    answer = await api.post(
        "/runs", json={"workflow": "fulfil", "input": {}}, headers={"traceparent": TRACEPARENT}
    )
    assert answer.status_code == 201, answer.text
    assert (await rt.wait(answer.json()["run_id"], timeout=10)).status == "succeeded"
    run = named(exporter, "run fulfil")
    assert ids(run) == (CALLER_TRACE, CALLER_SPAN)
    assert ids(named(exporter, "step a"))[0] == CALLER_TRACE


async def test_a_run_started_over_http_without_one_is_a_new_trace(
    rt: Runtime, api: httpx.AsyncClient, exporter: InMemorySpanExporter
) -> None:
    answer = await api.post("/runs", json={"workflow": "fulfil", "input": {}})
    assert (await rt.wait(answer.json()["run_id"], timeout=10)).status == "succeeded"
    trace, parent = ids(named(exporter, "run fulfil"))
    assert parent is None and trace != CALLER_TRACE


@pytest.mark.parametrize(
    ("encode", "extra"),
    [(structured, {"traceparent": TRACEPARENT}), (binary, {})],
    ids=["attribute", "http-header"],
)
async def test_a_run_an_event_triggers_joins_the_events_trace(
    rt: Runtime,
    api: httpx.AsyncClient,
    exporter: InMemorySpanExporter,
    encode: object,
    extra: dict[str, str],
) -> None:
    """The CloudEvents distributed-tracing extension (``traceparent`` attribute), or in
    binary mode the request's W3C header."""
    ce = event(PAID, APPROVALS + "desk", {"order_id": "o-1"}, **extra)
    headers, body = encode(ce)  # type: ignore[operator]
    if not extra:
        headers["traceparent"] = TRACEPARENT
    answer = await api.post("/events", content=body, headers={**headers, **BEARER})
    assert answer.status_code == 202, answer.text
    (started,) = answer.json()["events"][0]["started"]
    assert (await rt.wait(started, timeout=10)).status == "succeeded"
    received = named(exporter, f"event {PAID}")
    assert ids(received) == (CALLER_TRACE, CALLER_SPAN)
    assert received.kind is SpanKind.CONSUMER
    received_ctx = received.get_span_context()
    assert received_ctx is not None
    assert ids(named(exporter, "run fulfil")) == (CALLER_TRACE, f"{received_ctx.span_id:016x}")


async def test_a_signal_is_a_span_in_the_callers_trace_linked_to_the_run(
    rt: Runtime, api: httpx.AsyncClient, exporter: InMemorySpanExporter
) -> None:
    run_id = await rt.client.start("waits", {})
    await wait_until(rt, run_id, step_is("approval", "waiting"))
    answer = await api.post(
        f"/runs/{run_id}/signals",
        json={"name": "approved", "payload": {"ok": True}},
        headers={"traceparent": TRACEPARENT},
    )
    assert answer.status_code == 202, answer.text
    assert (await rt.wait(run_id, timeout=10)).status == "succeeded"
    signal = named(exporter, "signal approved")
    assert ids(signal) == (CALLER_TRACE, CALLER_SPAN)
    assert signal.kind is SpanKind.PRODUCER
    run_ctx = named(exporter, "run waits").get_span_context()
    assert run_ctx is not None
    (link,) = signal.links
    assert (link.context.trace_id, link.context.span_id) == (run_ctx.trace_id, run_ctx.span_id)
