"""The `map` step: one instance of its template per item, in item order.

Item *i* is the instance ``<map>[i]`` in a scope of its own (``<map>[i]/``). Items
start in order as ``max_concurrency`` allows; each one that ends is counted, and
more than ``tolerated_failures`` failed items fail the map. A failed item that
was tolerated leaves an error entry in the output, not ``null``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tideflow.core.retry import engine_error
from tideflow.core.timers import arm
from tideflow.model import storable
from tideflow.model.plan import StepSpec
from tideflow.model.run import MapProgress, ScopeState, StepState
from tideflow.model.states import StepStatus

if TYPE_CHECKING:
    from tideflow.core.decide import Decider

_RUNNING = StepStatus.RUNNING
_SUCCEEDED = StepStatus.SUCCEEDED


def start_map(d: Decider, st: StepState, spec: StepSpec, scope: dict[str, Any]) -> None:
    assert spec.map is not None
    items = spec.map.items.render(scope)
    storable.check(items, f"the items of map step {st.key!r}")
    if not isinstance(items, list):
        d.fail_step(
            st,
            engine_error("InvalidItems", f"map `items` must be a list, got {type(items).__name__}"),
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
    while progress.retry and progress.running < limit:
        progress.running += 1
        d.reopen_scope(d.state.scopes[f"{st.key}[{progress.retry.pop(0)}]/"])
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
        progress.outputs[index] = failed_item(child, index)
    if st.status is not _RUNNING:
        return
    tolerated = d.plan.specs[st.step_id].map
    assert tolerated is not None
    if progress.failures > tolerated.tolerated_failures:
        d.cancel_map_items(st, "the map failed")
        detail = f"{child.error.type}: {child.error.message}" if child.error else child.status.value
        d.fail_step(
            st,
            engine_error(
                "TooManyFailures",
                f"{progress.failures} item(s) failed, {tolerated.tolerated_failures} tolerated "
                f"(item {index}: {detail})",
            ),
        )
        return
    _finish_or_launch(d, st)


def failed_item(child: StepState, index: int) -> dict[str, Any]:
    """What a failed (or cancelled) item puts in the map's output: an entry that a next
    step can tell from an item whose output is null."""
    if child.error is not None:
        error = {"type": child.error.type, "message": child.error.message}
    else:
        error = {"type": "Cancelled", "message": f"item {index} was {child.status.value}"}
    return {"error": error, "index": index}


def resume_map(d: Decider, st: StepState) -> None:
    """Operator retry of a map that had started: run again only the items that did not
    succeed (they go first, then the items never started)."""
    progress = st.map
    assert progress is not None
    steps = d.state.steps
    progress.retry = [
        i
        for i in range(progress.next_index)
        if steps[f"{st.key}[{i}]"].status not in (_SUCCEEDED, StepStatus.SKIPPED)
    ]
    for index in progress.retry:
        progress.outputs[index] = None
    progress.running = progress.failures = 0
    progress.done = progress.next_index - len(progress.retry)
    d.set_step(st, _RUNNING, f"retried: {len(progress.retry)} item(s) run again")
    arm_step_timeout(d, st)
    _finish_or_launch(d, st)


def arm_step_timeout(d: Decider, st: StepState) -> None:
    timeout = d.plan.specs[st.step_id].timeout
    if timeout is not None:
        arm(d, "step_timeout", st, d.now + timeout)


def _finish_or_launch(d: Decider, st: StepState) -> None:
    """Succeed the map once every item finished, else start the items that may start."""
    progress = st.map
    assert progress is not None
    if progress.done == progress.total:
        d.succeed(st, list(progress.outputs), f"all {progress.total} items finished")
    else:
        _launch_items(d, st)
