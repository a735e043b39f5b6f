"""Readiness: when a step instance ends, tell only the steps that depend on it.

Each pending step counts its finished, ok and skipped dependencies; its join
(`all`, `any`, `at_least`) decides from those counters whether it becomes ready,
is skipped, fails, or waits. An `any` / `at_least` join that can no longer be met
fails with ``JoinFailed`` when a dependency failed (a failure that its own
`on_error: continue` let through), and is skipped when only skips made it
impossible (as after a switch). A switch's unchosen targets hear "skip" instead of "ok".
Handling one ended step costs O(its dependents), never a scan of the run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tideflow.model.events import ErrorInfo
from tideflow.model.plan import Graph, Plan
from tideflow.model.run import StepState
from tideflow.model.states import StepStatus

if TYPE_CHECKING:
    from tideflow.core.decide import Decider

_SUCCEEDED = StepStatus.SUCCEEDED
_FAILED = StepStatus.FAILED
_PENDING = StepStatus.PENDING
_EMPTY_GRAPH = Graph(steps=(), dependents={}, roots=(), sinks=())
_NO_TARGETS: frozenset[str] = frozenset()


def propagate(d: Decider, key: str) -> None:
    state = d.state
    st = state.steps[key]
    scope = state.scopes[st.scope]
    if scope.closing:
        return
    plan = d.plan
    spec = plan.specs[st.step_id]
    graph = plan.graph if st.step_id not in plan.owners else graph_of(plan, st.step_id)
    dependents = graph.dependents.get(st.step_id, ())
    if dependents:
        status = st.status
        outcome = "ok" if status is _SUCCEEDED else "failed" if status is _FAILED else "skip"
        switch = spec.switch
        chosen: Any = st.output.get("next") if switch is not None and outcome == "ok" else None
        targets = switch.targets if switch is not None else _NO_TARGETS
        for dep_id in dependents:
            dep_outcome = outcome
            if chosen is not None and dep_id in targets and dep_id not in chosen:
                dep_outcome = "skip"
            notify(d, state.steps[scope.prefix + dep_id], dep_outcome)
    if scope.remaining == 0 and not scope.closing:
        scope.closing = True  # done: a skip cascade can end several steps at once, and
        d.scope_done(scope)  # each of them is propagated, but the scope ends only once


def graph_of(plan: Plan, step_id: str) -> Graph:
    owner = plan.owners.get(step_id)
    if owner is None:
        return plan.graph
    loop = plan.specs[owner].loop
    return loop.body if loop is not None else _EMPTY_GRAPH


def notify(d: Decider, st: StepState, outcome: str) -> None:
    if st.status is not _PENDING:
        return
    spec = d.plan.specs[st.step_id]
    total = len(spec.depends_on)
    st.deps_done += 1
    if outcome == "ok":
        st.deps_ok += 1
    elif outcome == "skip":
        st.deps_skipped += 1
    join = spec.join
    if join.kind == "all":
        if st.deps_done == total:
            if st.deps_skipped == total:
                d.skip(st, "every dependency was skipped")
            else:
                d.mark_ready(st, "all dependencies finished")
        return
    needed = 1 if join.kind == "any" else join.at_least
    if st.deps_ok >= needed:
        d.mark_ready(st, _satisfied(join.kind, needed))
    elif st.deps_ok + (total - st.deps_done) < needed:
        if st.deps_done - st.deps_ok - st.deps_skipped:
            d.fail_step(st, join_failed(d, st, needed))
        else:
            d.skip(st, _impossible(join.kind, needed))


def _satisfied(kind: str, needed: int) -> str:
    return (
        "a dependency succeeded (join: any)"
        if kind == "any"
        else f"{needed} dependencies succeeded"
    )


def _impossible(kind: str, needed: int) -> str:
    if kind == "any":
        return "no dependency succeeded (join: any)"
    return f"fewer than {needed} dependencies can succeed"


def join_failed(d: Decider, st: StepState, needed: int) -> ErrorInfo:
    """``JoinFailed``: the join can no longer be met and dependencies failed; it names
    each failed dependency and its error (also as the list ``causes``)."""
    steps = d.state.steps
    failed = [steps[st.scope + dep] for dep in d.plan.specs[st.step_id].depends_on]
    causes = tuple(
        {"step": dep.step_id, **(dep.error.to_dict() if dep.error else _NO_ERROR)}
        for dep in failed
        if dep.status is _FAILED
    )
    what = (
        "no dependency succeeded"
        if needed == 1
        else f"fewer than {needed} dependencies can succeed"
    )
    listed = "; ".join(f"{c['step']}: {c['type']}: {c['message']}" for c in causes)
    return ErrorInfo(
        type="JoinFailed", message=f"{what} ({listed})", retryable=False, causes=causes
    )


_NO_ERROR = {"type": "Failed", "message": "no error recorded"}
