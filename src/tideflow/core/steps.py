"""How each step type starts and finishes inside ``decide``.

Action steps become ``DispatchTask`` commands; engine steps (set, switch, wait,
sleep, map, loop, subflow, emit) are decided here without a worker.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from tideflow.core.attempts import dispatch
from tideflow.core.maps import arm_step_timeout, map_item_done, resume_map, start_map
from tideflow.core.retry import engine_error
from tideflow.core.scope import build_scope, iso
from tideflow.core.tasks import child_run
from tideflow.core.timers import arm
from tideflow.errors import ExpressionEvaluationError
from tideflow.model import storable
from tideflow.model.commands import EmitEvent
from tideflow.model.events import ChildRunFinished, SignalReceived
from tideflow.model.expressions import Expression
from tideflow.model.plan import Correlation, Plan, StepSpec, correlation_row
from tideflow.model.run import BufferedSignal, ScopeState, StepState
from tideflow.model.states import STEP_TERMINAL, RunStatus, StepStatus

if TYPE_CHECKING:
    from tideflow.core.decide import Decider

_RUNNING = StepStatus.RUNNING
_WAITING = StepStatus.WAITING


def start_step(d: Decider, st: StepState, spec: StepSpec) -> None:
    """Start a READY step: evaluate ``when``, resolve ``input``, then act by type."""
    scope = (
        _EMPTY if spec.constant_action else build_scope(d.state, st.scope, d.now, instance=st.key)
    )
    if spec.when is not None and not spec.when.evaluate(scope):
        d.skip(st, f"when is false: {spec.when.source}")
        return
    if spec.input is not None:
        rendered = spec.input.render(scope)
        storable.check(rendered, f"the input of step {st.key!r}")
        st.input = rendered
    if spec.is_action:
        dispatch(d, st, spec, scope)
        return
    _ENGINE_STARTERS[spec.type](d, st, spec, scope)
    if spec.timeout is not None and spec.wait is None and st.status not in STEP_TERMINAL:
        arm(d, "step_timeout", st, d.now + spec.timeout)


_EMPTY: dict[str, Any] = {}


# -- engine steps ---------------------------------------------------------------


def _start_set(d: Decider, st: StepState, spec: StepSpec, scope: dict[str, Any]) -> None:
    values = spec.set_values.render(scope) if spec.set_values is not None else {}
    storable.check(values, f"the values of set step {st.key!r}")
    d.succeed(st, values, "values computed")


def _start_switch(d: Decider, st: StepState, spec: StepSpec, scope: dict[str, Any]) -> None:
    switch = spec.switch
    assert switch is not None
    for index, case in enumerate(switch.cases):
        if case.when.evaluate(scope):
            d.succeed(
                st,
                {"case": index, "next": list(case.next)},
                f"case {index} matched: {case.when.source}",
            )
            return
    if switch.default is None:
        d.fail_step(
            st, engine_error("NoMatchingCase", "no case matched and the switch has `default: fail`")
        )
        return
    d.succeed(st, {"case": "default", "next": list(switch.default)}, "no case matched: default")


def _start_wait(d: Decider, st: StepState, spec: StepSpec, scope: dict[str, Any]) -> None:
    wait = spec.wait
    assert wait is not None
    d.set_step(st, _WAITING, f"waiting for signal '{wait.signal}'")
    state = d.state
    if state.signals:
        _drop_expired_signals(d)
    for buffered in state.signals:
        if buffered.name == wait.signal and _matches(d, st, buffered.payload):
            state.signals.remove(buffered)
            d.succeed(st, buffered.payload, f"signal '{wait.signal}' (received earlier)")
            return
    state.waiting.setdefault(wait.signal, []).append(st.key)
    if wait.correlation is not None:
        _correlate(d, st, wait.signal, wait.correlation, scope)
    if wait.timeout is not None:
        arm(d, "wait_timeout", st, d.now + wait.timeout)


def _correlate(
    d: Decider, st: StepState, name: str, correlation: Correlation, scope: dict[str, Any]
) -> None:
    """Index the wait under its correlation row; a key that cannot be evaluated (or
    held) leaves it found by name."""
    try:
        value = correlation.key.evaluate(scope)
    except ExpressionEvaluationError:
        return
    row = correlation_row(name, correlation.path, value)
    if row is not None:
        d.state.correlated[st.key] = row


def _matches(d: Decider, st: StepState, payload: Any) -> bool:
    """Whether a signal payload satisfies the wait's ``match``.

    A match expression that cannot be evaluated against this payload (a missing
    key, say) is a non-match: the signal may be meant for another waiter.
    """
    wait = d.plan.specs[st.step_id].wait
    assert wait is not None
    if wait.match is None:
        return True
    try:
        scope = build_scope(d.state, st.scope, d.now, instance=f"{st.key}:match", signal=payload)
        return bool(wait.match.evaluate(scope))
    except ExpressionEvaluationError:
        return False


def on_signal(d: Decider, event: SignalReceived) -> None:
    state = d.state
    if state.is_terminal or event.event_id in state.seen_signals:
        return
    state.seen_signals.add(event.event_id)
    d.touched = True
    if state.signals:
        _drop_expired_signals(d)
    if deliver_signal(d, event.name, event.payload) or not event.buffer:
        return
    if signal_buffers(d.plan).get(event.name, 0.0) > 0:
        state.signals.append(
            BufferedSignal(
                event_id=event.event_id, name=event.name, payload=event.payload, time=d.now
            )
        )


@functools.lru_cache(maxsize=256)
def signal_buffers(plan: Plan) -> Mapping[str, float]:
    """Seconds a signal no wait takes is kept, by name: the longest ``buffer`` of the
    plan's waits for that name (0: dropped)."""
    buffers: dict[str, float] = {}
    for spec in plan.specs.values():
        if spec.wait is not None:
            name = spec.wait.signal
            buffers[name] = max(buffers.get(name, 0.0), spec.wait.buffer)
    return buffers


