"""The worker pool: takes tasks from the bus, runs their executor, reports the result.

One consumer takes task deliveries from the bus, at most ``prefetch`` of them
unacknowledged (``concurrency`` unless given), and runs at most ``concurrency`` at a
time; the lease of each is extended while it is held (a heartbeat); a task is
acknowledged after its outcome is published, and handed back to the bus when the pool
shuts down (``close``), or when it had not started yet as the pool drains (``drain``:
the attempts running are given time to finish). Cancels come on the bus's control
channel.

A task the bus delivers again (``Delivery.deliveries`` > 1: its previous worker died and
its lease expired, or it was handed back) runs again as the same attempt with the same
idempotency key, its start reported at once with the delivery count (the history says
so). An ``idempotent: false`` step is the exception: when its durable start is refused
because the attempt had started elsewhere, its outcome is unknown and the pool reports
the execution lost (``TaskLost``, reason ``lease_expired``): the core fails the attempt
with ``StepOutcomeUnknown`` instead of running it blindly again.

Before it runs an attempt the pool reports its start (`starts`): the attempt's
``timeout`` counts from there. The attempt itself goes through the interceptor chain
(worker/interceptors.py: secrets and redaction, the output limit, fault points, then
the executor), which takes one ``ExecuteInput`` and returns one ``ExecuteOutput``. Its
outcome is published, then its task acknowledged, together with those of the attempts
that end in the same turn of the event loop on a bus where that pays (worker/outcomes.py).
The events that report an attempt carry the headers the chain put in its
``report_headers`` (the tracing interceptor's: the attempt span's context), none when it
put none.

Each task runs as its own asyncio task so that the scheduler can cancel it (an
attempt timeout, a cancelled run, ``cancel_others``). Executors that block run
their blocking part in a bounded thread pool themselves; the pool never creates
a thread or process per step.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Any

from tideflow import logcontext
from tideflow.bus.base import (
    Bus,
    CancelAttempt,
    Control,
    Delivery,
    Headers,
    Message,
    Stream,
)
from tideflow.bus.closing import cancel_and_wait
from tideflow.model import storable
from tideflow.model.commands import DispatchTask
from tideflow.model.events import Event, TaskCompleted, TaskFailed, TaskLost
from tideflow.worker import capture
from tideflow.worker.executors.base import StepContext
from tideflow.worker.executors.registry import ExecutorRegistry
from tideflow.worker.interceptors import (
    Builtins,
    ExecuteInput,
    ExecuteOutput,
    Interceptor,
    build_chain,
    failure,
)
from tideflow.worker.outcomes import Outcomes
from tideflow.worker.secrets import SecretProvider, default_provider
from tideflow.worker.starts import Key, StartDurably, StartReports, attempt_key

log = logging.getLogger("tideflow.worker")

_MAX_REMEMBERED_CANCELS = 10_000
_REPUBLISH_DELAY = 0.5
"""Seconds before a task whose outcome could not be published comes again."""


class WorkerPool:
    def __init__(
        self,
        bus: Bus,
        executors: ExecutorRegistry,
        *,
        concurrency: int,
        clock: Callable[[], float],
        new_event_id: Callable[[], str],
        secrets: SecretProvider | None = None,
        start_durably: StartDurably | None = None,
        max_output: int = storable.MAX_STEP_OUTPUT,
        queues: Collection[str] | None = None,
        interceptors: Sequence[Interceptor] = (),
        prefetch: int | None = None,
    ) -> None:
        self._bus = bus
        self._outcomes = Outcomes(bus)
        self._starts = StartReports(
            bus, clock=clock, new_event_id=new_event_id, start_durably=start_durably
        )
        self._prefetch = max(prefetch or concurrency, concurrency)
        self._slots = _Slots(concurrency)
        self._clock = clock
        self._new_id = new_event_id
        self._chain = build_chain(
            executors,
            secrets=secrets or default_provider(),
            max_output=max_output,
            interceptors=interceptors,
        )
        self._queues = queues
        self._loops: list[asyncio.Task[None]] = []
        self._running: dict[Key, tuple[asyncio.Task[None], Delivery[DispatchTask]]] = {}
        self._cancelled: dict[Key, None] = {}
        """Attempts cancelled before a worker picked them up (bounded, oldest dropped)."""
        self._closing = False
        self._closed = asyncio.Event()
        self._draining = False
        self._executing: set[Key] = set()
        """Attempts past their slot: running, not waiting for one."""
        self._random = random.Random()
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        # Kept: asking for the running loop costs a system call (getpid) in CPython 3.11.
        self._loop = asyncio.get_running_loop()
        if not self._loops:
            capture.install()  # what attempts print and log is theirs (worker/capture.py)
        control = self._bus.consume_control()  # listening before the first task comes
        self._loops = [
            asyncio.create_task(self._consume(), name="tideflow-worker"),
            asyncio.create_task(self._listen(control), name="tideflow-worker-control"),
            asyncio.create_task(self._heartbeat(), name="tideflow-worker-heartbeat"),
        ]

    @property
    def running(self) -> int:
        """Tasks held: running, or waiting for a slot."""
        return len(self._running)

    async def drain(self, grace: float) -> int:
        """Take no new task and hand back those not started; give the attempts running up
        to ``grace`` seconds to finish (their outcomes are reported), then ``close``: what
        is still running is cancelled and handed back. Returns how many were handed back
        that way."""
        self._draining = True
        for key, (runner, _) in list(self._running.items()):
            if key not in self._executing:
                runner.cancel()  # waiting for a slot: handed back at once
        runners = [runner for runner, _ in self._running.values()]
        if runners and grace > 0:
            await asyncio.wait(runners, timeout=grace)
        left = len(self._running)
        await self.close()
        return left

    async def close(self) -> None:
        """Stop taking tasks; cancel the attempts running and hand their tasks back."""
        self._closing = True
        self._closed.set()
        running = [runner for runner, _ in self._running.values()]
        for runner in running:  # cancelled once: a runner's cancel ends its attempt
            runner.cancel()
        await cancel_and_wait(*self._loops)
        for runner in running:
            with contextlib.suppress(asyncio.CancelledError):
                await runner
        if self._loops:
            capture.uninstall()
        self._loops.clear()

    def _cancel(self, cancel: CancelAttempt) -> None:
        """Stop an attempt the scheduler no longer waits for; one that has not come yet is
        remembered (its task is dropped when it comes)."""
        key = (cancel.run_id, cancel.step_key, cancel.round, cancel.attempt, cancel.compensation)
        running = self._running.get(key)
        if running is not None:
            running[0].cancel()
            return
        self._cancelled[key] = None
        if len(self._cancelled) > _MAX_REMEMBERED_CANCELS:
            del self._cancelled[next(iter(self._cancelled))]

    async def _listen(self, control: Stream[Control]) -> None:
        async with contextlib.aclosing(control) as messages:
            async for message in messages:
                self._cancel(message)

    async def _consume(self) -> None:
        """Take tasks (at most ``concurrency`` unacknowledged) and run each as its own
        asyncio task, so that one attempt can be cancelled alone."""
        loop = asyncio.get_running_loop()
        deliveries = self._bus.consume_tasks(
            self._queues, prefetch=self._prefetch, worker=self._starts.worker
        )
        async with contextlib.aclosing(deliveries) as tasks:
            async for delivery in tasks:
                task = delivery.body
                key = attempt_key(task)
                if self._draining:
                    await delivery.nack()  # taken as the pool drains: someone else runs it
                    # Take no more, keeping the stream (and what it holds) open until
                    # close: an event, not only the cancel, since a bus client may have
                    # swallowed the cancel while the nack was on its way.
                    await self._closed.wait()
                    return
                if key in self._cancelled:
                    del self._cancelled[key]
                    await delivery.ack()  # cancelled while it was queued
                    continue
                runner = loop.create_task(self._run(key, delivery))
                self._running[key] = (runner, delivery)

    async def _run(self, key: Key, delivery: Delivery[DispatchTask]) -> None:
        """One attempt: its outcome is published before its task is acknowledged; a
        cancelled attempt publishes nothing; on shutdown its task goes back to the bus, as
        does one that had not started when the pool began to drain."""
        event: Event | Message[Event] | None = None
        ran = False
        task = delivery.body
        logcontext.bind(task.run_id, task.step_id, task.attempt)  # this asyncio task's lines
        written = capture.begin()  # what the attempt prints and logs (its context's)
        slots = self._slots
        try:
            waiter = slots.take()
            if waiter is not None:
                try:
                    await waiter
                except asyncio.CancelledError:
                    slots.forgo(waiter)
                    raise
            try:
                if not self._draining:
                    ran = True
                    self._executing.add(key)
                    # the reports' headers: an interceptor may fill them
                    reports: dict[str, str] = {}
                    try:
                        out = await self._attempt(task, delivery, reports, key)
                    except (asyncio.CancelledError, KeyboardInterrupt):
                        # Cancelled: it publishes nothing. Ctrl-C reaches the loop here; the
                        # python executor turns one that user code raises into a step error.
                        raise
                    except BaseException as exc:  # SystemExit and the like, or an
                        out = failure(exc)  # interceptor's own failure: they fail the step
                    if out is None:
                        event = self._lost(task, delivery.deliveries)  # it must not run
                    else:
                        event = self._outcome(task, out, key, capture.end(written))
                        if reports:
                            event = Message(event, reports)
            finally:
                slots.give_back()
        except asyncio.CancelledError:
            pass  # cancelled while it waited for a slot
        finally:
            self._running.pop(key, None)
            self._executing.discard(key)
        if self._closing or (not ran and self._draining):
            await self._hand_back(delivery, 0.0, key)
            return
        try:
            if event is not None:
                sending = self._starts.sending()
                if sending is not None:
                    await sending
            await self._outcomes.settle(event, delivery)
        except Exception:
            log.exception("the outcome of %s could not be published; its task comes again", key)
            await self._hand_back(delivery, _REPUBLISH_DELAY, key)

    async def _hand_back(self, delivery: Delivery[DispatchTask], delay: float, key: Key) -> None:
        """Give a task back to the bus; when the bus refuses that too (the broker is gone)
        the task comes again once its lease runs out, since nobody renews it."""
        try:
            await delivery.nack(delay)
        except Exception as exc:
            log.warning(
                "the task of %s could not be handed back either (%s: %s); it comes again "
                "when its lease runs out",
                key,
                type(exc).__name__,
                exc,
            )

    async def _heartbeat(self) -> None:
        """Extend the lease of every task being run, three times per lease."""
        while True:
            await asyncio.sleep(max(self._bus.lease / 3, 0.01))
            for _, delivery in list(self._running.values()):
                try:
                    await delivery.extend()
                except Exception:
                    log.exception("the lease of %s could not be extended", delivery.body.run_id)

    def _attempt(
        self,
        task: DispatchTask,
        delivery: Delivery[DispatchTask],
        reports: dict[str, str],
        key: Key,
    ) -> Awaitable[ExecuteOutput | None]:
        """The attempt through the chain, to be awaited: None when its start was refused.
        A plain function, not a coroutine: on the common path (the start reported later)
        the attempt's task awaits the chain itself, one coroutine fewer to resume twice on
        every attempt."""
        ctx = StepContext(
            run_id=task.run_id,
            step_id=task.step_id,
            step_key=task.step_key,
            attempt=task.attempt,
            idempotency_key=task.idempotency_key,
            timeout=task.timeout,
        )
        starts = self._starts
        if starts.at_once(task, delivery.deliveries):
            return self._reported(task, delivery, ctx, reports)
        starts.later(task, reports, self._loop, key)
        return self._chained(task, ctx, delivery.headers, reports)

    async def _reported(
        self,
        task: DispatchTask,
        delivery: Delivery[DispatchTask],
        ctx: StepContext,
        reports: dict[str, str],
    ) -> ExecuteOutput | None:
        """The attempt whose start must be reported before it runs (`StartReports.at_once`)."""
        if not await self._starts.report(task, delivery.deliveries, reports):
            return None
        return await self._chained(task, ctx, delivery.headers, reports)

    def _chained(
        self, task: DispatchTask, ctx: StepContext, headers: Headers, reports: dict[str, str]
    ) -> Awaitable[ExecuteOutput]:
        chain = self._chain
        if type(chain) is Builtins and not task.secrets:  # nothing to hand an input to
            return chain.run(task, ctx, task.config, task.input)
        return chain.execute(
            ExecuteInput(
                task=task,
                context=ctx,
                config=task.config,
                input=task.input,
                headers=headers,
                report_headers=reports,
            )
        )

    def _lost(self, task: DispatchTask, delivery: int) -> Event | None:
        """A start refused: stale or a duplicate, nothing to report; but an ``idempotent:
        false`` attempt the bus delivered again had started elsewhere and its outcome is
        unknown: the core must decide (``StepOutcomeUnknown``), not wait for it forever."""
        if task.idempotent or delivery <= 1:
            return None
        return TaskLost(
            event_id=self._new_id(),
            run_id=task.run_id,
            time=self._clock(),
            step_key=task.step_key,
            attempt=task.attempt,
            reason=f"lease_expired: its task was delivered again (delivery {delivery})",
            compensation=task.compensation,
            round=task.round,
        )

    def _outcome(
        self, task: DispatchTask, out: ExecuteOutput, key: Key, logs: dict[str, Any] | None
    ) -> Event:
        """The event that reports the attempt's outcome, with what it wrote (``logs``)."""
        started = self._starts.take(key)
        worker = self._starts.worker if started is not None else ""
        if out.error is not None:
            return TaskFailed(
                event_id=self._new_id(),
                run_id=task.run_id,
                time=self._clock(),
                step_key=task.step_key,
                attempt=task.attempt,
                error=out.error,
                seed=self._random.getrandbits(32),
                compensation=task.compensation,
                round=task.round,
                started_at=started,
                worker=worker,
                logs=logs,
            )
        return TaskCompleted(
            event_id=self._new_id(),
            run_id=task.run_id,
            time=self._clock(),
            step_key=task.step_key,
            attempt=task.attempt,
            output=out.output,
            compensation=task.compensation,
            round=task.round,
            started_at=started,
            worker=worker,
            logs=logs,
        )


class _Slots:
    """At most ``size`` attempts at a time, slots handed on first come, first served.

    Not an ``asyncio.Semaphore``: its ``acquire`` asks ``locked()``, which builds a
    generator on every call, and every attempt takes a slot. A slot given back goes
    straight to the oldest waiter (its future's result), so no newcomer overtakes it.
    """

    __slots__ = ("_free", "_waiters")

    def __init__(self, size: int) -> None:
        self._free = size
        self._waiters: deque[asyncio.Future[None]] = deque()

    def take(self) -> asyncio.Future[None] | None:
        """Take a free slot (None), or a future that ends when one is handed over; a
        waiter cancelled while it waits must call `forgo`."""
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return None
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        return waiter

    def forgo(self, waiter: asyncio.Future[None]) -> None:
        """A waiter gives up: a slot handed over to it just before is passed on."""
        if waiter.done() and not waiter.cancelled():
            self.give_back()
        else:
            waiter.cancel()

    def give_back(self) -> None:
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():  # (a cancelled one is)
                waiter.set_result(None)
                return
        self._free += 1
