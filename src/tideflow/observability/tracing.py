"""OpenTelemetry tracing (the ``otel`` extra): one trace per run, a span per step attempt,
a span per batch of events the engine applies to a run.

The model (docs/observability.md, "Tracing"):

- **The run's context is fixed when the run is created.** The client that starts it opens
  a span ``run <workflow>`` under its current context (a caller's span, the ``traceparent``
  of the HTTP request or CloudEvent that asked for it, or nothing: a new trace), and the
  W3C ``traceparent`` of that span is stored with the run (``RunState.trace``). The span
  covers the start and ends when the run is stored; it is the parent of everything the
  run does, whichever process does it. A run created by a client without tracing gets a
  context derived from its id (``derived_traceparent``): every traced process computes the
  same one, so the run still has one trace, whose root span is not recorded.
- **Tasks carry the run's context in their bus headers** (``traceparent``, plus
  ``tideflow-workflow``): the engine that dispatches a task adds them; the worker's
  ``AttemptSpans`` interceptor opens ``step <step_id>`` (kind CONSUMER) as a child of it
  and makes it current while the executor runs.
- **``http`` steps send the attempt's context on** (``outgoing``): the request carries
  the attempt span's ``traceparent``, so the called service joins the run's trace.
- **Signals and gateway events** are spans in their *caller's* trace (``signal <name>``,
  ``cancel <workflow>``, ``retry <workflow>``, ``event <type>``), linked to the runs they
  reach: the run's work stays in its own trace, one trace per run.
- **Events carry their producer's context in their bus headers** (``traceparent``,
  ``tracestate``): a worker's reports of an attempt (its start, its outcome) the attempt
  span's (``AttemptSpans`` puts it in ``ExecuteInput.report_headers``), a client's signal,
  cancel or retry its span's, an event for waiting runs the current one (the gateway's
  ``event <type>``), an ``emit`` step's signals the emitting run's. With tracing off no
  header is added.
- **The engine's work on a run is a span** ``apply <workflow>`` (``ApplySpans``): one per
  run per applied batch (not one per event), a child of the run's stored context, from
  the start of the batch to the hand-off of its effects (commit and dispatch included),
  *linked* to the contexts its events carried (at most ``LINKS_PER_SPAN`` distinct ones):
  a signal's caller trace links to the run and the run's apply span links back to it. A
  header that is not a valid W3C context is ignored.

OpenTelemetry is imported only when a ``Tracing`` is made: the base install imports this
module without it, and with tracing off nothing here runs on the hot path.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from tideflow import logcontext
from tideflow.bus.base import TRACEPARENT, TRACESTATE
from tideflow.errors import TideflowError
from tideflow.worker.executors.base import OUTGOING_HEADERS
from tideflow.worker.interceptors import ExecuteInput, ExecuteOutput, Execution

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Link, Span, Tracer, TracerProvider

    from tideflow.store.base import AppliedEvent

log = logging.getLogger("tideflow.tracing")

__all__ = [
    "LINKS_PER_SPAN",
    "TRACEPARENT",
    "TRACESTATE",
    "WORKFLOW_HEADER",
    "ApplySpans",
    "AttemptSpans",
    "Tracing",
    "derived_traceparent",
    "joined",
    "outgoing",
    "provider_from_environment",
    "received",
]

WORKFLOW_HEADER = "tideflow-workflow"
"""A task header beside ``traceparent``: the run's workflow, for the attempt span."""
LINKS_PER_SPAN = 32
"""The most links an apply span carries: one per distinct context among the events it
applied (a fan-in of thousands of attempts in one batch links the first ones and counts
the rest in ``tideflow.links_dropped``)."""


def outgoing() -> Mapping[str, str]:
    """The trace headers an executor sends with a request it makes for the attempt
    running in this context (``traceparent``, ``tracestate``): empty when tracing is off."""
    return OUTGOING_HEADERS.get()


def derived_traceparent(run_id: str) -> str:
    """The context of a run that was created without one: a trace id and span id derived
    from the run id, the same in every process."""
    digest = hashlib.blake2b(run_id.encode(), digest_size=24, person=b"tideflow.trace").digest()
    trace_id, span_id = digest[:16].hex(), digest[16:].hex()
    if not int(trace_id, 16):  # all zero is invalid in W3C trace context
        trace_id = "0" * 31 + "1"
    if not int(span_id, 16):
        span_id = "0" * 15 + "1"
    return f"00-{trace_id}-{span_id}-01"


