"""The acknowledged relay: carries out what a committed batch asks for, until it succeeds.

After the scheduler commits a batch it hands the batch here. Each command becomes an
*effect* (publish these tasks, tell the parent its child finished, start a child run,
publish a fired timer, cancel an attempt, …). An effect is done only when it succeeded:
then, if it came from the outbox, its outbox id is *acknowledged* and the next commit
forgets it (``relayed`` / ``forgotten``), or, when no commit comes (a quiet engine), one
of its own soon after (``on_relayed``, runtime/scheduler.py): the outbox of a quiet store
holds only what is really unrelayed. An effect that fails stays pending and is tried
again after a backoff (50 ms doubling to 5 s), as often as it takes; ``pending`` counts
them. Nothing is dropped: an effect still pending when the engine stops is either in the
outbox (relayed again by recovery) or re-derived from the run state on recovery (tasks,
timers, cancellations).

What the relay is still carrying out is visible by key (``busy``, ``owed``): the
reconciliation sweep (runtime/sweep.py) repairs only what no effect here is already
trying, so a row the relay is retrying is not relayed a second time beside it.

The runs whose end a relayed batch carries (its ``RunFinished`` commands, from a commit,
or from the outbox on recovery) are announced on the bus in one ``publish_run_ends``
(cluster clients' ``wait`` hears them, runtime/remote.py), when the bus says one may
hear them (``Bus.run_ends_heard``: always on a broker, never in an embedded engine with
no cluster client). It is best-effort: a failure is not tried again (a waiter reads the
store every few seconds), and only the first of a row of failures is logged.

Listeners are observers: they are called after the batch was relayed, one by one, and
an exception in one is logged with its run and listener and affects neither the run nor
the other listeners.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tideflow import logcontext
from tideflow.bus.base import (
    NO_HEADERS,
    Bus,
    CancelAttempt,
    Headers,
    Message,
    RunEnded,
    with_headers,
)
from tideflow.errors import StoreUnavailable, TideflowError
from tideflow.model.commands import (
    CancelChildRun,
    CancelTask,
    CancelTimer,
    Command,
    DispatchTask,
    EmitEvent,
    RunFinished,
    StartChildRun,
    StartTimer,
)
from tideflow.model.events import (
    CancelRequested,
    ChildRunFinished,
    ErrorInfo,
    Event,
    SignalReceived,
    TimerFired,
    Transition,
)
from tideflow.model.run import RunState
from tideflow.model.states import RunStatus
from tideflow.runtime.catalog import started_event
from tideflow.runtime.clock import Clock
from tideflow.runtime.intake import waits_started
from tideflow.runtime.observers import Observers
from tideflow.runtime.timers import TimerWheel
from tideflow.store.base import AppliedEvent

log = logging.getLogger("tideflow.relay")

Listener = Callable[[RunState, Sequence[Transition]], None]
EventSink = Callable[[dict[str, Any]], Any]

_NONE: Mapping[int, str] = {}
FIRST_DELAY = 0.05
MAX_DELAY = 5.0


class Runs(ABC):
    """What the relay needs from the engine around it (the engine implements it)."""

    @abstractmethod
    async def finished(self, command: RunFinished) -> None:
        """A run ended: give its result to whoever waits for it (never fails)."""

    @abstractmethod
    async def start_child(self, command: StartChildRun) -> RunState:
        """Create the child run (idempotent by its id) and return its state; raises a
        ``TideflowError`` when it cannot be started (no such workflow, bad input)."""


@dataclass(slots=True, eq=False)
class Effect:
    """One thing to do for a committed batch, tried until it succeeds."""

    what: str
    run_id: str
    act: Callable[[], Awaitable[None]]
    outbox_id: str | None = None
    key: str | None = None
    """What the sweep knows it by while it is not done (``timer_key``, ``start_key``); an
    outbox effect is known by its ``outbox_id``."""
    tries: int = 0


class Relay:
    def __init__(
        self,
        *,
        bus: Bus,
        timers: TimerWheel,
        runs: Runs,
        waiting_for: Callable[
            [str, Any], Awaitable[list[str]]
        ],  # (name, payload) -> runs (Correlator.candidates)
        clock: Clock,
        new_event_id: Callable[[], str],
        listeners: list[Listener],
        sinks: list[EventSink],
        observers: Observers | None = None,
        early: Callable[[str, list[str]], Awaitable[None]] | None = None,
    ) -> None:
        """``early(run_id, wait_rows)``: hand a run whose waits started the events
        buffered for them (runtime/intake.py ``hand_buffered``)."""
        self._bus = bus
        self._early = early
        self._observers = observers if observers is not None else Observers()
        self._timers = timers
        self._runs = runs
        self._waiting_for = waiting_for
        self._clock = clock
        self._new_id = new_event_id
        self._listeners = listeners
        self._sinks = sinks
        self._relayed: list[str] = []
        self.on_relayed: Callable[[], None] | None = None
        """Called when an effect from the outbox was relayed (the scheduler has the store
        forget it soon, should no commit come to do it)."""
        self._pending: set[Effect] = set()
        self._busy: Counter[str] = Counter()
        """Keys of the effects not done yet (first try running, or waiting to try again)."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self._unannounced = 0
        """Batches of run ends not announced since the last one that was (bus failures)."""
        self.task_headers: Callable[[DispatchTask], Headers] | None = None
        """The headers of each task published (the run's trace context, when tracing is
        on); None publishes bare tasks."""
        self.run_headers: Callable[[str], Headers] | None = None
        """The headers of the signals a run's ``emit`` sends to other runs (the emitting
        run's trace context, when tracing is on); None publishes them bare."""

    # -- what others read -------------------------------------------------------

    @property
    def pending(self) -> int:
        """Effects that have failed and wait to be tried again (or are being tried)."""
        return len(self._pending)

    def pending_for(self, run_id: str) -> list[tuple[str, int]]:
        """The run's effects that failed and wait to be tried again: (what, tries so far)."""
        return sorted((e.what, e.tries) for e in self._pending if e.run_id == run_id)

    @property
    def relayed(self) -> list[str]:
        """Outbox ids whose effect succeeded and that the store has not forgotten yet."""
        return self._relayed

    def forgotten(self, count: int) -> None:
        """The store forgot the first ``count`` ids of ``relayed`` (a commit took them)."""
        del self._relayed[:count]

    def busy(self, key: str) -> bool:
        """Whether an effect known by ``key`` (``timer_key``, ``start_key``, an outbox id) is
        being carried out: its first try runs, or it waits to be tried again."""
        return self._busy[key] > 0

    def owed(self) -> set[str]:
        """The outbox ids this relay still answers for: handed to it and not yet forgotten
        by the store (being tried, or done and waiting for the next commit to forget
        them). A copy: read it *before* reading the outbox, so a row the relay finished and
        the store forgot in between is not in the rows read."""
        return set(self._busy) | set(self._relayed)

    def close(self) -> None:
        """Stop trying: what is still pending is relayed again by the next recovery."""
        self._closed = True
        for task in list(self._tasks):
            task.cancel()

    # -- after a commit ---------------------------------------------------------

    async def hand(
        self, batch: Sequence[AppliedEvent], *, observe: bool = True, act: bool = True
    ) -> None:
        """Relay a committed batch, then tell the listeners (unless not ``observe``). With
        ``act=False`` nothing is relayed (a client recording events for the next engine,
        which carries their effects out on recovery): only the listeners hear of it."""
        commands: list[Command] = []
        outbox: dict[int, str] = {}
        for applied in batch if act else ():
            if applied.commands:
                _outbox_ids(applied, len(commands), outbox)
                commands.extend(applied.commands)
        if commands:
            await self.relay(commands, outbox)
        if act and self._early is not None:
            await self._take_early(batch)
        if observe and self._listeners:
            for applied in batch:
                self._observe(applied.state, applied.transitions)
        if observe and self._observers:
            self._observers.applied(batch, self._clock.now())

    async def relay(self, commands: Sequence[Command], outbox: Mapping[int, str] = _NONE) -> None:
        """Carry out ``commands``; ``outbox[i]`` is the outbox id of ``commands[i]`` if any."""
        tasks: list[DispatchTask] = []
        ends: list[RunEnded] = []
        for index, command in enumerate(commands):
            if isinstance(command, DispatchTask):
                tasks.append(command)
            elif isinstance(command, StartTimer):
                self._timers.arm(command.run_id, command.timer_id, command.fire_at)
            elif isinstance(command, CancelTimer):
                self._timers.cancel(command.run_id, command.timer_id)
            elif isinstance(command, CancelTask):
                if not _drop_task(tasks, command):
                    await self._run(self._cancel_effect(command))
            else:
                if isinstance(command, RunFinished):
                    ends.append(RunEnded(command.run_id, command.status))
                effect = self._effect(command)
                if effect is not None:
                    effect.outbox_id = effect.key = outbox.get(index)
                    await self._run(effect)
        if tasks:
            await self._run(self._tasks_effect(tasks))
        if ends and self._bus.run_ends_heard:
            await self._announce(ends)

    async def _take_early(self, batch: Sequence[AppliedEvent]) -> None:
        """The runs whose waits started take the events buffered for them (retried)."""
        early = self._early
        assert early is not None
        for applied in batch:
            if not applied.state.waiting:  # no wait step waits: none started (most events)
                continue
            rows = waits_started(applied.state, applied.transitions)
            if rows:
                run_id = applied.state.run_id
                await self._run(
                    Effect("take buffered events", run_id, functools.partial(early, run_id, rows))
                )

    async def _announce(self, ends: list[RunEnded]) -> None:
        """Publish run ends once (see the module docstring); a failure is logged only when
        it starts a row of failures, and the end of the row says how many were lost."""
        try:
            await self._bus.publish_run_ends(ends)
        except Exception as exc:
            self._unannounced += 1
            if self._unannounced == 1:
                log.warning(
                    "announcing %d run end(s) failed (%s: %s); not tried again: cluster "
                    "clients waiting for them read the store (this is logged once until "
                    "announcing works again)",
                    len(ends),
                    type(exc).__name__,
                    exc,
                )
            return
        if self._unannounced:
            log.info(
                "announcing run ends works again (%d batch(es) of them were not announced)",
                self._unannounced,
            )
            self._unannounced = 0

    async def send(
        self, events: Sequence[Event], what: str = "events", *, key: str | None = None
    ) -> None:
        """Publish events to the engine, retried until the bus takes them; ``key`` names the
        effect for ``busy`` while it is not done."""
        if events:
            effect = self._publish(what, events[0].run_id, list(events))
            effect.key = key
            await self._run(effect)

    def timer_fired(self, run_id: str, timer_id: str) -> None:
        """The wheel's callback: publish the ``TimerFired`` (retried like any effect)."""
        event = TimerFired(
            event_id=f"{run_id}:{timer_id}:{self._new_id()}",
            run_id=run_id,
            time=self._clock.now(),
            timer_id=timer_id,
        )
        effect = self._publish(f"timer {timer_id}", run_id, [event])
        effect.key = timer_key(run_id, timer_id)
        self._busy[effect.key] += 1  # from now: the first try is only scheduled
        self._spawn(effect, 0.0)

    # -- effects ----------------------------------------------------------------

    def _effect(self, command: Command) -> Effect | None:
        if isinstance(command, RunFinished):
            return Effect("run finished", command.run_id, lambda: self._finished(command))
        if isinstance(command, StartChildRun):
            return Effect(
                f"start child run {command.child_run_id}",
                command.run_id,
                lambda: self._start_child(command),
            )
        if isinstance(command, CancelChildRun):
            event = CancelRequested(
                event_id=self._new_id(),
                run_id=command.child_run_id,
                time=self._clock.now(),
                reason=f"parent run {command.run_id} stopped",
            )
            return self._publish(
                f"cancel child run {command.child_run_id}", command.run_id, [event]
            )
        if isinstance(command, EmitEvent):
            return self._emit(command)
        return None

    def _tasks_effect(self, tasks: list[DispatchTask]) -> Effect:
        headers = self.task_headers
        messages: Sequence[DispatchTask | Message[DispatchTask]] = (
            tasks if headers is None else [Message(task, headers(task)) for task in tasks]
        )

        async def act() -> None:
            await self._bus.publish_tasks(messages)

        return Effect(f"dispatch {len(tasks)} task(s)", tasks[0].run_id, act)

    def _cancel_effect(self, command: CancelTask) -> Effect:
        async def act() -> None:
            await self._bus.publish_control(
                CancelAttempt(
                    run_id=command.run_id,
                    step_key=command.step_key,
                    attempt=command.attempt,
                    round=command.round,
                    compensation=command.compensation,
                )
            )

        return Effect(f"cancel {command.step_key} attempt {command.attempt}", command.run_id, act)

    def _publish(self, what: str, run_id: str, events: list[Event]) -> Effect:
        async def act() -> None:
            await self._bus.publish_events(events)

        return Effect(what, run_id, act)

    async def _finished(self, command: RunFinished) -> None:
        await self._runs.finished(command)
        if command.parent_run_id and command.parent_step_key:
            await self._bus.publish_events(
                [
                    _child_finished(
                        command.run_id,
                        command.parent_run_id,
                        command.parent_step_key,
                        self._clock.now(),
                        command.status,
                        command.output,
                        command.error,
                    )
                ]
            )

    async def _start_child(self, command: StartChildRun) -> None:
        try:
            child = await self._runs.start_child(command)
        except StoreUnavailable:
            raise  # the store will be back: the effect is tried again (the child's key
            # finds the run a failed try may have created), the parent must not fail
        except TideflowError as exc:
            await self._child_not_started(command, exc)
            return
        if child.status is RunStatus.PENDING:  # new, or created before a failed publish
            await self._bus.publish_events([started_event(child, self._clock.now())])
        elif command.wait and child.is_terminal:
            # It ended already (a restart re-issued the start): tell the parent again.
            event = _child_finished(
                child.run_id,
                command.run_id,
                command.step_key,
                self._clock.now(),
                child.status.value,
                child.output,
                child.error,
            )
            await self._bus.publish_events([event])

    async def _child_not_started(self, command: StartChildRun, exc: TideflowError) -> None:
        if not command.wait:
            log.error(
                "run %s: async child %s could not start: %s", command.run_id, command.workflow, exc
            )
            return
        error = ErrorInfo(type=type(exc).__name__, message=exc.message, retryable=False)
        event = _child_finished(
            command.child_run_id,
            command.run_id,
            command.step_key,
            self._clock.now(),
            "failed",
            None,
            error,
        )
        await self._bus.publish_events([event])

    def _emit(self, command: EmitEvent) -> Effect:
        event = command.event
        name = str(event.get("type"))
        now = self._clock.now()
        headers = NO_HEADERS if self.run_headers is None else self.run_headers(command.run_id)

        async def act() -> None:
            # the batch that emitted is committed, so the store's waits are current
            deliveries: list[Event] = [
                SignalReceived(
                    event_id=f"{event['id']}>{run_id}",
                    run_id=run_id,
                    time=now,
                    name=name,
                    payload=event,
                    buffer=False,
                )
                for run_id in await self._waiting_for(name, event)
                if run_id != command.run_id
            ]
            if deliveries:
                await self._bus.publish_events(with_headers(deliveries, headers))
            await self._to_sinks(event)

        return Effect(f"emit {name}", command.run_id, act)

    async def _to_sinks(self, event: dict[str, Any]) -> None:
        for sink in self._sinks:
            try:
                outcome = sink(event)
                if asyncio.iscoroutine(outcome):
                    await outcome
            except Exception:
                log.exception("event sink failed for event %s", event.get("id"))

    # -- trying, acknowledging, trying again ------------------------------------

    async def _run(self, effect: Effect) -> bool:
        if effect.key is not None and effect.tries == 0 and effect not in self._pending:
            self._busy[effect.key] += 1
        about = logcontext.run_id.set(effect.run_id)  # its log lines (and _failed's) are the run's
        try:
            await effect.act()
        except Exception as exc:
            self._failed(effect, exc)
            return False
        finally:
            logcontext.run_id.reset(about)
        if effect.key is not None:  # done: relayed (if from the outbox) in the same step
            self._busy[effect.key] -= 1
            if not self._busy[effect.key]:
                del self._busy[effect.key]
        if effect.outbox_id is not None:
            self._relayed.append(effect.outbox_id)
            if self.on_relayed is not None:
                self.on_relayed()
        return True

    def _failed(self, effect: Effect, exc: Exception) -> None:
        effect.tries += 1
        if self._observers:
            self._observers.effect_failed(effect.what, effect.run_id, exc)
        delay = min(FIRST_DELAY * 2 ** (effect.tries - 1), MAX_DELAY)
        log.warning(
            "run %s: %s failed (%s: %s), try %d; trying again in %.2fs",
            effect.run_id,
            effect.what,
            type(exc).__name__,
            exc,
            effect.tries,
            delay,
        )
        self._spawn(effect, delay)

    def _spawn(self, effect: Effect, delay: float) -> None:
        if self._closed:
            return
        self._pending.add(effect)
        task = asyncio.get_running_loop().create_task(self._later(effect, delay))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _later(self, effect: Effect, delay: float) -> None:
        if delay:
            await asyncio.sleep(delay)
        if await self._run(effect):
            self._pending.discard(effect)

    # -- listeners --------------------------------------------------------------

    def _observe(self, state: RunState, transitions: Sequence[Transition]) -> None:
        for listener in self._listeners:
            try:
                listener(state, transitions)
            except Exception:
                log.exception(
                    "run %s: listener %s failed (the run carries on)",
                    state.run_id,
                    getattr(listener, "__qualname__", repr(listener)),
                    extra={"run_id": state.run_id},
                )


