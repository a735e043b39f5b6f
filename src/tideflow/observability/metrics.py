"""Prometheus metrics of an engine (``EngineMetrics``) and of a worker (``WorkerMetrics``).

Each has its own ``CollectorRegistry`` (never the global one): several runtimes in one
process, and the tests, do not collide. Counts and timings are plain numbers updated on
the event loop and turned into Prometheus families at scrape time (observability/series.py:
no lock and no label validation per event on the engine's hot path). What the engine does is heard through its
observer port (runtime/observers.py: one call per committed batch, none when no metrics
are attached); what a worker does through its interceptor chain (worker/interceptors.py);
what is a level rather than an event (queue depth and the age of the oldest task, active
runs, the outbox and the relay's backlog) is read at scrape time (``refresh``, then the
registry's collectors read the fresh snapshot). docs/observability.md lists every metric.

Needs the ``metrics`` extra (``pip install 'tideflow[metrics]'``).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from bisect import bisect_left
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from tideflow.bus.base import QueueStats
from tideflow.errors import StoreError
from tideflow.model.commands import DispatchTask
from tideflow.model.events import EVENT_KINDS, TaskCompleted, TaskFailed, TaskStarted
from tideflow.model.plan import Plan
from tideflow.model.run import RunState
from tideflow.model.states import RUN_TERMINAL, RunStatus, StepStatus
from tideflow.observability.series import Counts, Level, Series, Timings
from tideflow.runtime.observers import EngineObserver
from tideflow.store.base import AppliedEvent
from tideflow.worker.interceptors import ExecuteInput, ExecuteOutput, Execution

if TYPE_CHECKING:
    from tideflow.bus.base import Bus
    from tideflow.runtime.runtime import Runtime

log = logging.getLogger("tideflow.metrics")

CONTENT_TYPE = CONTENT_TYPE_LATEST
DURATION_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
)  # fmt: skip
"""Seconds: from a few milliseconds (a `noop`, an in-process dispatch) to an hour."""
SCRAPE_TIMEOUT = 5.0
"""Seconds a scrape waits for the store and the bus before it reports without them."""
OUTBOX_LIMIT = 10_000
"""The outbox backlog is counted up to this many rows (a scrape reads no more)."""
SWEEP_KINDS = ("timer", "outbox", "start", "schedule_slot")
"""What the sweep repairs (``tideflow_sweep_repairs_total{kind}``): due timers no wheel
held, unrelayed outbox rows, pending runs whose start was lost (admissible, older than one
interval, missed by the idle admitter), schedule slots no wake-up fired."""
TRACKED_RUNS = 100_000
"""Runs whose attempts in flight are remembered (for dispatch latency and duration); past
this the oldest is forgotten (its attempts are then not timed, nothing else changes)."""

_RUN_TERMINAL = frozenset(status.value for status in RUN_TERMINAL)
_PENDING, _RUNNING = RunStatus.PENDING.value, RunStatus.RUNNING.value
_FAILED, _RETRYING = StepStatus.FAILED.value, StepStatus.RETRYING.value

_ATTEMPT_EVENTS = (TaskStarted, TaskCompleted, TaskFailed)
AttemptKey = tuple[str, int, bool]
"""(step key, attempt, compensation) within one run."""


@dataclass(slots=True)
class _Attempt:
    type: str
    queue: str
    step_id: str
    dispatched_at: float
    started_at: float | None = None


@dataclass(slots=True)
class _Levels:
    """What the last scrape read (None: could not be read, left out of the exposition)."""

    queues: list[QueueStats] | None = None
    active_runs: int | None = None
    admitted: int | None = None
    bound: int | None = None
    tasks: int | None = None
    task_bound: int | None = None
    pending: int | None = None
    outbox: int | None = None
    relay_pending: int | None = None


def _family(name: str, doc: str, labels: Sequence[str] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=list(labels))


def queue_families(rows: Iterable[QueueStats]) -> list[Metric]:
    """The queue gauges of ``rows`` (``Bus.queue_stats``)."""
    depth = _family("tideflow_queue_depth", "Tasks waiting on the queue", ("queue", "priority"))
    held = _family(
        "tideflow_queue_held", "Tasks delivered and not settled yet", ("queue", "priority")
    )
    oldest = _family(
        "tideflow_queue_oldest_age_seconds",
        "Seconds since the oldest waiting task was put on the queue (0: none waits)",
        ("queue", "priority"),
    )
    consumers = _family("tideflow_queue_consumers", "Consumers reading the queue", ("queue",))
    seen: set[str] = set()
    for row in rows:
        labels = [row.queue, row.priority.value]
        depth.add_metric(labels, row.depth)
        held.add_metric(labels, row.held)
        oldest.add_metric(labels, row.oldest_age or 0.0)
        if row.queue not in seen:
            seen.add(row.queue)
            consumers.add_metric([row.queue], row.consumers)
    return [depth, held, oldest, consumers]


class _LevelsCollector(Collector):
    def __init__(self, levels: Callable[[], _Levels]) -> None:
        self._levels = levels

    def collect(self) -> Iterator[Metric]:
        levels = self._levels()
        if levels.queues is not None:
            yield from queue_families(levels.queues)
        for name, doc, value in (
            ("tideflow_active_runs", "Runs in the store that have not ended", levels.active_runs),
            (
                "tideflow_runs_active",
                "Runs this server admitted that have not ended (at most its admission bound, "
                "but for child runs)",
                levels.admitted,
            ),
            (
                "tideflow_runs_active_bound",
                "This server's admission bound (--max-active-runs)",
                levels.bound,
            ),
            (
                "tideflow_tasks_in_flight",
                "Attempts of this server's runs in flight: dispatched or running",
                levels.tasks,
            ),
            (
                "tideflow_tasks_in_flight_bound",
                "No run is admitted while this many attempts are in flight (--max-tasks-in-flight)",
                levels.task_bound,
            ),
            (
                "tideflow_runs_pending",
                "Runs stored pending: waiting to be admitted (store-wide)",
                levels.pending,
            ),
            (
                "tideflow_outbox_backlog",
                f"Outbox rows whose effect is not done yet (counted up to {OUTBOX_LIMIT})",
                levels.outbox,
            ),
            (
                "tideflow_relay_pending",
                "Effects of committed batches that failed and are being tried again",
                levels.relay_pending,
            ),
        ):
            if value is not None:
                family = _family(name, doc)
                family.add_metric([], value)
                yield family


class _Errors:
    """``tideflow_store_errors_total`` and ``tideflow_bus_errors_total`` by operation."""

    def __init__(self, series: Series) -> None:
        self.store = series.add(
            Counts("tideflow_store_errors", "Store operations that failed", ("operation",))
        )
        self.bus = series.add(
            Counts("tideflow_bus_errors", "Bus operations that failed", ("operation",))
        )

    def count(self, exc: BaseException, operation: str) -> None:
        (self.store if isinstance(exc, StoreError) else self.bus).inc((operation,))


class EngineMetrics(EngineObserver):
    """The metrics of one engine: ``attach`` it to a runtime, serve ``exposition()``."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        series = self.series = Series(self.registry)
        self.runs_started = series.add(
            Counts("tideflow_runs_started", "Runs started", ("workflow",))
        )
        self.runs_finished = series.add(
            Counts(
                "tideflow_runs_finished", "Runs that ended, by end state", ("workflow", "status")
            )
        )
        step = ("workflow", "step", "type")
        self.step_duration = series.add(
            Timings(
                "tideflow_step_duration_seconds",
                "Attempts of task steps, from their start on a worker to their outcome",
                step,
                DURATION_BUCKETS,
            )
        )
        self.step_failures = series.add(
            Counts("tideflow_step_failures", "Step instances that ended failed", step)
        )
        self.step_retries = series.add(
            Counts(
                "tideflow_step_retries",
                "Attempts that failed and are retried under the step's retry policy",
                step,
            )
        )
        self.dispatch_latency = series.add(
            Timings(
                "tideflow_dispatch_latency_seconds",
                "From an attempt's dispatch to its start on a worker (ready -> started)",
                ("queue",),
                DURATION_BUCKETS,
            )
        )
        self.apply_latency = series.add(
            Timings(
                "tideflow_event_apply_latency_seconds",
                "From an event's time to its batch being committed and relayed",
                ("kind",),
                DURATION_BUCKETS,
            )
        )
        self.lease_expirations = series.add(
            Counts(
                "tideflow_lease_expirations",
                "Attempts delivered again because the worker holding them stopped renewing "
                "their lease or handed them back",
            )
        )
        self.gateway = series.add(
            Counts(
                "tideflow_gateway_events",
                "Events the gateway (POST /events) took, by outcome",
                ("outcome",),
            )
        )
        self.sweep_repairs = series.add(
            Counts(
                "tideflow_sweep_repairs",
                "What the reconciliation sweep repaired that a lost notification or wake-up "
                "left (zero on a healthy server), by kind",
                ("kind",),
            )
        )
        for kind in SWEEP_KINDS:  # each kind shown at 0 from the start: alert on any rise
            self.sweep_repairs.inc((kind,), 0)
        self.errors = _Errors(series)
        self._levels = _Levels()
        self.registry.register(_LevelsCollector(lambda: self._levels))
        self._attempts: dict[str, dict[AttemptKey, _Attempt]] = {}
        self._apply_series: dict[type, list[float]] = {}
        """Per event class, its series of the apply latency (made at its first event)."""
        self._step_keys: dict[tuple[str, str], tuple[str, str, str]] = {}
        self._reads: Callable[[list[BaseException]], Awaitable[_Levels]] | None = None
        self._plans: Callable[[str], Plan | None] = lambda plan_hash: None

    # -- wiring ---------------------------------------------------------------------

    def attach(self, rt: Runtime) -> EngineMetrics:
        """Hear ``rt``'s engine, and read its store, bus and relay at scrape time."""
        rt.add_observer(self)
        self._plans = rt.plans.known
        self._reads = lambda errors: _read_levels(rt, errors)
        return self

    async def refresh(self) -> None:
        """Read the levels (queues, active runs, outbox, relay) for the next collection; a
        store or bus that does not answer leaves its gauges out and is counted."""
        if self._reads is not None:
            errors: list[BaseException] = []
            self._levels = await self._reads(errors)
            for exc in errors:
                self.errors.count(exc, "scrape")

    async def exposition(self) -> bytes:
        """The text a scrape gets (levels read now)."""
        await self.refresh()
        return generate_latest(self.registry)

    content_type = CONTENT_TYPE

    def workers(self) -> WorkerMetrics:
        """Metrics of the workers of this process (an embedded server), in this registry:
        ``Runtime(interceptors=[metrics.workers().interceptor])``."""
        return WorkerMetrics(self.registry, levels=False)

    def gateway_outcome(self, outcome: str, count: int = 1) -> None:
        """The gateway took ``count`` events with this outcome (delivered, buffered,
        unmatched, duplicate, rejected)."""
        self.gateway.inc((outcome,), count)

    # -- the observer port ------------------------------------------------------------

    def applied(self, batch: Sequence[AppliedEvent], now: float) -> None:
        by_kind, bounds = self._apply_series, self.apply_latency.bounds
        for applied in batch:
            event = applied.event
            series = by_kind.get(type(event)) or self._apply_series_of(type(event))
            if series is not None:  # Timings.observe, inlined: several times per step
                latency = now - event.time
                latency = latency if latency > 0.0 else 0.0
                series[bisect_left(bounds, latency)] += 1
                series[-1] += latency
            if isinstance(event, _ATTEMPT_EVENTS):
                self._attempt_event(applied.state, event)
            if applied.transitions:
                self._transitions(applied)
            for command in applied.commands:
                if isinstance(command, DispatchTask):
                    self._dispatched(command, event.time)

    def _apply_series_of(self, kind: type) -> list[float] | None:
        name = EVENT_KINDS.get(kind)
        if name is None:
            return None
        series = self._apply_series[kind] = self.apply_latency.of((name,))
        return series

    def effect_failed(self, what: str, run_id: str, exc: Exception) -> None:
        self.errors.count(exc, "relay")

    def commit_failed(self, exc: Exception) -> None:
        self.errors.store.inc(("commit",))

    def consume_failed(self, exc: Exception) -> None:
        self.errors.count(exc, "consume")

    def swept(self, kind: str, count: int) -> None:
        self.sweep_repairs.inc((kind,), count)

    # -- what a batch says --------------------------------------------------------------

    def _transitions(self, applied: AppliedEvent) -> None:
        state = applied.state
        last_run: str | None = None
        for t in applied.transitions:
            if t.subject == "run":
                if t.old == _PENDING and t.new == _RUNNING:
                    self.runs_started.inc((state.workflow,))
                last_run = t.new
            elif t.new == _FAILED or (t.new == _RETRYING and t.old != _RETRYING):
                labels = self._step_labels(state, t.subject)
                if labels is not None:
                    counter = self.step_failures if t.new == _FAILED else self.step_retries
                    counter.inc(labels)
        if last_run in _RUN_TERMINAL:
            self.runs_finished.inc((state.workflow, last_run))
            self._attempts.pop(state.run_id, None)

    def _step_labels(self, state: RunState, subject: str) -> tuple[str, str, str] | None:
        st = state.steps.get(subject)
        if st is None:  # a compensation's subject, or a step the state no longer has
            return None
        plan = self._plans(state.plan_hash)
        spec = plan.specs.get(st.step_id) if plan is not None else None
        return state.workflow, st.step_id, spec.type if spec is not None else "unknown"

    def _dispatched(self, task: DispatchTask, at: float) -> None:
        attempts = self._attempts.get(task.run_id)
        if attempts is None:
            if len(self._attempts) >= TRACKED_RUNS:
                del self._attempts[next(iter(self._attempts))]
            attempts = self._attempts[task.run_id] = {}
        key = (task.step_key, task.attempt, task.compensation)
        attempts[key] = _Attempt(task.type, task.queue, task.step_id, at)

    def _attempt_event(
        self, state: RunState, event: TaskStarted | TaskCompleted | TaskFailed
    ) -> None:
        started_event = type(event) is TaskStarted
        if started_event and event.delivery > 1:  # type: ignore[union-attr]
            self.lease_expirations.inc()
        attempts = self._attempts.get(event.run_id)
        key = (event.step_key, event.attempt, event.compensation)
        attempt = attempts.get(key) if attempts is not None else None
        if attempt is None:
            return  # dispatched before this engine started (recovery): not timed
        if isinstance(event, TaskStarted):
            if attempt.started_at is None:
                attempt.started_at = event.time
                self.dispatch_latency.observe(
                    (attempt.queue,), max(event.time - attempt.dispatched_at, 0.0)
                )
            return
        started = attempt.started_at
        if started is None and event.started_at is not None:  # started and ended in one
            started = event.started_at
            self.dispatch_latency.observe(
                (attempt.queue,), max(started - attempt.dispatched_at, 0.0)
            )
        assert attempts is not None
        del attempts[key]
        if started is not None and not event.compensation:
            self.step_duration.observe(
                (state.workflow, attempt.step_id, attempt.type), max(event.time - started, 0.0)
            )