def joined(tracing: Tracing | None, headers: Mapping[str, str]) -> AbstractContextManager[None]:
    """While the block runs, the remote context ``headers`` carry (a request's or a
    CloudEvent's ``traceparent`` / ``tracestate``) is the current one, so that the run it
    starts joins its caller's trace; nothing when tracing is off or there is none."""
    if tracing is None or TRACEPARENT not in headers:
        return contextlib.nullcontext()
    return tracing.joined(headers)


def received(
    tracing: Tracing | None, name: str, attributes: Mapping[str, Any]
) -> AbstractContextManager[object]:
    """A CONSUMER span ``name`` for an event the gateway took (what it signals and starts
    nests under it); nothing when tracing is off."""
    if tracing is None:
        return contextlib.nullcontext()
    return tracing.message_span(name, (), attributes, received=True)


EXPORTERS = ("otlp", "console")
"""The values of ``OTEL_TRACES_EXPORTER`` that turn a tideflow process's tracing on."""


def provider_from_environment(env: Mapping[str, str], service: str) -> TracerProvider | None:
    """The tracer provider of a `tideflow` process (``server``, ``worker``, ``run`` …):
    tracing is on when ``OTEL_TRACES_EXPORTER`` is ``otlp`` (OTLP over HTTP, configured by
    the standard ``OTEL_EXPORTER_OTLP_*`` variables) or ``console`` (spans as JSON on
    stderr), and ``OTEL_SDK_DISABLED`` is not ``true``; None (off) when it is unset or
    ``none``. ``OTEL_SERVICE_NAME`` (default ``service``) and ``OTEL_RESOURCE_ATTRIBUTES``
    name the process. Spans are exported in batches, flushed when the process exits."""
    wanted = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if not wanted or wanted == "none" or env.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return None
    if wanted not in EXPORTERS:
        raise TideflowError(
            f"OTEL_TRACES_EXPORTER={wanted}: tideflow exports spans with otlp or console "
            "(or none: no tracing)"
        )
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider as SdkProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    except ImportError as exc:
        raise _missing_extra(exc) from None
    name = env.get("OTEL_SERVICE_NAME") or service
    provider = SdkProvider(resource=Resource.create({"service.name": name}))
    if wanted == "console":
        import sys

        exporter: Any = ConsoleSpanExporter(out=sys.stderr)
    else:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError as exc:
            raise _missing_extra(exc) from None
        exporter = OTLPSpanExporter()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def _missing_extra(exc: ImportError) -> TideflowError:
    return TideflowError(
        f"tracing needs OpenTelemetry ({exc.name} is missing): pip install 'tideflow[otel]'"
    )


