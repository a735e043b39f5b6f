"""``decide(plan, state, event)``: the pure engine core.

Given a compiled plan, the run state and one event, ``decide`` advances the
state and returns the commands the runtime must carry out and the transitions
to record in the run's history. No I/O, no clock, no randomness: time comes in
with the event, jitter from a seed in the event, ids are derived from the run id.

How readiness stays incremental: when a step instance ends, only the steps that
depend on it are told (``joins.notify``), each keeps counters of its finished, ok and
skipped dependencies, and a scope keeps a count of its unfinished steps. No
event ever scans the whole run. Work that unlocks more work goes through two
queues (finished steps to propagate, ready steps to start) instead of recursion,
so a chain of 10,000 engine steps is handled in one flat loop.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from tideflow.core import attempts, fired, joins, reopen, saga
from tideflow.core import steps as kinds
from tideflow.core.engine_failure import fail_by_engine
from tideflow.core.retry import engine_error
from tideflow.core.scope import build_scope
from tideflow.core.tasks import cancel_task
from tideflow.core.timers import arm, disarm_all
from tideflow.errors import StepError
from tideflow.model import storable
from tideflow.model.commands import CancelChildRun, CancelTimer, Command, RunFinished
from tideflow.model.events import (
    AttemptEvent,
    CancelRequested,
    ChildRunFinished,
    EngineFailed,
    ErrorInfo,
    Event,
    RunRetried,
    RunStarted,
    SignalReceived,
    TaskCompleted,
    TaskFailed,
    TaskLost,
    TaskStarted,
    TimerFired,
    Transition,
    transition_of,
)
from tideflow.model.plan import Graph, OnError, Plan, StepSpec
from tideflow.model.run import RunState, ScopeState, StepState
from tideflow.model.states import (
    STEP_TERMINAL,
    STEP_TRANSITIONS,
    RunStatus,
    StepStatus,
    check_run_transition,
    check_step_transition,
)

_CANCELLED = StepStatus.CANCELLED
_FAILED = StepStatus.FAILED
_READY = StepStatus.READY
_RETRYING = StepStatus.RETRYING
_RUNNING = StepStatus.RUNNING
_SKIPPED = StepStatus.SKIPPED
_SUCCEEDED = StepStatus.SUCCEEDED
_WAITING = StepStatus.WAITING


_new_tuple = tuple.__new__


class Decision(NamedTuple):
    state: RunState
    commands: list[Command]
    transitions: list[Transition]
    changed: bool
    """False when the event changed nothing (a duplicate, a stale result): it need not be
    recorded."""


def decide(plan: Plan, state: RunState, event: Event) -> Decision:
    """Apply one event to a run. Applying the same event twice changes nothing."""
    decider = Decider(plan, state, event.time)
    decider.apply(event)
    changed = decider.touched or bool(decider.transitions) or bool(decider.commands)
    # tuple.__new__ as `transition_of`: the named tuple's own __new__ is a Python call
    return _new_tuple(Decision, (state, decider.commands, decider.transitions, changed))


class Decider:
    """The working set of one ``decide`` call."""

    def __init__(self, plan: Plan, state: RunState, now: float) -> None:
        self.plan = plan
        self.state = state
        self.now = now
        self.commands: list[Command] = []
        self.transitions: list[Transition] = []
        # Lists read through by index (`_drain`), not deques: one decide call fills a
        # few keys at most, and a list costs a third of a deque to make.
        self._finished: list[str] = []
        self._ready: list[str] = []
        self.touched = False
        """Set when the state changes without a transition (a signal kept for later)."""

    # -- dispatch on the event ------------------------------------------------

    def apply(self, event: Event) -> None:
        if isinstance(event, AttemptEvent):
            if event.round != self.state.retries and event.round is not None:
                return  # stale: an attempt of a round before the run's last operator retry
            if isinstance(event, TaskStarted):
                (saga.on_started if event.compensation else attempts.on_started)(self, event)
            elif isinstance(event, TaskCompleted):
                (saga.on_completed if event.compensation else attempts.on_completed)(self, event)
            elif isinstance(event, TaskFailed):
                (saga.on_failed if event.compensation else attempts.on_failed)(self, event)
            elif isinstance(event, TaskLost):
                (saga.on_lost if event.compensation else attempts.on_lost)(self, event)
        elif isinstance(event, TimerFired):
            fired.on_timer(self, event)
        elif isinstance(event, SignalReceived):
            kinds.on_signal(self, event)
        elif isinstance(event, ChildRunFinished):
            kinds.on_child_finished(self, event)
        elif isinstance(event, RunStarted):
            self._on_run_started(event)
        elif isinstance(event, CancelRequested):
            self.end_run_early(RunStatus.CANCELLED, event.reason)
        elif isinstance(event, RunRetried):
            reopen.retry_run(self, event)
        elif isinstance(event, EngineFailed):
            fail_by_engine(self, event)
        self._drain()

    def _drain(self) -> None:
        """Propagate every step that finished, then start the next ready one, in the
        order they came, until neither is left (each may add more of both)."""
        finished, ready = self._finished, self._ready
        done = started = 0
        while True:
            while done < len(finished):
                done += 1
                joins.propagate(self, finished[done - 1])
            if started == len(ready):
                return
            started += 1
            self._start(ready[started - 1])

    # -- run lifecycle ----------------------------------------------------------

    def _on_run_started(self, event: RunStarted) -> None:
        state = self.state
        if state.status is not RunStatus.PENDING:
            return
        state.input = event.input
        state.started_at = self.now
        state.parent_run_id = event.parent_run_id or state.parent_run_id
        state.parent_step_key = event.parent_step_key or state.parent_step_key
        self.set_run(RunStatus.RUNNING, "run started")
        if self.plan.timeout is not None:
            arm(self, "run_timeout", None, self.now + self.plan.timeout)
        self.open_scope("", None, None, "top", {}, self.plan.graph)

    def set_run(self, new: RunStatus, cause: str) -> None:
        state = self.state
        check_run_transition(state.status, new)
        self.record("run", state.status._value_, new._value_, cause)  # _value_: see set_step
        state.status = new

    def record(
        self, subject: str, old: str | None, new: str, cause: str, attempt: int | None = None
    ) -> None:
        """Add a state change to the run's history (``subject``: the run, a step instance
        or a step's compensation)."""
        self.transitions.append(transition_of((subject, old, new, self.now, cause, attempt)))

    def finish_run(self, status: RunStatus, cause: str) -> None:
        state = self.state
        self.set_run(status, cause)
        state.finished_at = self.now
        for timer_id in list(state.timers):
            del state.timers[timer_id]
            self.commands.append(CancelTimer(run_id=state.run_id, timer_id=timer_id))
        self.commands.append(
            RunFinished(
                run_id=state.run_id,
                status=status.value,
                output=state.output,
                error=state.error,
                parent_run_id=state.parent_run_id,
                parent_step_key=state.parent_step_key,
            )
        )

    def complete_run(self) -> None:
        plan, state = self.plan, self.state
        try:
            if plan.output is not None:
                state.output = plan.output.render(build_scope(state, "", self.now))
                storable.check(state.output, "the run's output")
            else:
                state.output = self._default_output()
        except StepError as exc:
            state.output = None
            self._fail_run(engine_error(exc.type_name, f"run output: {exc.message}"))
            return
        self.finish_run(RunStatus.SUCCEEDED, "every step finished")

    def _default_output(self) -> dict[str, Any]:
        steps = self.state.steps
        return {
            sink: steps[sink].output
            for sink in self.plan.graph.sinks
            if steps[sink].status is _SUCCEEDED
        }

    def _fail_run(self, error: ErrorInfo) -> None:
        state = self.state
        state.error = error
        compensate = state.compensate_requested or self.plan.on_failure is OnError.COMPENSATE
        if not compensate:
            self.finish_run(RunStatus.FAILED, f"{error.type}: {error.message}")
            return
        self.set_run(RunStatus.FAILED, f"{error.type}: {error.message}")
        saga.start(self)

    def end_run_early(self, status: RunStatus, cause: str) -> None:
        """Cancel or time out a run: stop everything that runs, compensate what completed
        (with ``on_failure: compensate``), then end it."""
        state = self.state
        if state.status not in (RunStatus.PENDING, RunStatus.RUNNING):
            return
        if "" in state.scopes:
            self._close_scope(state.scopes[""], cause)
        state.error = engine_error(
            "Cancelled" if status is RunStatus.CANCELLED else "TimeoutError", cause
        )
        if self.plan.on_failure is OnError.COMPENSATE and state.compensable:
            saga.start(self, ends=status)
        else:
            self.finish_run(status, cause)

    # -- step transitions -------------------------------------------------------

    def set_step(
        self, st: StepState, new: StepStatus, cause: str, attempt: int | None = None
    ) -> None:
        old = st.status
        if new not in STEP_TRANSITIONS[old]:  # (the table looked up here: a call less)
            check_step_transition(st.key, old, new)  # raises, naming the step
        st.status = new
        # ``_value_``, the member's value as an attribute: ``.value`` is an enum property
        # (two Python calls), and every step goes through here three times or more. As
        # `record`, written out (a call less).
        self.transitions.append(
            transition_of((st.key, old._value_, new._value_, self.now, cause, attempt))
        )
        if new in STEP_TERMINAL:
            st.finished_at = self.now
            if st.timers:
                disarm_all(self, st)
            self.state.scopes[st.scope].remaining -= 1
            self._finished.append(st.key)

    def succeed(self, st: StepState, output: Any, cause: str) -> None:
        state = self.state
        st.output = output
        st.error = None  # earlier attempts' errors stay in the history
        state.completed_seq += 1
        st.seq = state.completed_seq
        if self.plan.specs[st.step_id].compensate is not None:
            state.compensable.append(st.key)
        self.set_step(st, _SUCCEEDED, cause, st.attempts or None)

    def fail_step(self, st: StepState, error: ErrorInfo) -> None:
        """The step failed for good: apply its ``on_error``."""
        if st.status in STEP_TERMINAL:
            return
        st.error = error
        self.set_step(st, _FAILED, f"{error.type}: {error.message}", st.attempts or None)
        on_error = self.plan.specs[st.step_id].on_error
        if on_error is OnError.CONTINUE:
            return
        if on_error is OnError.COMPENSATE:
            self.state.compensate_requested = True
            self.fail_scope("", error)
        else:
            self.fail_scope(st.scope, error)

    def skip(self, st: StepState, cause: str) -> None:
        self.set_step(st, _SKIPPED, cause)

    def mark_ready(self, st: StepState, cause: str) -> None:
        self.set_step(st, _READY, cause)
        self._ready.append(st.key)

    # -- scopes -----------------------------------------------------------------

    def open_scope(
        self,
        prefix: str,
        parent: str | None,
        owner: str | None,
        kind: Any,
        variables: dict[str, Any],
        graph: Graph | None,
        single: StepState | None = None,
    ) -> ScopeState:
        """Create a scope and its pending step instances, and make its roots ready."""
        state = self.state
        scope = ScopeState(prefix=prefix, parent=parent, owner=owner, kind=kind, vars=variables)
        state.scopes[prefix] = scope
        if single is not None:
            state.steps[single.key] = single
            scope.keys.append(single.key)
            scope.remaining = 1
            self.mark_ready(single, "map item started")
            return scope
        assert graph is not None
        for step_id in graph.steps:
            key = prefix + step_id
            state.steps[key] = StepState(key=key, step_id=step_id, scope=prefix)
            scope.keys.append(key)
        scope.remaining = len(graph.steps)
        for root in graph.roots:
            self.mark_ready(state.steps[prefix + root], "no dependencies")
        return scope

    def fail_scope(self, prefix: str, error: ErrorInfo) -> None:
        state = self.state
        scope = state.scopes[prefix]
        if scope.closing:
            return
        self._close_scope(scope, f"stopped: {error.type} in this scope")
        if scope.kind == "top":
            if state.status is RunStatus.RUNNING:
                self._fail_run(error)
        elif scope.kind == "loop":
            assert scope.owner is not None
            self.fail_step(state.steps[scope.owner], error)
        else:
            assert scope.owner is not None
            kinds.map_item_done(self, state.steps[scope.owner], scope)

    def _close_scope(self, scope: ScopeState, cause: str) -> None:
        scope.closing = True
        steps = self.state.steps
        for key in scope.keys:
            st = steps[key]
            if st.status not in STEP_TERMINAL:
                self.cancel_step(st, cause)

    def reopen_scope(self, scope: ScopeState) -> None:
        """Run again the step instances of a scope that did not succeed (operator retry)."""
        reopen.reopen_scope(self, scope)

    def cancel_step(self, st: StepState, cause: str) -> None:
        self.stop_inner_work(st, cause)
        self.set_step(st, _CANCELLED, cause)

    def stop_inner_work(self, st: StepState, cause: str) -> None:
        """Stop what a step has started: its task, wait, loop iteration, map items, child run."""
        state = self.state
        spec = self.plan.specs[st.step_id]
        status = st.status
        if status in (_RUNNING, _RETRYING) and spec.is_action:
            self.commands.append(cancel_task(state, st.key, st.attempts))
        elif status is _WAITING and spec.wait is not None:
            kinds.unwait(self, st, spec.wait.signal)
        elif status is _RUNNING and spec.loop is not None:
            inner = state.scopes.get(f"{st.key}@{st.iteration}/")
            if inner is not None and not inner.closing:
                self._close_scope(inner, cause)
        elif status is _RUNNING and spec.map is not None and st.map is not None:
            self.cancel_map_items(st, cause)
        elif status is _RUNNING and st.child_run_id and spec.subflow is not None:
            self.commands.append(CancelChildRun(run_id=state.run_id, child_run_id=st.child_run_id))

    def cancel_map_items(self, st: StepState, cause: str) -> None:
        scopes = self.state.scopes
        assert st.map is not None
        for index in range(st.map.next_index):
            item = scopes[f"{st.key}[{index}]/"]
            if not item.closing and item.remaining:
                self._close_scope(item, cause)

    def scope_done(self, scope: ScopeState) -> None:
        if scope.kind == "top":
            if self.state.status is RunStatus.RUNNING:
                self.complete_run()
            return
        assert scope.owner is not None
        owner = self.state.steps[scope.owner]
        if scope.kind == "loop":
            kinds.loop_iteration_done(self, owner, scope)
        else:
            kinds.map_item_done(self, owner, scope)

    # -- starting steps ---------------------------------------------------------

    def _start(self, key: str) -> None:
        state = self.state
        st = state.steps[key]
        if st.status is not _READY or state.scopes[st.scope].closing:
            return
        spec: StepSpec = self.plan.specs[st.step_id]
        st.started_at = self.now
        if spec.join.cancel_others:
            self._cancel_other_dependencies(st, spec)
        try:
            kinds.start_step(self, st, spec)
        except StepError as exc:  # an expression that fails, a value that cannot be stored
            if st.status not in STEP_TERMINAL:
                self.fail_step(st, engine_error(exc.type_name, exc.message))

    def _cancel_other_dependencies(self, st: StepState, spec: StepSpec) -> None:
        steps = self.state.steps
        for dep_id in spec.depends_on:
            dep = steps[st.scope + dep_id]
            if dep.status not in STEP_TERMINAL:
                self.cancel_step(dep, f"'{spec.id}' joined on another dependency (cancel_others)")
