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
JSON_TYPE = {"content-type": "application/json"}

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
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
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


def applying(exporter: InMemorySpanExporter, workflow: str, kind: str) -> list[ReadableSpan]:
    """The spans of the engine's applying a batch with a ``kind`` event to a run."""
    return [
        s
        for s in exporter.get_finished_spans()
        if s.name == f"apply {workflow}" and kind in tuple((s.attributes or {})["tideflow.events"])  # type: ignore[arg-type]
    ]


def linked_to(span: ReadableSpan) -> set[tuple[str, str]]:
    return {(f"{k.context.trace_id:032x}", f"{k.context.span_id:016x}") for k in span.links}


def span_of(span: ReadableSpan) -> tuple[str, str]:
    ctx = span.get_span_context()
    assert ctx is not None
    return f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"


async def test_an_event_for_waiting_runs_carries_its_span_to_their_apply_spans(
    rt: Runtime, api: httpx.AsyncClient, exporter: InMemorySpanExporter
) -> None:
    """A CloudEvent correlated to the runs waiting for it: the signals it becomes carry the
    gateway's ``event <type>`` span, and each run's apply span links to it."""
    runs = [await rt.client.start("waits", {}) for _ in range(2)]
    for run_id in runs:
        await wait_until(rt, run_id, step_is("approval", "waiting"))
    headers, body = structured(event("approved", APPROVALS + "desk", {}, traceparent=TRACEPARENT))
    answer = await api.post("/events", content=body, headers={**headers, **BEARER})
    assert answer.status_code == 202, answer.text
    assert sorted(answer.json()["events"][0]["delivered_to"]) == sorted(runs)
    for run_id in runs:
        assert (await rt.wait(run_id, timeout=10)).status == "succeeded"
    received = named(exporter, "event approved")
    applied = applying(exporter, "waits", "SignalReceived")
    assert {(s.attributes or {})["tideflow.run_id"] for s in applied} == set(runs)
    assert all(linked_to(s) == {span_of(received)} for s in applied)


async def test_a_cancel_and_a_retry_over_http_join_the_callers_trace(
    rt: Runtime, api: httpx.AsyncClient, exporter: InMemorySpanExporter
) -> None:
    run_id = await rt.client.start("waits", {})
    await wait_until(rt, run_id, step_is("approval", "waiting"))
    answer = await api.post(
        f"/runs/{run_id}/cancel", headers={"traceparent": TRACEPARENT, **JSON_TYPE}
    )
    assert answer.status_code == 202, answer.text
    assert (await rt.wait(run_id, timeout=10)).status == "cancelled"
    cancel = named(exporter, "cancel waits")
    assert ids(cancel) == (CALLER_TRACE, CALLER_SPAN)
    (applied,) = applying(exporter, "waits", "CancelRequested")
    assert span_of(cancel) in linked_to(applied)
    answer = await api.post(
        f"/runs/{run_id}/retry", headers={"traceparent": TRACEPARENT, **JSON_TYPE}
    )
    assert answer.status_code == 409  # a cancelled run is not retried: no span, no event
    assert [s for s in exporter.get_finished_spans() if s.name.startswith("retry")] == []


@pytest.mark.parametrize(
    "traceparent", ["garbage", "00-zz-yy-01", "00-" + "0" * 32 + "-" + "0" * 16 + "-01", "x" * 8000]
)
async def test_a_malformed_traceparent_on_a_request_is_ignored(
    rt: Runtime, api: httpx.AsyncClient, exporter: InMemorySpanExporter, traceparent: str
) -> None:
    """The run starts in a trace of its own, the signal is sent: nothing else changes."""
    hostile = {"traceparent": traceparent, "tracestate": "=\x01,,"}
    answer = await api.post("/runs", json={"workflow": "waits", "input": {}}, headers=hostile)
    assert answer.status_code == 201, answer.text
    run_id = answer.json()["run_id"]
    await wait_until(rt, run_id, step_is("approval", "waiting"))
    answer = await api.post(
        f"/runs/{run_id}/signals", json={"name": "approved", "payload": {}}, headers=hostile
    )
    assert answer.status_code == 202, answer.text
    assert (await rt.wait(run_id, timeout=10)).status == "succeeded"
    run = named(exporter, "run waits")
    assert run.parent is None  # a new trace: the header named none
    signal = named(exporter, "signal approved")
    assert signal.parent is None
    (applied,) = applying(exporter, "waits", "SignalReceived")
    assert linked_to(applied) == {span_of(signal)}


async def test_an_http_client_in_a_callers_span_sends_its_context(
    rt: Runtime, exporter: InMemorySpanExporter
) -> None:
    """``HttpClient(tracer_provider=…)``: the run it starts joins the caller's trace, its
    signal is a span there; a request made outside any span carries no context."""
    from opentelemetry.sdk.trace import TracerProvider

    from tideflow.remote_http import HttpClient

    app = create_app(rt.client, auth=False)
    provider = TracerProvider()  # the caller's process (nothing exported)
    async with HttpClient(
        "http://localhost", transport=httpx.ASGITransport(app=app), tracer_provider=provider
    ) as remote:
        untraced = await remote.start("fulfil", {})
        with provider.get_tracer("caller").start_as_current_span("caller") as caller:
            run_id = await remote.start("waits", {})
            await wait_until(rt, run_id, step_is("approval", "waiting"))
            await remote.signal(run_id, "approved", {})
        assert (await remote.wait(run_id, timeout=10)).status == "succeeded"
        assert (await remote.wait(untraced, timeout=10)).status == "succeeded"
    ctx = caller.get_span_context()
    caller_ids = (f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}")
    assert ids(named(exporter, "run waits")) == caller_ids
    assert ids(named(exporter, "signal approved")) == caller_ids
    assert named(exporter, "run fulfil").parent is None