class Tracing:
    """Tracing turned on, with ``tracer_provider`` (the global one when None)."""

    def __init__(self, tracer_provider: TracerProvider | None = None) -> None:
        try:
            from opentelemetry import trace
            from opentelemetry.trace.propagation.tracecontext import (
                TraceContextTextMapPropagator,
            )
        except ImportError as exc:
            raise _missing_extra(exc) from None
        from tideflow import __version__

        provider = tracer_provider or trace.get_tracer_provider()
        self.tracer: Tracer = provider.get_tracer("tideflow", __version__)
        self._trace = trace
        self._propagator = TraceContextTextMapPropagator()

    # -- contexts -----------------------------------------------------------------

    def extract(self, headers: Mapping[str, str]) -> Context:
        """The remote context ``headers`` carry (an empty context when they carry none)."""
        return self._propagator.extract(headers)

    def headers_of(self, span: Span) -> dict[str, str]:
        """The W3C headers naming ``span`` as the parent."""
        carrier: dict[str, str] = {}
        self._propagator.inject(carrier, context=self._trace.set_span_in_context(span))
        return carrier

    def run_context(self, run_id: str, trace: str | None) -> Context:
        """The context of a run's span: its stored ``trace``, or the one derived from its id."""
        return self.extract({TRACEPARENT: trace or derived_traceparent(run_id)})

    def task_headers(self, run_id: str, workflow: str, trace: str | None) -> dict[str, str]:
        """The headers of a task of the run: its span as the attempt's parent."""
        return {TRACEPARENT: trace or derived_traceparent(run_id), WORKFLOW_HEADER: workflow}

    def run_link(self, run_id: str, trace: str | None) -> Link:
        """A link to a run's span (from a signal or an event sent to it)."""
        context = self._trace.get_current_span(self.run_context(run_id, trace)).get_span_context()
        return self._trace.Link(context, {"tideflow.run_id": run_id})

    def run_headers(self, run_id: str, trace: str | None) -> dict[str, str]:
        """The headers naming a run's span (on the events a run sends to other runs)."""
        return {TRACEPARENT: trace or derived_traceparent(run_id)}

    def current_headers(self) -> dict[str, str]:
        """The W3C headers of the current span (empty when there is none): what an event
        published now carries."""
        carrier: dict[str, str] = {}
        self._propagator.inject(carrier)
        return carrier

    def link_to(self, headers: Mapping[str, str], kind: str) -> Link | None:
        """A link to the context ``headers`` carry (an event's producer: ``kind`` names the
        event); None when they carry no valid one (absent, malformed: ignored)."""
        try:
            context = self._trace.get_current_span(self.extract(headers)).get_span_context()
        except Exception:  # a hostile header must not reach the engine (the SDK parses it)
            return None
        if not context.is_valid:
            return None
        return self._trace.Link(context, {"tideflow.event": kind})

    @contextlib.contextmanager
    def sending(
        self, name: str, run_id: str, trace: str | None, attributes: Mapping[str, Any]
    ) -> Iterator[dict[str, str]]:
        """A PRODUCER span ``name`` in the caller's trace, linked to the run's span, for an
        event a client sends to the run (a signal, a cancel, a retry); yields the headers
        the event carries (naming this span)."""
        with self.message_span(name, [self.run_link(run_id, trace)], attributes) as span:
            yield self.headers_of(span)

    def apply_spans(self) -> ApplySpans:
        """The engine's spans for the batches it applies (``ApplySpans``)."""
        return ApplySpans(self)

    @contextlib.contextmanager
    def joined(self, headers: Mapping[str, str]) -> Iterator[None]:
        """Make the remote context ``headers`` carry (an HTTP request's ``traceparent``) the
        current one while the block runs; without a ``traceparent`` the current one stays."""
        if TRACEPARENT not in headers:
            yield
            return
        from opentelemetry import context

        token = context.attach(self.extract(headers))
        try:
            yield
        finally:
            context.detach(token)

    # -- spans --------------------------------------------------------------------

    @contextlib.contextmanager
    def run_span(
        self,
        *,
        run_id: str,
        workflow: str,
        version: str,
        parent: Context | None = None,
        parent_run_id: str | None = None,
    ) -> Iterator[str]:
        """The span ``run <workflow>`` under ``parent`` (the current context when None), for
        the block that creates the run; yields the ``traceparent`` to store with it."""
        attributes = {
            "tideflow.run_id": run_id,
            "tideflow.workflow": workflow,
            "tideflow.version": version,
        }
        if parent_run_id:
            attributes["tideflow.parent_run_id"] = parent_run_id
        with self.tracer.start_as_current_span(
            f"run {workflow}", context=parent, attributes=attributes
        ) as span:
            yield self.headers_of(span).get(TRACEPARENT) or derived_traceparent(run_id)

    @contextlib.contextmanager
    def message_span(
        self,
        name: str,
        links: Sequence[Link],
        attributes: Mapping[str, Any],
        *,
        received: bool = False,
    ) -> Iterator[Span]:
        """A span in the current context (the caller's): PRODUCER for a signal sent to a
        run (linked to it), CONSUMER for an event the gateway ``received``."""
        kind = self._trace.SpanKind.CONSUMER if received else self._trace.SpanKind.PRODUCER
        with self.tracer.start_as_current_span(
            name, kind=kind, links=links, attributes=dict(attributes)
        ) as span:
            yield span

    def interceptor(self, next: Execution) -> Execution:
        """The worker interceptor that opens a span per attempt (``AttemptSpans``)."""
        return AttemptSpans(next, self)


