"""How each step type starts and finishes inside ``decide``.

Action steps become ``DispatchTask`` commands; engine steps (set, switch, wait,
sleep, map, loop, subflow, emit) are decided here without a worker.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from tideflow.core.scope import build_scope, iso
from tideflow.errors import ExpressionEvaluationError
from tideflow.model import storable
from tideflow.model.commands import DispatchTask, EmitEvent, StartChildRun
from tideflow.model.events import ErrorInfo
from tideflow.model.expressions import Expression
from tideflow.model.plan import Plan, StepSpec
from tideflow.model.run import MapProgress, ScopeState, StepState
from tideflow.model.states import STEP_TERMINAL, StepStatus

if TYPE_CHECKING:
    from tideflow.core.decide import Decider

_RUNNING = StepStatus.RUNNING
_SUCCEEDED = StepStatus.SUCCEEDED
_WAITING = StepStatus.WAITING


def _error(type_: str, message: str) -> ErrorInfo:
    return ErrorInfo(type=type_, message=message, retryable=False)


def start_step(d: Decider, st: StepState, spec: StepSpec) -> None:
    """Start a READY step: evaluate ``when``, resolve ``input``, then act by type."""
    scope = _EMPTY if _constant_action(spec) else build_scope(d.state, st.scope, d.now)
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
        d.arm("step_timeout", st, d.now + spec.timeout)


_EMPTY: dict[str, Any] = {}


def _constant_action(spec: StepSpec) -> bool:
    """An action whose input and config have no templates needs no expression scope."""
    return (
        spec.is_action
        and spec.when is None
        and (spec.input is None or spec.input.is_constant)
        and (spec.config is None or spec.config.is_constant)
    )


def dispatch(d: Decider, st: StepState, spec: StepSpec, scope: dict[str, Any] | None) -> None:
    """Send the next attempt of an action step to a worker."""
    state = d.state
    if scope is None:
        scope = build_scope(state, st.scope, d.now)
    config = spec.config.render(scope) if spec.config is not None else {}
    st.attempts += 1
    if st.attempts == 1 and spec.deadline is not None:
        st.deadline_at = d.now + spec.deadline
        d.arm("deadline", st, st.deadline_at)
    d.set_step(st, _RUNNING, f"attempt {st.attempts} dispatched", st.attempts)
    d.commands.append(action_task(d.plan, state.run_id, st, config))
    if spec.timeout is not None:
        d.arm("attempt_timeout", st, d.now + spec.timeout, st.attempts)


def action_task(plan: Plan, run_id: str, st: StepState, config: Any) -> DispatchTask:
    """The task message for the current attempt of action step instance ``st``."""
    spec = plan.specs[st.step_id]
    return DispatchTask(
        run_id=run_id,
        step_key=st.key,
        step_id=st.step_id,
        type=spec.type,
        config=config,
        input=st.input,
        attempt=st.attempts,
        idempotency_key=f"{run_id}:{st.key}",
        timeout=spec.timeout,
        queue=spec.queue,
        priority=spec.priority,
        sensitive=spec.sensitive,
        secrets=secret_names(plan, spec.id),
    )


@lru_cache(maxsize=4096)
def _secret_names_cached(plan: Plan, step_id: str) -> tuple[str, ...]:
    spec = plan.specs[step_id]
    names: set[str] = set()
    for template in (spec.config, spec.input):
        if template is not None:
            names |= template.secret_references()
    return tuple(sorted(names))


def secret_names(plan: Plan, step_id: str) -> tuple[str, ...]:
    """Secret names the step's config and input templates reference."""
    return _secret_names_cached(plan, step_id)


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
            st, _error("NoMatchingCase", "no case matched and the switch has `default: fail`")
        )
        return
    d.succeed(st, {"case": "default", "next": list(switch.default)}, "no case matched: default")


