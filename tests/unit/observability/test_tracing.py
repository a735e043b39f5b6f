"""Tracing with the OpenTelemetry SDK's in-memory exporter: one trace per run, a span per
attempt as a child of the run's span, the context carried in task headers and on into an
``http`` step's request to a local server; a caller's context joins the run to its trace."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from tideflow import Runtime
from tideflow.bus.backends.local import LocalBus
from tideflow.bus.base import Delivery, Message
from tideflow.model import codec
from tideflow.model.commands import DispatchTask
from tideflow.model.events import RunStarted
from tideflow.model.run import new_run_state
from tideflow.observability.tracing import derived_traceparent

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@dataclass
class Recorder:
    """A tiny HTTP/1.1 server on a free port that records each request's headers."""

    port: int = 0
    seen: list[dict[str, str]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")[1:]
        headers = {
            k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines if x)
        }
        if int(headers.get("content-length", "0")):
            await reader.readexactly(int(headers["content-length"]))
        self.seen.append(headers)
        body = b'{"ok": true}'
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(body), body)
        )
        await writer.drain()
        writer.close()


@pytest.fixture
async def server() -> AsyncIterator[Recorder]:
    recorder = Recorder()
    srv = await asyncio.start_server(recorder.handle, "127.0.0.1", 0)
    recorder.port = srv.sockets[0].getsockname()[1]
    async with srv:
        yield recorder


def flow(url: str) -> str:
    return f"""
name: traced
version: "1"
steps:
  - {{id: first, type: noop}}
  - id: call
    type: http
    depends_on: [first]
    url: "{url}/hello"
    timeout: 5s
output: "{{{{ steps.call.output.body }}}}"
"""