async def _read_levels(rt: Runtime, errors: list[BaseException]) -> _Levels:
    """The levels of ``rt`` now: each read bounded by ``SCRAPE_TIMEOUT``; one that fails is
    None and its error goes to ``errors``."""
    done = rt.relayed_outbox  # read before the outbox: see Relay.owed
    queues, unfinished, outbox, pending = await asyncio.gather(
        _bounded(rt.bus.queue_stats(), "the bus's queues", errors),
        _bounded(rt.store.unfinished_runs(), "the store's unfinished runs", errors),
        _bounded(rt.store.pending_outbox(OUTBOX_LIMIT), "the store's outbox", errors),
        _bounded(rt.store.count_pending(), "the store's pending runs", errors),
    )
    admission = rt.admission
    return _Levels(
        queues=queues,
        active_runs=None if unfinished is None else len(unfinished),
        admitted=admission.active,
        bound=admission.bound,
        tasks=admission.tasks,
        task_bound=admission.task_bound,
        pending=pending,
        outbox=None if outbox is None else sum(row.id not in done for row in outbox),
        relay_pending=rt.pending_effects,
    )


async def _bounded(what: Awaitable[Any], name: str, errors: list[BaseException]) -> Any:
    try:
        async with asyncio.timeout(SCRAPE_TIMEOUT):
            return await what
    except Exception as exc:
        errors.append(exc)
        log.warning("a metrics scrape could not read %s: %s: %s", name, type(exc).__name__, exc)
        return None


