"""Trace context in event headers, and the engine's ``apply`` spans (OpenTelemetry's
in-memory exporter): what a worker or a client puts on the bus carries its span's
``traceparent``; the engine's span for each batch it applies to a run is a child of the
run's span and links to those contexts; a header that is not a W3C context is ignored."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from tideflow import Runtime
from tideflow.bus.backends.local import LocalBus
from tideflow.bus.base import Message
from tideflow.model.events import Event, SignalReceived, TaskStarted
from tideflow.model.run import new_run_state
from tideflow.observability.tracing import LINKS_PER_SPAN, Tracing
from tideflow.store.base import AppliedEvent
from tideflow.testing.waiting import step_is, wait_until
from tideflow.worker.executors.functions import register, unregister

WAITS = 'name: waits\nversion: "1"\nsteps:\n  - {id: w, type: wait, signal: go}\n'
VALID = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


class Published:
    """The events a bus was given to publish, each with its headers (None: a bare event)."""

    def __init__(self, bus: LocalBus) -> None:
        self.seen: list[tuple[Event, dict[str, str] | None]] = []
        self.listeners: list[Any] = []
        publish = bus.publish_events

        async def spy(events: Sequence[Event | Message[Event]]) -> None:
            for item in events:
                if isinstance(item, Message):
                    self.seen.append((item.body, dict(item.headers)))
                else:
                    self.seen.append((item, None))
                for listener in self.listeners:
                    listener(self.seen[-1])
            await publish(events)

        bus.publish_events = spy  # type: ignore[method-assign]

    def of(self, kind: type[Event]) -> list[tuple[Event, dict[str, str] | None]]:
        return [(e, h) for e, h in self.seen if isinstance(e, kind)]


def ids(span: ReadableSpan) -> tuple[str, str]:
    ctx = span.get_span_context()
    assert ctx is not None
    return f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"


def parent(span: ReadableSpan) -> str | None:
    return None if span.parent is None else f"{span.parent.span_id:016x}"


def links(span: ReadableSpan) -> list[tuple[str, str, str]]:
    """(trace id, span id, the event kind) of each link."""
    return [
        (
            f"{link.context.trace_id:032x}",
            f"{link.context.span_id:016x}",
            str((link.attributes or {}).get("tideflow.event")),
        )
        for link in span.links
    ]


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def applying(exporter: InMemorySpanExporter, workflow: str, kind: str) -> ReadableSpan:
    """The one apply span of ``workflow``'s runs whose batch held a ``kind`` event."""
    (span,) = [
        s
        for s in named(exporter, f"apply {workflow}")
        if kind in tuple((s.attributes or {})["tideflow.events"])  # type: ignore[arg-type]
    ]
    return span


def named_by(headers: dict[str, str] | None) -> tuple[str, str]:
    """The (trace id, span id) an event's ``traceparent`` names; it carries nothing else."""
    assert headers is not None and set(headers) == {"traceparent"}, headers
    version, trace_id, span_id, flags = headers["traceparent"].split("-")
    assert version == "00" and int(flags, 16) & 1  # sampled
    return trace_id, span_id


