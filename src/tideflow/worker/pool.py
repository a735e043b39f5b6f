"""The worker pool: takes tasks from the bus, runs their executor, reports the result.

Before it runs an attempt the pool reports its start (`starts`): the attempt's
``timeout`` counts from there. The attempt itself goes through the interceptor chain
(worker/interceptors.py: secrets and redaction, the output limit, fault points, then
the executor), which takes one ``ExecuteInput`` and returns one ``ExecuteOutput``.

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
from collections.abc import Callable, Sequence

from tideflow.bus.base import Bus
from tideflow.model import storable
from tideflow.model.commands import DispatchTask
from tideflow.model.events import Event, TaskCompleted, TaskFailed
from tideflow.worker.executors.base import StepContext
from tideflow.worker.executors.registry import ExecutorRegistry
from tideflow.worker.interceptors import ExecuteInput, Interceptor, build_chain, failure
from tideflow.worker.secrets import SecretProvider, default_provider
from tideflow.worker.starts import StartDurably, StartReports

log = logging.getLogger("tideflow.worker")

_MAX_REMEMBERED_CANCELS = 10_000


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
        interceptors: Sequence[Interceptor] = (),
    ) -> None:
        self._bus = bus
        self._starts = StartReports(
            bus, clock=clock, new_event_id=new_event_id, start_durably=start_durably
        )
        self._concurrency = concurrency
        self._clock = clock
        self._new_id = new_event_id
        self._chain = build_chain(
            executors,
            secrets=secrets or default_provider(),
            max_output=max_output,
            interceptors=interceptors,
        )
        self._loops: list[asyncio.Task[None]] = []
        self._running: dict[tuple[str, str, int], asyncio.Task[Event | None]] = {}
        self._cancelled: dict[tuple[str, str, int], None] = {}
        """Attempts cancelled before a worker picked them up (bounded, oldest dropped)."""
        self._closing = False
        self._random = random.Random()

    def start(self) -> None:
        self._loops = [
            asyncio.create_task(self._loop(), name=f"tideflow-worker-{i}")
            for i in range(self._concurrency)
        ]

    async def close(self) -> None:
        self._closing = True
        for task in self._loops:
            task.cancel()
        for task in self._loops:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._loops.clear()

    def cancel(self, run_id: str, step_key: str, attempt: int) -> None:
        """Stop an attempt the scheduler no longer waits for."""
        key = (run_id, step_key, attempt)
        task = self._running.get(key)
        if task is not None:
            task.cancel()
            return
        self._cancelled[key] = None
        if len(self._cancelled) > _MAX_REMEMBERED_CANCELS:
            del self._cancelled[next(iter(self._cancelled))]

    def forget_cancels(self, run_id: str) -> None:
        """Forget the cancels remembered for a run's attempts (an operator retry numbers
        its attempts from 1 again: they are new work, not the cancelled attempts)."""
        for key in [key for key in self._cancelled if key[0] == run_id]:
            del self._cancelled[key]

    async def _loop(self) -> None:
        bus = self._bus
        while True:
            task = await bus.next_task()
            key = (task.run_id, task.step_key, task.attempt)
            if key in self._cancelled:
                del self._cancelled[key]
                continue  # cancelled while it was queued
            inner = asyncio.create_task(self._execute(task))
            self._running[key] = inner
            try:
                event = await inner
            except asyncio.CancelledError:
                event = None  # only this attempt was cancelled (CancelTask)
            finally:
                self._running.pop(key, None)
            current = asyncio.current_task()
            if self._closing or (current is not None and current.cancelling()):
                # The pool is shutting down: the attempt swallowed our cancellation.
                raise asyncio.CancelledError
            if event is not None:
                await self._starts.sent()
                await bus.publish_events([event])

    async def _execute(self, task: DispatchTask) -> Event | None:
        ctx = StepContext(
            run_id=task.run_id,
            step_id=task.step_id,
            step_key=task.step_key,
            attempt=task.attempt,
            idempotency_key=task.idempotency_key,
            timeout=task.timeout,
        )
        try:
            if not await self._starts.report(task):
                return None  # the attempt is no longer wanted: it must not run
            out = await self._chain.execute(
                ExecuteInput(task=task, context=ctx, config=task.config, input=task.input)
            )
        except asyncio.CancelledError:
            return None
        except KeyboardInterrupt:  # Ctrl-C reaches the loop here; the python executor
            raise  # turns one that user code raises into a step error itself
        except BaseException as exc:  # SystemExit and the like, or an interceptor's own
            out = failure(exc)  # failure: they fail the step, not the worker
        started = self._starts.take(task)
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
                started_at=started,
                worker=worker,
            )
        return TaskCompleted(
            event_id=self._new_id(),
            run_id=task.run_id,
            time=self._clock(),
            step_key=task.step_key,
            attempt=task.attempt,
            output=out.output,
            compensation=task.compensation,
            started_at=started,
            worker=worker,
        )