class AttemptSpans(Execution):
    """A span ``step <step_id>`` per attempt, the child of the run's span (from the task's
    headers, or derived from the run id when they carry none), current while the executor
    runs (user code that traces nests under it; ``outgoing`` gives its headers); the events
    that report the attempt carry its context (``ExecuteInput.report_headers``)."""

    def __init__(self, next: Execution, tracing: Tracing) -> None:
        super().__init__(next)
        self._tracing = tracing
        from opentelemetry.trace import SpanKind, Status, StatusCode

        self._kind = SpanKind.CONSUMER
        self._error = (Status, StatusCode.ERROR)

    async def execute(self, input: ExecuteInput) -> ExecuteOutput:
        task = input.task
        tracing = self._tracing
        headers = input.headers
        parent = (
            tracing.extract(headers)
            if TRACEPARENT in headers
            else tracing.run_context(task.run_id, None)
        )
        attributes: dict[str, Any] = {
            "tideflow.run_id": task.run_id,
            "tideflow.step_id": task.step_id,
            "tideflow.step_key": task.step_key,
            "tideflow.attempt": task.attempt,
            "tideflow.step_type": task.type,
            "tideflow.queue": task.queue,
            "messaging.operation.type": "process",
        }
        workflow = headers.get(WORKFLOW_HEADER) or input.context.workflow
        if workflow:
            attributes["tideflow.workflow"] = workflow
        if task.compensation:
            attributes["tideflow.compensation"] = True
        with tracing.tracer.start_as_current_span(
            f"step {task.step_id}",
            context=parent,
            kind=self._kind,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            headers = tracing.headers_of(span)
            token = OUTGOING_HEADERS.set(headers)
            input.report_headers.update(headers)  # the attempt's start and outcome carry it
            # the attempt's log lines name its trace (tideflow.logcontext)
            logged = logcontext.trace_id.set(format(span.get_span_context().trace_id, "032x"))
            try:
                out = await self.next.execute(self._with_workflow(input, workflow))
            except BaseException as exc:  # a cancelled attempt (the run no longer wants it)
                span.set_attribute("tideflow.outcome", "cancelled")
                span.set_attribute("error.type", type(exc).__name__)
                raise
            finally:
                logcontext.trace_id.reset(logged)
                OUTGOING_HEADERS.reset(token)
            if out.error is not None:
                status, code = self._error
                span.set_status(status(code, out.error.message[:1000]))
                span.set_attribute("error.type", out.error.type)
                span.set_attribute("tideflow.outcome", "failed")
            else:
                span.set_attribute("tideflow.outcome", "succeeded")
        return out

    @staticmethod
    def _with_workflow(input: ExecuteInput, workflow: str | None) -> ExecuteInput:
        if not workflow or input.context.workflow:
            return input
        return replace(input, context=replace(input.context, workflow=workflow))


class ApplySpans:
    """The engine's span per run per applied batch: ``apply <workflow>`` (kind CONSUMER),
    a child of the run's stored context (so it is in the run's trace), from ``began`` (ns,
    the batch's start) to now (its commit and the hand-off of its effects are done), linked
    to the distinct contexts its events carried in their bus headers. Called by the
    scheduler after a batch (``Scheduler.spans``): nothing per event is opened."""

    def __init__(self, tracing: Tracing) -> None:
        from opentelemetry.trace import SpanKind

        self._tracing = tracing
        self._kind = SpanKind.CONSUMER

    def __call__(
        self, began: int, batch: Sequence[AppliedEvent], carried: Mapping[str, Mapping[str, str]]
    ) -> None:
        """``batch``: the committed events (of any number of runs); ``carried``: the headers
        of those that came with a ``traceparent``, by event id."""
        runs: dict[str, list[AppliedEvent]] = {}
        for applied in batch:
            runs.setdefault(applied.event.run_id, []).append(applied)
        for run_id, events in runs.items():
            self._span(run_id, events, began, carried)

    def _span(
        self,
        run_id: str,
        events: list[AppliedEvent],
        began: int,
        carried: Mapping[str, Mapping[str, str]],
    ) -> None:
        tracing = self._tracing
        state = events[-1].state
        links, dropped = self._links(events, carried) if carried else ([], 0)
        attributes: dict[str, Any] = {
            "tideflow.run_id": run_id,
            "tideflow.workflow": state.workflow,
            "tideflow.events": sorted({type(a.event).__name__ for a in events}),
            "tideflow.commands": sum(len(a.commands) for a in events),
            "messaging.batch.message_count": len(events),
            "messaging.operation.type": "process",
        }
        if dropped:
            attributes["tideflow.links_dropped"] = dropped
        span = tracing.tracer.start_span(
            f"apply {state.workflow}",
            context=tracing.run_context(run_id, state.trace),
            kind=self._kind,
            attributes=attributes,
            links=links,
            start_time=began,
        )
        span.end()

    def _links(
        self, events: list[AppliedEvent], carried: Mapping[str, Mapping[str, str]]
    ) -> tuple[list[Link], int]:
        """One link per distinct context the events carried (the first ``LINKS_PER_SPAN``),
        and how many more there were."""
        links: list[Link] = []
        seen: set[str] = set()
        dropped = 0
        for applied in events:
            headers = carried.get(applied.event.event_id)
            if headers is None or headers[TRACEPARENT] in seen:
                continue
            seen.add(headers[TRACEPARENT])
            if len(links) == LINKS_PER_SPAN:
                dropped += 1  # not parsed: counted
                continue
            link = self._tracing.link_to(headers, type(applied.event).__name__)
            if link is not None:
                links.append(link)
        return links, dropped