def _start_wait(d: Decider, st: StepState, spec: StepSpec, scope: dict[str, Any]) -> None:
    wait = spec.wait
    assert wait is not None
    d.set_step(st, _WAITING, f"waiting for signal '{wait.signal}'")
    state = d.state
    for buffered in state.signals:
        if buffered.name == wait.signal and _matches(d, st, buffered.payload):
            state.signals.remove(buffered)
            d.succeed(st, buffered.payload, f"signal '{wait.signal}' (received earlier)")
            return
    state.waiting.setdefault(wait.signal, []).append(st.key)
    if wait.timeout is not None:
        d.arm("wait_timeout", st, d.now + wait.timeout)


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
        return bool(wait.match.evaluate(build_scope(d.state, st.scope, d.now, signal=payload)))
    except ExpressionEvaluationError:
        return False


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
            st, _error("SignalTimeout", f"no signal '{wait.signal}' within {wait.timeout}s")
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
    d.arm("sleep", st, fire_at)


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
    st.child_run_id = child_id
    sync = sub.mode == "sync"
    d.commands.append(
        StartChildRun(
            run_id=state.run_id,
            step_key=st.key,
            child_run_id=child_id,
            workflow=sub.workflow,
            version=sub.version,
            input=child_input,
            wait=sync,
        )
    )
    if sync:
        d.set_step(st, _RUNNING, f"child run {child_id} started")
    else:
        d.succeed(st, {"run_id": child_id}, f"child run {child_id} started (async)")


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


# -- map ------------------------------------------------------------------------


def _start_map(d: Decider, st: StepState, spec: StepSpec, scope: dict[str, Any]) -> None:
    assert spec.map is not None
    items = spec.map.items.render(scope)
    storable.check(items, f"the items of map step {st.key!r}")
    if not isinstance(items, list):
        d.fail_step(
            st, _error("InvalidItems", f"map `items` must be a list, got {type(items).__name__}")
        )
        return
    st.map = MapProgress(total=len(items), items=items, outputs=[None] * len(items))
    if not items:
        d.succeed(st, [], "no items")
        return
    d.set_step(st, _RUNNING, f"mapping over {len(items)} items")
    _launch_items(d, st)


def _launch_items(d: Decider, st: StepState) -> None:
    spec = d.plan.specs[st.step_id]
    progress = st.map
    assert spec.map is not None and progress is not None
    items = progress.items
    limit = spec.map.max_concurrency or progress.total
    while progress.next_index < progress.total and progress.running < limit:
        index = progress.next_index
        progress.next_index += 1
        progress.running += 1
        key = f"{st.key}[{index}]"
        child = StepState(key=key, step_id=spec.map.template, scope=key + "/")
        d.open_scope(
            key + "/",
            st.scope,
            st.key,
            "map_item",
            {"item": items[index], "index": index},
            None,
            child,
        )


def map_item_done(d: Decider, st: StepState, scope: ScopeState) -> None:
    progress = st.map
    assert progress is not None
    index = scope.vars["index"]
    child = d.state.steps[scope.keys[0]]
    progress.running -= 1
    progress.done += 1
    if child.status is _SUCCEEDED:
        progress.outputs[index] = child.output
    elif child.status is not StepStatus.SKIPPED:
        progress.failures += 1
    if st.status is not _RUNNING:
        return
    tolerated = d.plan.specs[st.step_id].map
    assert tolerated is not None
    if progress.failures > tolerated.tolerated_failures:
        d.cancel_map_items(st, "the map failed")
        detail = f"{child.error.type}: {child.error.message}" if child.error else child.status.value
        d.fail_step(
            st,
            _error(
                "TooManyFailures",
                f"{progress.failures} item(s) failed, {tolerated.tolerated_failures} tolerated "
                f"(item {index}: {detail})",
            ),
        )
        return
    if progress.done == progress.total:
        d.succeed(st, list(progress.outputs), f"all {progress.total} items finished")
    else:
        _launch_items(d, st)


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
        scope = build_scope(d.state, previous, d.now, iteration=iteration)
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
        d.fail_step(st, _error("ExpressionError", f"loop condition {expr.source!r}: {exc.message}"))
        return None


def _max_iterations(d: Decider, st: StepState, limit: int) -> None:
    d.fail_step(
        st,
        _error(
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
        holds = _condition(d, st, loop.until, build_scope(d.state, scope.prefix, d.now))
        if holds is None:
            return
        if holds:
            d.succeed(st, st.output, f"until holds after iteration {iteration}")
            return
        if iteration + 1 >= loop.max_iterations:
            _max_iterations(d, st, loop.max_iterations)
            return
    if loop.delay:
        d.arm("loop_delay", st, d.now + loop.delay, iteration + 1)
    else:
        start_iteration(d, st, iteration + 1)


_ENGINE_STARTERS = {
    "set": _start_set,
    "switch": _start_switch,
    "wait": _start_wait,
    "sleep": _start_sleep,
    "map": _start_map,
    "loop": _start_loop,
    "subflow": _start_subflow,
    "emit": _start_emit,
}

__all__ = ["STEP_TERMINAL", "deliver_signal", "dispatch", "start_step"]