# -- workers ------------------------------------------------------------------------------


class WorkerMetrics:
    """The metrics of one worker pool: its ``interceptor`` times every attempt; the queues
    of its bus are read at scrape time. ``exposition()`` is what its port serves."""

    content_type = CONTENT_TYPE

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        process: bool = False,
        levels: bool = True,
    ) -> None:
        """``process``: add the process's CPU, memory and file descriptors (a `tideflow
        worker` process of its own). ``levels=False``: no queue gauges and error counters
        of its own (``EngineMetrics.workers``: the engine's registry has them)."""
        self.registry = registry or CollectorRegistry(auto_describe=True)
        series = Series(self.registry)
        self.attempts = series.add(
            Counts(
                "tideflow_worker_attempts",
                "Attempts this worker ran, by outcome (succeeded, failed, cancelled)",
                ("type", "outcome"),
            )
        )
        self.duration = series.add(
            Timings(
                "tideflow_worker_attempt_duration_seconds",
                "Attempts this worker ran, from the executor's start to its end",
                ("type", "step"),
                DURATION_BUCKETS,
            )
        )
        self.running = series.add(
            Level("tideflow_worker_attempts_running", "Attempts running on this worker now")
        )
        self._queues: list[QueueStats] | None = None
        self._bus: Bus | None = None
        if levels:
            self.errors = _Errors(series)
            self.registry.register(_LevelsCollector(lambda: _Levels(queues=self._queues)))
        if process:
            ProcessCollector(registry=self.registry)

    def watch(self, bus: Bus) -> WorkerMetrics:
        """Read the queues of ``bus`` at scrape time."""
        self._bus = bus
        return self

    def interceptor(self, next: Execution) -> Execution:
        """The link that times each attempt (``WorkerPool(interceptors=[m.interceptor])``)."""
        return _Timed(next, self)

    async def refresh(self) -> None:
        if self._bus is not None:
            errors: list[BaseException] = []
            self._queues = await _bounded(self._bus.queue_stats(), "the bus's queues", errors)
            for exc in errors:
                self.errors.count(exc, "scrape")

    async def exposition(self) -> bytes:
        await self.refresh()
        return generate_latest(self.registry)