def _drop_expired_signals(d: Decider) -> None:
    """Forget the buffered signals kept longer than their ``buffer`` (the run's clock is
    the event's time, so this is as deterministic as the rest of ``decide``)."""
    buffers = signal_buffers(d.plan)
    now = d.now
    d.state.signals[:] = [
        kept for kept in d.state.signals if now - kept.time <= buffers.get(kept.name, 0.0)
    ]


def deliver_signal(d: Decider, name: str, payload: Any) -> bool:
    """Complete every wait on ``name`` whose match holds; False when none took it."""
    waiting = d.state.waiting.get(name)
    if not waiting:
        return False
    delivered = False
    for key in list(waiting):
        st = d.state.steps[key]
        if _matches(d, st, payload):
            unwait(d, st, name)
            d.succeed(st, payload, f"signal '{name}' received")
            delivered = True
    return delivered


def unwait(d: Decider, st: StepState, name: str) -> None:
    d.state.correlated.pop(st.key, None)
    waiting = d.state.waiting.get(name)
    if waiting and st.key in waiting:
        waiting.remove(st.key)
        if not waiting:
            del d.state.waiting[name]


def wait_timed_out(d: Decider, st: StepState) -> None:
    wait = d.plan.specs[st.step_id].wait
    assert wait is not None
    unwait(d, st, wait.signal)
    if wait.timeout_action == "continue":
        d.succeed(st, {"timed_out": True}, "wait timed out (timeout_action: continue)")
    else:
        d.fail_step(
            st, engine_error("SignalTimeout", f"no signal '{wait.signal}' within {wait.timeout}s")
        )


def _start_sleep(d: Decider, st: StepState, spec: StepSpec, scope: dict[str, Any]) -> None:
    sleep = spec.sleep
    assert sleep is not None
    if sleep.duration is not None:
        fire_at = d.now + sleep.duration
    else:
        assert sleep.until is not None
        fire_at = _parse_instant(sleep.until.render(scope))
    if fire_at <= d.now:
        d.succeed(st, {"until": iso(fire_at)}, "sleep: the time has already passed")
        return
    d.set_step(st, _WAITING, f"sleeping until {iso(fire_at)}")
    arm(d, "sleep", st, fire_at)