def _outbox_ids(applied: AppliedEvent, offset: int, into: dict[int, str]) -> None:
    """Put the outbox ids of ``applied``'s commands into ``into``, by their index + offset
    (the ids ``AppliedEvent.outbox`` gives them)."""
    entries = iter(applied.outbox)
    entry = next(entries, None)
    for index, command in enumerate(applied.commands):
        if entry is None:
            return
        if command is entry[1]:
            into[offset + index] = entry[0]
            entry = next(entries, None)


def _drop_task(tasks: list[DispatchTask], cancel: CancelTask) -> bool:
    """Remove a task dispatched and cancelled in the same batch; True if it was there."""
    for index, task in enumerate(tasks):
        if (task.run_id, task.step_key, task.attempt) == (
            cancel.run_id,
            cancel.step_key,
            cancel.attempt,
        ):
            del tasks[index]
            return True
    return False


def _child_finished(
    child: str,
    parent: str,
    step_key: str,
    now: float,
    status: str,
    output: Any,
    error: ErrorInfo | None,
) -> ChildRunFinished:
    return ChildRunFinished(
        event_id=f"{child}:finished",
        run_id=parent,
        time=now,
        step_key=step_key,
        child_run_id=child,
        status=status,
        output=output,
        error=error,
    )


def timer_key(run_id: str, timer_id: str) -> str:
    """The key of the effect that publishes a fired timer (``Relay.busy``)."""
    return f"timer {run_id} {timer_id}"


def start_key(run_id: str) -> str:
    """The key of the effect that publishes a stored run's start (``Relay.busy``)."""
    return f"start {run_id}"