class _Timed(Execution):
    def __init__(self, next: Execution, metrics: WorkerMetrics) -> None:
        super().__init__(next)
        self._m = metrics

    async def execute(self, input: ExecuteInput) -> ExecuteOutput:
        task = input.task
        m = self._m
        m.running.add(1)
        began = time.perf_counter()
        outcome = "cancelled"
        try:
            out = await self.next.execute(input)
            outcome = "failed" if out.error is not None else "succeeded"
            return out
        finally:
            m.running.add(-1)
            m.attempts.inc((task.type, outcome))
            m.duration.observe((task.type, task.step_id), time.perf_counter() - began)


# -- serving a port -----------------------------------------------------------------------


def listen(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (bound now, so that a port in use is known
    before the process starts; port 0 picks a free one); ``OSError``."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1" if host == "localhost" else host, port))
        sock.listen(64)
    except OSError:
        sock.close()
        raise
    return sock


async def serve_metrics(
    metrics: EngineMetrics | WorkerMetrics, sock: socket.socket
) -> asyncio.Server:
    """Serve ``GET /metrics`` (and ``/``) on ``sock`` (``listen``) in this event loop: a
    small HTTP/1.1 server, so that levels are read in the loop that owns the bus, not
    from a thread. Anything else is a 404; one request per connection."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(10.0):
                head = await reader.readuntil(b"\r\n\r\n")
            method, _, rest = head.split(b"\r\n", 1)[0].decode("latin-1").partition(" ")
            path = rest.split(" ", 1)[0].split("?", 1)[0]
            if method not in ("GET", "HEAD") or path not in ("/metrics", "/"):
                status, body, kind = "404 Not Found", b"not found: GET /metrics\n", "text/plain"
            else:
                status, body, kind = "200 OK", await metrics.exposition(), metrics.content_type
            head_out = (
                f"HTTP/1.1 {status}\r\nContent-Type: {kind}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            writer.write(head_out.encode("latin-1") + (b"" if method == "HEAD" else body))
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            pass  # a client that sent no request, or not one we read
        except Exception:
            log.exception("serving a metrics scrape failed")
        finally:
            writer.close()

    return await asyncio.start_server(handle, sock=sock)


__all__ = [
    "CONTENT_TYPE",
    "EngineMetrics",
    "WorkerMetrics",
    "listen",
    "queue_families",
    "serve_metrics",
]