def by_name(exporter: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    """The run and attempt spans by name (the engine's ``apply`` spans are left out:
    tests/unit/observability/test_trace_events.py checks them)."""
    spans = [s for s in exporter.get_finished_spans() if not s.name.startswith("apply ")]
    named = {span.name: span for span in spans}
    assert len(named) == len(spans), [span.name for span in spans]
    return named


def applies(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name.startswith("apply ")]


def traceparent_of(span: ReadableSpan) -> tuple[str, str]:
    ctx = span.get_span_context()
    assert ctx is not None
    return f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"


def parent_id(span: ReadableSpan) -> str | None:
    return None if span.parent is None else f"{span.parent.span_id:016x}"


async def test_a_run_is_one_trace_and_its_http_step_sends_the_attempts_context(
    server: Recorder, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    async with Runtime(tracer_provider=provider, workers=2) as rt:
        plan = await rt.register(flow(server.url))
        result = await rt.run(plan, {})
        assert result.status == "succeeded", result.error
        assert result.output == {"ok": True}
        state = await rt.state(result.run_id)

    spans = by_name(exporter)
    assert set(spans) == {"run traced", "step first", "step call"}
    run, first, call = spans["run traced"], spans["step first"], spans["step call"]
    trace_id, run_span_id = traceparent_of(run)
    assert {traceparent_of(s)[0] for s in spans.values()} == {trace_id}
    assert run.parent is None  # no caller: a new trace
    assert parent_id(first) == parent_id(call) == run_span_id
    engine = applies(exporter)  # the engine's work on the run: in its trace, under its span
    assert engine and {(traceparent_of(s)[0], parent_id(s)) for s in engine} == {
        (trace_id, run_span_id)
    }
    assert state.trace is not None  # kept with the run
    assert state.trace.split("-")[:3] == ["00", trace_id, run_span_id]

    assert first.kind is call.kind is SpanKind.CONSUMER
    assert dict(call.attributes or {}) == {
        "tideflow.run_id": result.run_id,
        "tideflow.step_id": "call",
        "tideflow.step_key": "call",
        "tideflow.attempt": 1,
        "tideflow.step_type": "http",
        "tideflow.queue": "default",
        "tideflow.workflow": "traced",
        "messaging.operation.type": "process",
        "tideflow.outcome": "succeeded",
    }
    assert run.attributes is not None and run.attributes["tideflow.run_id"] == result.run_id

    (request,) = server.seen
    version, sent_trace, sent_parent, flags = request["traceparent"].split("-")
    assert (version, sent_trace, sent_parent) == ("00", trace_id, traceparent_of(call)[1])
    assert int(flags, 16) & 1  # sampled


async def test_a_start_in_a_callers_span_joins_the_callers_trace(
    server: Recorder, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    tracer = provider.get_tracer("caller")
    async with Runtime(tracer_provider=provider) as rt:
        plan = await rt.register(flow(server.url))
        with tracer.start_as_current_span("caller") as caller:
            run_id = await rt.start_run(plan, {})
        assert (await rt.wait(run_id, timeout=10)).status == "succeeded"

    spans = by_name(exporter)
    caller_trace, caller_span = traceparent_of(spans["caller"])
    assert caller_trace == f"{caller.get_span_context().trace_id:032x}"
    assert {traceparent_of(s)[0] for s in spans.values()} == {caller_trace}
    assert parent_id(spans["run traced"]) == caller_span
    run_span = traceparent_of(spans["run traced"])[1]
    assert parent_id(spans["step first"]) == parent_id(spans["step call"]) == run_span
    assert server.seen[0]["traceparent"].split("-")[1] == caller_trace


async def test_failed_attempts_are_error_spans_each_a_child_of_the_run(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    async with Runtime(tracer_provider=provider) as rt:
        plan = await rt.register(
            """
name: flaky
version: "1"
steps:
  - id: call
    type: http
    url: "http://127.0.0.1:1/nothing-listens-here"
    timeout: 2s
    retry: {max_attempts: 2, backoff: fixed, initial_delay: 1ms}
"""
        )
        result = await rt.run(plan, {})
        assert result.status == "failed"

    spans = exporter.get_finished_spans()
    attempts = sorted((s for s in spans if s.name == "step call"), key=lambda s: s.start_time or 0)
    (run,) = [s for s in spans if s.name == "run flaky"]
    assert [(s.attributes or {})["tideflow.attempt"] for s in attempts] == [1, 2]
    assert {parent_id(s) for s in attempts} == {traceparent_of(run)[1]}
    assert all(s.status.status_code is StatusCode.ERROR for s in attempts)
    assert {(s.attributes or {})["error.type"] for s in attempts} == {"NetworkError"}


async def test_child_runs_are_in_their_parents_trace(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    async with Runtime(tracer_provider=provider) as rt:
        await rt.register('name: child\nversion: "1"\nsteps:\n  - {id: inner, type: noop}\n')
        plan = await rt.register(
            'name: parent\nversion: "1"\nsteps:\n  - {id: sub, type: subflow, workflow: child}\n'
        )
        result = await rt.run(plan, {})
        assert result.status == "succeeded", result.error

    spans = by_name(exporter)
    parent_trace, parent_span = traceparent_of(spans["run parent"])
    assert {traceparent_of(s)[0] for s in spans.values()} == {parent_trace}
    assert parent_id(spans["run child"]) == parent_span
    assert parent_id(spans["step inner"]) == traceparent_of(spans["run child"])[1]


async def test_a_run_started_without_tracing_has_a_trace_derived_from_its_id(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    """A client without tracing stores no context; the traced engine and workers derive the
    same one from the run id."""
    async with Runtime(tracer_provider=provider) as rt:
        untraced = rt.client
        untraced.tracing = None
        plan = await rt.register('name: plain\nversion: "1"\nsteps:\n  - {id: a, type: noop}\n')
        run_id = await rt.start_run(plan, {})
        assert (await rt.wait(run_id, timeout=10)).status == "succeeded"
        assert (await rt.state(run_id)).trace is None

    (attempt,) = by_name(exporter).values()
    _, trace_id, span_id, _ = derived_traceparent(run_id).split("-")
    assert traceparent_of(attempt)[0] == trace_id
    assert parent_id(attempt) == span_id
    assert {(traceparent_of(s)[0], parent_id(s)) for s in applies(exporter)} == {
        (trace_id, span_id)
    }
    assert derived_traceparent(run_id) == derived_traceparent(run_id) != derived_traceparent("x")


async def test_without_tracing_tasks_carry_no_headers_and_requests_no_traceparent(
    server: Recorder,
) -> None:
    bus = LocalBus()
    seen: list[Delivery[DispatchTask] | Message[DispatchTask] | DispatchTask] = []
    publish = bus.publish_tasks

    async def spy(tasks):  # type: ignore[no-untyped-def]
        seen.extend(tasks)
        await publish(tasks)

    bus.publish_tasks = spy  # type: ignore[method-assign]
    async with Runtime(bus=bus) as rt:
        assert rt.tracing is None
        result = await rt.run(await rt.register(flow(server.url)), {})
        assert result.status == "succeeded", result.error
    assert seen and all(isinstance(task, DispatchTask) for task in seen)
    assert "traceparent" not in server.seen[0]


async def test_tasks_carry_the_runs_context_in_their_headers(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    bus = LocalBus()
    seen: list[Message[DispatchTask]] = []
    publish = bus.publish_tasks

    async def spy(tasks):  # type: ignore[no-untyped-def]
        seen.extend(tasks)
        await publish(tasks)

    bus.publish_tasks = spy  # type: ignore[method-assign]
    async with Runtime(bus=bus, tracer_provider=provider) as rt:
        result = await rt.run(
            await rt.register('name: w\nversion: "1"\nsteps:\n  - {id: a, type: noop}\n'), {}
        )
        state = await rt.state(result.run_id)
    (message,) = seen
    assert isinstance(message, Message)
    assert dict(message.headers) == {"traceparent": state.trace, "tideflow-workflow": "w"}


def test_the_base_install_imports_tracing_without_opentelemetry() -> None:
    code = (
        "import sys; sys.modules['opentelemetry'] = None\n"
        "import tideflow, tideflow.observability.tracing, tideflow.worker.executors.http\n"
        "from tideflow.errors import TideflowError\n"
        "try:\n"
        "    tideflow.Runtime(tracer_provider=object())\n"
        "except TideflowError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "pip install 'tideflow[otel]'" in out.stdout, out.stderr


def test_the_started_event_is_unchanged() -> None:
    """The run's context lives in its state, not in its events (their format is as before)."""
    assert "trace" not in RunStarted.__dataclass_fields__


def test_a_snapshot_keeps_the_runs_trace_and_one_from_before_tracing_has_none() -> None:
    state = new_run_state(
        run_id="r", workflow="w", version="1", plan_hash="h", created_at=0.0, trace=PARENT
    )
    data = codec.state_to_data(state)
    assert codec.loads(codec.dumps(state)).trace == PARENT
    del data["trace"]  # written by a version before tracing
    assert codec.state_from_data(data).trace is None


async def test_a_run_recovered_by_the_next_engine_keeps_its_trace(
    tmp_path: Path, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    """The context is stored with the run: the engine that recovers it after a restart
    dispatches its tasks under the same run span."""
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    async with Runtime(store=store, workers=0, tracer_provider=provider) as first:
        plan = await first.register('name: later\nversion: "1"\nsteps:\n  - {id: a, type: noop}\n')
        run_id = await first.start_run(plan, {})
    async with Runtime(store=store, tracer_provider=provider) as second:
        assert (await second.wait(run_id, timeout=10)).status == "succeeded"
    spans = by_name(exporter)
    assert set(spans) == {"run later", "step a"}
    trace_id, run_span = traceparent_of(spans["run later"])
    assert traceparent_of(spans["step a"])[0] == trace_id
    assert parent_id(spans["step a"]) == run_span


async def test_an_attempts_log_lines_name_its_trace(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    from tideflow import logcontext
    from tideflow.worker.executors.functions import register, unregister

    @register("tracing_test.trace_of_logs")
    def trace_of_logs() -> str | None:
        return logcontext.trace_id.get()

    try:
        async with Runtime(tracer_provider=provider, workers=1) as rt:
            plan = await rt.register(
                {
                    "name": "logged",
                    "version": "1",
                    "steps": [
                        {"id": "s", "type": "python", "function": "tracing_test.trace_of_logs"}
                    ],
                    "output": "{{ steps.s.output }}",
                }
            )
            result = await rt.run(plan, {})
    finally:
        unregister("tracing_test.trace_of_logs")
    assert result.status == "succeeded", result.error
    (step,) = [s for s in exporter.get_finished_spans() if s.name == "step s"]
    assert result.output == traceparent_of(step)[0]  # the trace id the log lines carry
    assert logcontext.trace_id.get() is None  # set for the attempt only