async def test_a_signal_carries_its_span_and_the_runs_apply_span_links_back(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    bus = LocalBus()
    published = Published(bus)
    async with Runtime(bus=bus, tracer_provider=provider) as rt:
        run_id = await rt.start_run(await rt.register(WAITS), {})
        await wait_until(rt, run_id, step_is("w", "waiting"))
        with provider.get_tracer("caller").start_as_current_span("caller"):
            await rt.signal(run_id, "go", {"ok": True})
        assert (await rt.wait(run_id, timeout=10)).status == "succeeded"

    (signal,) = named(exporter, "signal go")
    (run,) = named(exporter, "run waits")
    ((_, headers),) = published.of(SignalReceived)
    assert named_by(headers) == ids(signal)  # the event names its span
    applied = applying(exporter, "waits", "SignalReceived")
    assert applied.kind is SpanKind.CONSUMER
    assert (ids(applied)[0], parent(applied)) == ids(run)  # in the run's trace, under its span
    assert links(applied) == [(*ids(signal), "SignalReceived")]  # linked to the caller's
    assert [(f"{k.context.span_id:016x}") for k in signal.links] == [ids(run)[1]]  # and back
    attributes = dict(applied.attributes or {})
    assert attributes["tideflow.run_id"] == run_id
    assert attributes["tideflow.workflow"] == "waits"
    assert attributes["messaging.batch.message_count"] == 1
    assert attributes["tideflow.events"] == ("SignalReceived",)


async def test_an_attempts_outcome_carries_the_attempt_span_and_the_apply_span_links_to_it(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    bus = LocalBus()
    published = Published(bus)
    async with Runtime(bus=bus, tracer_provider=provider) as rt:
        plan = await rt.register('name: one\nversion: "1"\nsteps:\n  - {id: a, type: noop}\n')
        assert (await rt.run(plan, {})).status == "succeeded"

    (attempt,) = named(exporter, "step a")
    (outcome,) = [(e, h) for e, h in published.seen if type(e).__name__ == "TaskCompleted"]
    assert named_by(outcome[1]) == ids(attempt)
    applied = applying(exporter, "one", "TaskCompleted")
    (run,) = named(exporter, "run one")
    assert (ids(applied)[0], parent(applied)) == ids(run)
    assert links(applied) == [(*ids(attempt), "TaskCompleted")]


async def test_a_start_sent_on_its_own_carries_the_attempt_span(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    """An attempt that outlasts the start's batching delay reports its start apart: that
    report carries the attempt's context too, and its apply span links to it."""
    bus = LocalBus()
    published = Published(bus)
    started = asyncio.Event()
    published.listeners.append(lambda seen: isinstance(seen[0], TaskStarted) and started.set())

    @register("trace_events.held")
    async def held() -> str:
        await started.wait()  # until the start went out on its own
        return "done"

    try:
        async with Runtime(bus=bus, tracer_provider=provider) as rt:
            plan = await rt.register(
                {
                    "name": "held",
                    "version": "1",
                    "steps": [{"id": "h", "type": "python", "function": "trace_events.held"}],
                }
            )
            assert (await rt.run(plan, {})).status == "succeeded"
    finally:
        unregister("trace_events.held")

    (attempt,) = named(exporter, "step h")
    ((_, headers),) = published.of(TaskStarted)
    assert named_by(headers) == ids(attempt)
    assert links(applying(exporter, "held", "TaskStarted")) == [(*ids(attempt), "TaskStarted")]


async def test_a_cancel_and_a_retry_are_spans_linked_both_ways_with_the_run(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    @register("trace_events.fails")
    def fails() -> None:
        raise ValueError("no")

    tracer = provider.get_tracer("caller")
    try:
        async with Runtime(tracer_provider=provider) as rt:
            waiting = await rt.start_run(await rt.register(WAITS), {})
            await wait_until(rt, waiting, step_is("w", "waiting"))
            with tracer.start_as_current_span("operator"):
                await rt.cancel(waiting)
            assert (await rt.wait(waiting, timeout=10)).status == "cancelled"
            plan = await rt.register(
                {
                    "name": "fails",
                    "version": "1",
                    "steps": [{"id": "f", "type": "python", "function": "trace_events.fails"}],
                }
            )
            failed = await rt.start_run(plan, {})
            assert (await rt.wait(failed, timeout=10)).status == "failed"
            with tracer.start_as_current_span("operator"):
                await rt.client.retry(failed)
            assert (await rt.wait(failed, timeout=10)).status == "failed"
    finally:
        unregister("trace_events.fails")

    operators = {ids(span)[1] for span in named(exporter, "operator")}
    for name, workflow, kind in [
        ("cancel waits", "waits", "CancelRequested"),
        ("retry fails", "fails", "RunRetried"),
    ]:
        (sent,) = named(exporter, name)
        (run,) = named(exporter, f"run {workflow}")
        assert sent.kind is SpanKind.PRODUCER
        assert parent(sent) in operators  # in the operator's trace, not the run's
        assert ids(sent)[0] != ids(run)[0]
        assert [f"{k.context.span_id:016x}" for k in sent.links] == [ids(run)[1]]
        applied = applying(exporter, workflow, kind)
        assert (ids(applied)[0], parent(applied)) == ids(run)
        assert (*ids(sent), kind) in links(applied)


async def test_an_emitted_signal_links_the_receiving_run_to_the_emitting_run(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    emitter = 'name: emitter\nversion: "1"\nsteps: [{id: e, type: emit, event: {type: go}}]\n'
    async with Runtime(tracer_provider=provider) as rt:
        waiting = await rt.start_run(await rt.register(WAITS), {})
        await wait_until(rt, waiting, step_is("w", "waiting"))
        assert (await rt.run(await rt.register(emitter), {})).status == "succeeded"
        assert (await rt.wait(waiting, timeout=10)).status == "succeeded"

    (emitting,) = named(exporter, "run emitter")
    (receiving,) = named(exporter, "run waits")
    applied = applying(exporter, "waits", "SignalReceived")
    assert (ids(applied)[0], parent(applied)) == ids(receiving)
    assert links(applied) == [(*ids(emitting), "SignalReceived")]


async def test_without_tracing_no_event_carries_headers() -> None:
    bus = LocalBus()
    published = Published(bus)
    async with Runtime(bus=bus) as rt:
        plan = await rt.register(WAITS.replace("steps:\n", "steps:\n  - {id: a, type: noop}\n"))
        first = await rt.start_run(plan, {})
        await wait_until(rt, first, step_is("w", "waiting"))
        await rt.signal(first, "go")
        second = await rt.start_run(plan, {})
        await wait_until(rt, second, step_is("w", "waiting"))
        await rt.cancel(second)
        assert (await rt.wait(first, timeout=10)).status == "succeeded"
        assert (await rt.wait(second, timeout=10)).status == "cancelled"
    kinds = {type(event).__name__ for event, _ in published.seen}
    assert {"RunStarted", "TaskCompleted", "SignalReceived", "CancelRequested"} <= kinds
    assert all(headers is None for _, headers in published.seen)


@pytest.mark.parametrize(
    "headers",
    [
        {"traceparent": "garbage"},
        {"traceparent": "00-00000000000000000000000000000000-0000000000000000-01"},  # all zero
        {"traceparent": "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},  # version ff
        {"traceparent": "00-" + "a" * 10_000},
        {"traceparent": "", "tracestate": "=,=\x00"},
        {"traceparent": VALID.upper()},
    ],
    ids=["garbage", "all-zero", "version-ff", "huge", "empty", "upper-case"],
)
async def test_a_malformed_traceparent_on_an_event_is_ignored(
    provider: TracerProvider, exporter: InMemorySpanExporter, headers: dict[str, str]
) -> None:
    async with Runtime(tracer_provider=provider) as rt:
        run_id = await rt.start_run(await rt.register(WAITS), {})
        await wait_until(rt, run_id, step_is("w", "waiting"))
        signal = SignalReceived(event_id="hostile", run_id=run_id, time=0.0, name="go")
        await rt.bus.publish_events([Message(signal, headers)])
        assert (await rt.wait(run_id, timeout=10)).status == "succeeded"
    applied = applying(exporter, "waits", "SignalReceived")
    assert applied.links == ()
    (run,) = named(exporter, "run waits")
    assert (ids(applied)[0], parent(applied)) == ids(run)


def test_link_to_takes_only_a_valid_w3c_context(provider: TracerProvider) -> None:
    tracing = Tracing(provider)
    link = tracing.link_to({"traceparent": VALID, "tracestate": "k=v"}, "SignalReceived")
    assert link is not None
    assert (f"{link.context.trace_id:032x}", f"{link.context.span_id:016x}") == (
        "4bf92f3577b34da6a3ce929d0e0e4736",
        "00f067aa0ba902b7",
    )
    assert link.context.trace_state.get("k") == "v"
    assert dict(link.attributes or {}) == {"tideflow.event": "SignalReceived"}
    for bad in ("", "garbage", VALID[:-3], VALID.replace("-01", "-zz"), "00-" + "0" * 49):
        assert tracing.link_to({"traceparent": bad}, "x") is None, bad
    assert tracing.link_to({}, "x") is None


def test_an_apply_span_links_each_distinct_context_once_and_at_most_the_limit(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    """A fan-in of many attempts in one batch: one span for the run, a link per distinct
    context up to ``LINKS_PER_SPAN``, the rest counted."""
    state = new_run_state(run_id="r", workflow="fan", version="1", plan_hash="h", created_at=0.0)
    count = LINKS_PER_SPAN + 8
    events = [
        SignalReceived(event_id=f"e{i}", run_id="r", time=0.0, name="go") for i in range(count)
    ]
    batch = [
        AppliedEvent(event=event, state=state, transitions=[], commands=[], seq=index + 1)
        for index, event in enumerate(events)
    ]
    contexts = [f"00-{'1' * 32}-{index + 1:016x}-01" for index in range(count)]
    carried = {event.event_id: {"traceparent": contexts[i]} for i, event in enumerate(events)}
    carried["e1"] = {"traceparent": contexts[0]}  # the same context twice: one link
    carried["e2"] = {"traceparent": "garbage"}  # ignored
    Tracing(provider).apply_spans()(0, batch, carried)

    (span,) = exporter.get_finished_spans()
    assert span.name == "apply fan"
    linked = [f"{link.context.span_id:016x}" for link in span.links]
    assert len(linked) == len(set(linked)) == LINKS_PER_SPAN
    assert linked[:2] == [f"{1:016x}", f"{4:016x}"]  # e0, then e3 (e1 repeats e0, e2 is bad)
    attributes = dict(span.attributes or {})
    assert attributes["messaging.batch.message_count"] == count
    assert attributes["tideflow.links_dropped"] == count - 2 - LINKS_PER_SPAN  # not e1, e2


async def test_a_failure_to_record_the_spans_changes_no_run(
    provider: TracerProvider, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*_: object) -> None:
        raise RuntimeError("exporter on fire")

    async with Runtime(tracer_provider=provider) as rt:
        rt._engine.scheduler.spans = broken
        plan = await rt.register('name: onward\nversion: "1"\nsteps:\n  - {id: a, type: noop}\n')
        with caplog.at_level(logging.ERROR, logger="tideflow.scheduler"):
            assert (await rt.run(plan, {})).status == "succeeded"
    assert "the spans of a batch could not be recorded" in caplog.text
