"""Reporting that a worker started an attempt (``TaskStarted``), cheaply.

The start is what an attempt's ``timeout`` counts from, for compensation attempts as for
action attempts: it carries the time the attempt started. A start is sent once it is
``REPORT_DELAY`` old (5 ms), in one batch with every other start due by then, beside the
other events. An attempt that ends before its start went out (a ``noop``, a quick sync
function, an executor that fails at once) sends no separate start: the outcome carries
it (``started_at``), so such a step costs one event, not two. An ``idempotent: false``
step is different: its start is committed before it runs (``start_durably``), never
batched or folded into the outcome. So is the start of a task the bus delivered again
(``delivery`` > 1: the worker that held it died or handed it back): it goes out at once
with its delivery count, so that the history records that the attempt runs again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Awaitable, Callable

from tideflow.bus.base import NO_HEADERS, Bus, Headers, Message
from tideflow.model.commands import DispatchTask
from tideflow.model.events import Event, TaskStarted

log = logging.getLogger("tideflow.worker")

Key = tuple[str, str, int, int, bool]
"""An attempt: run id, step key, round, attempt number (a retried run numbers its attempts
from 1 again, in a new round) and compensation (an attempt of the step's compensation, not
of its action: their numbers are counted apart)."""
REPORT_DELAY = 0.005
"""Seconds a start waits to be sent with others, or to be folded into its outcome: a
quick sync function costs one event instead of two. The start time it carries is taken
when the attempt starts, whenever it is sent. A crash before it is sent leaves the attempt
"dispatched" rather than "started": recovery dispatches it again with the same attempt
and idempotency key, as it would a lost one."""
StartDurably = Callable[[TaskStarted], Awaitable[bool]]


def attempt_key(task: DispatchTask) -> Key:
    return (task.run_id, task.step_key, task.round, task.attempt, task.compensation)


class StartReports:
    def __init__(
        self,
        bus: Bus,
        *,
        clock: Callable[[], float],
        new_event_id: Callable[[], str],
        start_durably: StartDurably | None,
    ) -> None:
        self._bus = bus
        self._clock = clock
        self._new_id = new_event_id
        self._start_durably = start_durably
        self.worker = f"{socket.gethostname()}/{os.getpid()}"
        self._unsent: dict[Key, tuple[float, float, Headers]] = {}
        """Attempts started and not reported yet -> when they started (clock time), when
        the start is due to be sent (event-loop time) and the headers of its report, oldest
        first."""
        self._timer: asyncio.TimerHandle | None = None
        self._sending: asyncio.Task[None] | None = None

    async def report(
        self, task: DispatchTask, delivery: int = 1, headers: Headers = NO_HEADERS
    ) -> bool:
        """Report that ``task`` starts (delivered ``delivery`` times); False when it must
        not run (its start was refused: stale, or a duplicate of an attempt already started
        elsewhere). A start sent with others carries ``headers`` as they are when it goes
        out (the attempt's ``report_headers``, filled in as the attempt begins); one sent
        at once (durable, or redelivered) goes before the attempt began and carries none."""
        key = attempt_key(task)
        if not task.idempotent and self._start_durably is not None:
            return await self._start_durably(self._event(key, self._clock(), delivery))
        if delivery > 1:
            try:
                await self._bus.publish_events([self._event(key, self._clock(), delivery)])
                return True
            except Exception:  # a fact for the history: the attempt runs all the same
                log.exception("the start of redelivered %s could not be reported", key)
        self.later(task, headers, key=key)
        return True

    def at_once(self, task: DispatchTask, delivery: int = 1) -> bool:
        """Whether the start of ``task`` must be reported before it runs (`report`); when not,
        `later` records it (no coroutine: that is every other attempt's path)."""
        return delivery > 1 or (not task.idempotent and self._start_durably is not None)

    def later(
        self,
        task: DispatchTask,
        headers: Headers = NO_HEADERS,
        loop: asyncio.AbstractEventLoop | None = None,
        key: Key | None = None,
    ) -> None:
        """Record that ``task`` starts now; the start goes out once ``REPORT_DELAY`` old,
        unless its outcome carries it first, with ``headers`` as they are by then.
        ``loop`` is the running one and ``key`` the task's `attempt_key`, when the caller
        knows them (the pool does: every attempt comes this way)."""
        loop = loop or asyncio.get_running_loop()
        due = loop.time() + REPORT_DELAY
        self._unsent[key or attempt_key(task)] = (self._clock(), due, headers)
        if self._timer is None:
            self._timer = loop.call_at(due, self._flush)

    def take(self, key: Key) -> float | None:
        """When the attempt (its `attempt_key`) started, if that has not been sent yet (its
        outcome carries it)."""
        started = self._unsent.pop(key, None) if self._unsent else None
        return None if started is None else started[0]

    def _event(self, key: Key, time: float, delivery: int = 1) -> TaskStarted:
        run_id, step_key, round_, attempt, compensation = key
        return TaskStarted(
            delivery=delivery,
            event_id=self._new_id(),
            run_id=run_id,
            time=time,
            step_key=step_key,
            attempt=attempt,
            worker=self.worker,
            compensation=compensation,
            round=round_,
        )

    def sending(self) -> asyncio.Future[None] | None:
        """What to wait for until every start reported so far is published (an outcome
        never overtakes its start); None when they are (no coroutine: that is the path of
        most outcomes)."""
        sending = self._sending
        if sending is None or sending.done():
            return None
        return asyncio.shield(sending)

    def _flush(self) -> None:
        """Send the starts that are due; wait for the others."""
        self._timer = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        due_keys: list[Key] = []
        for key, (_, due, _) in self._unsent.items():
            if due > now:
                self._timer = loop.call_at(due, self._flush)
                break
            due_keys.append(key)
        events = [self._report(key, *self._unsent.pop(key)) for key in due_keys]
        if events:
            self._sending = loop.create_task(self._send(self._sending, events))

    def _report(
        self, key: Key, time: float, _due: float, headers: Headers
    ) -> TaskStarted | Message[Event]:
        event = self._event(key, time)
        return Message(event, headers) if headers else event

    async def _send(
        self, previous: asyncio.Task[None] | None, events: list[TaskStarted | Message[Event]]
    ) -> None:
        if previous is not None and not previous.done():
            await asyncio.shield(previous)  # starts go out in the order they happened
        try:
            await self._bus.publish_events(events)
        except Exception:
            log.exception("%d attempt start(s) could not be reported", len(events))