def _parse_instant(value: Any) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, str):
        raise ExpressionEvaluationError(f"sleep `until` must be an ISO-8601 time, got {value!r}")
    text = re.sub(r"Z$", "+00:00", value.strip())
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ExpressionEvaluationError(
            f"sleep `until` is not an ISO-8601 time: {value!r}"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def _start_subflow(d: Decider, st: StepState, spec: StepSpec, scope: dict[str, Any]) -> None:
    sub = spec.subflow
    assert sub is not None
    state = d.state
    child_input = sub.input.render(scope)
    storable.check(child_input, f"the input of subflow step {st.key!r}")
    st.input = child_input
    child_id = f"{state.run_id}.{re.sub(r'[^A-Za-z0-9_.-]', '_', st.key)}"
    if state.retries:  # an operator retry starts a new child run
        child_id += f".retry{state.retries}"
    st.child_run_id = child_id
    d.commands.append(child_run(d.plan, state.run_id, st))
    if sub.mode == "sync":
        d.set_step(st, _RUNNING, f"child run {child_id} started")
    else:
        d.succeed(st, {"run_id": child_id}, f"child run {child_id} started (async)")


def on_child_finished(d: Decider, event: ChildRunFinished) -> None:
    st = d.state.steps.get(event.step_key)
    if st is None or st.status is not _RUNNING or st.child_run_id != event.child_run_id:
        return
    if event.status == RunStatus.SUCCEEDED.value:
        d.succeed(st, event.output, f"child run {event.child_run_id} succeeded")
        return
    detail = f"{event.error.type}: {event.error.message}" if event.error else "no error recorded"
    d.fail_step(
        st,
        engine_error(
            "ChildRunFailed", f"child run {event.child_run_id} ended {event.status} ({detail})"
        ),
    )


def _start_emit(d: Decider, st: StepState, spec: StepSpec, scope: dict[str, Any]) -> None:
    assert spec.emit is not None
    rendered = spec.emit.render(scope)
    storable.check(rendered, f"the event of emit step {st.key!r}")
    if not isinstance(rendered, dict) or not rendered.get("type"):
        raise ExpressionEvaluationError("emit: `event` must be a mapping with a non-empty `type`")
    state = d.state
    event = {
        "specversion": "1.0",
        "id": f"{state.run_id}:{st.key}",
        "source": rendered.get("source") or f"tideflow/{state.workflow}",
        "type": str(rendered["type"]),
        "time": iso(d.now),
        "datacontenttype": "application/json",
        "tideflowrunid": state.run_id,
        "data": rendered.get("data"),
    }
    if rendered.get("subject") is not None:
        event["subject"] = str(rendered["subject"])
    d.commands.append(EmitEvent(run_id=state.run_id, event=event))
    d.succeed(st, event, f"event {event['type']} emitted")


# -- operator retry: loops and maps go on where they stopped ----------------------


def resumable(d: Decider, st: StepState) -> bool:
    """Whether a retry resumes ``st`` (a loop or map that had started) rather than
    starting it afresh."""
    spec = d.plan.specs[st.step_id]
    if spec.loop is not None:
        return f"{st.key}@{st.iteration}/" in d.state.scopes
    return spec.map is not None and st.map is not None


def resume(d: Decider, st: StepState) -> None:
    if d.plan.specs[st.step_id].map is not None:
        resume_map(d, st)
        return
    d.set_step(st, _RUNNING, f"retried: iteration {st.iteration} goes on")
    arm_step_timeout(d, st)
    d.reopen_scope(d.state.scopes[f"{st.key}@{st.iteration}/"])


# -- loop -----------------------------------------------------------------------


def _start_loop(d: Decider, st: StepState, spec: StepSpec, scope: dict[str, Any]) -> None:
    d.set_step(st, _RUNNING, "loop started")
    start_iteration(d, st, 0)


def start_iteration(d: Decider, st: StepState, iteration: int) -> None:
    spec = d.plan.specs[st.step_id]
    loop = spec.loop
    assert loop is not None
    if loop.while_ is not None:
        previous = f"{st.key}@{iteration - 1}/" if iteration else st.scope
        scope = build_scope(
            d.state, previous, d.now, instance=f"{st.key}@{iteration}:while", iteration=iteration
        )
        holds = _condition(d, st, loop.while_, scope)
        if holds is None:
            return
        if not holds:
            d.succeed(
                st, st.output if iteration else {}, f"while is false before iteration {iteration}"
            )
            return
    if iteration >= loop.max_iterations:
        _max_iterations(d, st, loop.max_iterations)
        return
    st.iteration = iteration
    prefix = f"{st.key}@{iteration}/"
    d.open_scope(prefix, st.scope, st.key, "loop", {"iteration": iteration}, loop.body)


def _condition(d: Decider, st: StepState, expr: Expression, scope: dict[str, Any]) -> bool | None:
    """Evaluate a loop condition; on an evaluation error fail the loop and return None."""
    try:
        return bool(expr.evaluate(scope))
    except ExpressionEvaluationError as exc:
        d.fail_step(
            st, engine_error("ExpressionError", f"loop condition {expr.source!r}: {exc.message}")
        )
        return None


def _max_iterations(d: Decider, st: StepState, limit: int) -> None:
    d.fail_step(
        st,
        engine_error(
            "MaxIterationsExceeded",
            f"the loop reached max_iterations ({limit}) without its condition ending it",
        ),
    )


def loop_iteration_done(d: Decider, st: StepState, scope: ScopeState) -> None:
    if st.status is not _RUNNING:
        return
    loop = d.plan.specs[st.step_id].loop
    assert loop is not None
    iteration: int = scope.vars["iteration"]
    steps = d.state.steps
    st.output = {step_id: steps[scope.prefix + step_id].output for step_id in loop.body.steps}
    if loop.until is not None:
        until = build_scope(d.state, scope.prefix, d.now, instance=f"{scope.prefix}:until")
        holds = _condition(d, st, loop.until, until)
        if holds is None:
            return
        if holds:
            d.succeed(st, st.output, f"until holds after iteration {iteration}")
            return
        if iteration + 1 >= loop.max_iterations:
            _max_iterations(d, st, loop.max_iterations)
            return
    if loop.delay:
        arm(d, "loop_delay", st, d.now + loop.delay, iteration + 1)
    else:
        start_iteration(d, st, iteration + 1)


_ENGINE_STARTERS = {
    "set": _start_set,
    "switch": _start_switch,
    "wait": _start_wait,
    "sleep": _start_sleep,
    "map": start_map,
    "loop": _start_loop,
    "subflow": _start_subflow,
    "emit": _start_emit,
}

__all__ = [
    "STEP_TERMINAL",
    "deliver_signal",
    "dispatch",
    "map_item_done",
    "on_child_finished",
    "on_signal",
    "start_step",
]
