"""Property-based tests of the core on random DAGs with random step outcomes."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tideflow.dsl.compiler import compile_definition
from tideflow.model import codec
from tideflow.model.states import RUN_TERMINAL, STEP_TERMINAL, RunStatus, StepStatus
from tideflow.testing.harness import CoreHarness


@st.composite
def definitions(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(min_value=1, max_value=10))
    steps: list[dict[str, Any]] = []
    for i in range(n):
        step: dict[str, Any] = {"id": f"s{i}", "type": "noop"}
        if i:
            deps = draw(st.lists(st.integers(0, i - 1), unique=True, max_size=3))
            if deps:
                step["depends_on"] = [f"s{d}" for d in deps]
                kind = draw(st.sampled_from(["all", "all", "any", "at_least"]))
                if kind == "any":
                    step["join"] = "any"
                    step["cancel_others"] = draw(st.booleans())
                elif kind == "at_least":
                    step["join"] = {"at_least": draw(st.integers(1, len(deps)))}
        if draw(st.integers(0, 9)) == 0:
            step["when"] = "{{ false }}"
        step["on_error"] = draw(st.sampled_from(["fail", "continue", "continue", "compensate"]))
        if draw(st.booleans()):
            step["compensate"] = {"type": "noop"}
        attempts = draw(st.integers(1, 3))
        if attempts > 1:
            step["retry"] = {"max_attempts": attempts, "backoff": "1s"}
        steps.append(step)
    return {
        "name": "prop",
        "version": "1",
        "on_failure": draw(st.sampled_from(["fail", "compensate"])),
        "steps": steps,
    }


def _join_satisfied(h: CoreHarness, key: str) -> bool:
    spec = h.plan.specs[key]
    deps = [h.state.steps[d] for d in spec.depends_on]
    ok = sum(1 for d in deps if d.status is StepStatus.SUCCEEDED)
    if spec.join.kind == "all":
        return all(d.status in STEP_TERMINAL for d in deps)
    if spec.join.kind == "any":
        return ok >= 1
    return ok >= spec.join.at_least


def _join_end_problem(h: CoreHarness, key: str, new: str) -> str | None:
    """An `any` / `at_least` join fails when it became unreachable with a failed dependency,
    and is skipped only when skips alone made it unreachable."""
    spec = h.plan.specs[key]
    if spec.join.kind == "all" or new not in ("failed", "skipped"):
        return None
    deps = [h.state.steps[d].status for d in spec.depends_on]
    failed = deps.count(StepStatus.FAILED)
    needed = 1 if spec.join.kind == "any" else spec.join.at_least
    reachable = deps.count(StepStatus.SUCCEEDED) + sum(s not in STEP_TERMINAL for s in deps)
    if reachable >= needed:
        return f"{key} ended {new} while its join could still be met"
    if new == "failed" and not failed:
        return f"{key} failed its join without a failed dependency"
    if new == "skipped" and failed:
        return f"{key} was skipped although a dependency failed"
    return None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(definition=definitions(), data=st.data())
def test_core_invariants_on_random_dags(definition: dict[str, Any], data: st.DataObject) -> None:
    plan = compile_definition(definition)
    h = CoreHarness(plan, auto_start=data.draw(st.booleans()))
    violations: list[str] = []

    def check(event: Any, decision: Any) -> None:
        for tr in decision.transitions:
            started = tr.subject in plan.specs and tr.old == "ready" and tr.new == "running"
            if started and not _join_satisfied(h, tr.subject):
                violations.append(f"{tr.subject} started before its join held")
            if tr.subject in plan.specs and tr.old == "pending":
                problem = _join_end_problem(h, tr.subject, tr.new)
                if problem:
                    violations.append(problem)

    h.on_decision = check
    h.start({})
    cancelled_with: list[str] | None = None
    for _ in range(500):
        if h.state.status in RUN_TERMINAL:
            break
        outstanding = sorted(h.outstanding())
        if not outstanding:
            assert h.timers, "a run with nothing outstanding and no timer is stuck"
            h.advance(min(h.timers.values()) - h.now)
            continue
        if data.draw(st.integers(0, 40)) == 0:
            cancelled_with = list(h.state.compensable)
            h.cancel()
            continue
        key = data.draw(st.sampled_from(outstanding))
        compensation = key.endswith(":compensate")
        step_key = key.removesuffix(":compensate")
        if not compensation and data.draw(st.booleans()):
            h.started(step_key)  # a duplicate when auto_start already did: changes nothing
        if data.draw(st.booleans()):
            h.complete(step_key, {"k": step_key}, compensation=compensation)
        else:
            h.fail(step_key, retryable=data.draw(st.booleans()), compensation=compensation)
        if data.draw(st.integers(0, 4)) == 0:
            replay = h.apply(h.events[-1])
            assert replay.transitions == [] and replay.commands == []
    assert not violations, violations
    # a run always terminates
    assert h.state.status in RUN_TERMINAL
    # every step ends in exactly one terminal state
    terminal_moves: dict[str, int] = {}
    for tr in h.transitions:
        if tr.subject in plan.specs and StepStatus(tr.new) in STEP_TERMINAL:
            terminal_moves[tr.subject] = terminal_moves.get(tr.subject, 0) + 1
    for step_id in plan.specs:
        assert h.state.steps[step_id].status in STEP_TERMINAL
        assert terminal_moves.get(step_id) == 1, step_id
    # compensations run exactly for the completed steps that declare one, newest first
    compensated = [t.step_key for t in h.dispatched if t.compensation and t.attempt == 1]
    if cancelled_with is not None and h.state.status is RunStatus.CANCELLED:
        # a cancel compensates (under on_failure: compensate) what had completed
        expected = cancelled_with if plan.on_failure.value == "compensate" else []
        assert compensated == list(reversed(expected))
    elif h.state.status in (RunStatus.COMPENSATED, RunStatus.COMPENSATION_FAILED):
        completed = sorted(
            (
                s
                for s in h.state.steps.values()
                if s.status is StepStatus.SUCCEEDED and plan.specs[s.key].compensate
            ),
            key=lambda s: s.seq,
        )
        assert compensated == [s.key for s in reversed(completed)]
    else:
        assert compensated == []
    assert not h.state.timers


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(definition=definitions(), data=st.data())
def test_state_survives_serialisation_between_every_event(
    definition: dict[str, Any], data: st.DataObject
) -> None:
    """Crash depth 1: restoring the state from its stored form after every event changes
    nothing about how the run proceeds."""
    plan = compile_definition(definition)
    live, restored = CoreHarness(plan), CoreHarness(plan)
    live.start({})
    restored.start({})
    for _ in range(300):
        restored.state = codec.loads(codec.dumps(restored.state))
        assert codec.state_to_data(restored.state) == codec.state_to_data(live.state)
        if live.state.status in RUN_TERMINAL:
            break
        outstanding = sorted(live.outstanding())
        assert outstanding == sorted(restored.outstanding())
        if not outstanding:
            step = min(live.timers.values()) - live.now
            live.advance(step)
            restored.advance(step)
            continue
        key = data.draw(st.sampled_from(outstanding))
        ok = data.draw(st.booleans())
        for h in (live, restored):
            comp = key.endswith(":compensate")
            if ok:
                h.complete(key.removesuffix(":compensate"), {"v": 1}, compensation=comp)
            else:
                h.fail(key.removesuffix(":compensate"), compensation=comp)
    assert live.state.status in RUN_TERMINAL


def _drive(h: CoreHarness, data: st.DataObject) -> None:
    """Complete or fail outstanding tasks at random until the run ends."""
    for _ in range(500):
        if h.state.status in RUN_TERMINAL:
            return
        outstanding = sorted(h.outstanding())
        if not outstanding:
            h.advance(min(h.timers.values()) - h.now)
            continue
        key = data.draw(st.sampled_from(outstanding))
        comp = key.endswith(":compensate")
        if data.draw(st.booleans()):
            h.complete(key.removesuffix(":compensate"), {"v": 1}, compensation=comp)
        else:
            h.fail(key.removesuffix(":compensate"), retryable=False, compensation=comp)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(definition=definitions(), data=st.data())
def test_a_retried_run_runs_again_only_what_did_not_succeed(
    definition: dict[str, Any], data: st.DataObject
) -> None:
    plan = compile_definition(definition)
    h = CoreHarness(plan)
    h.start({})
    _drive(h, data)
    if h.state.status is not RunStatus.FAILED:
        assert not h.retry().changed
        return
    kept = {key for key, s in h.state.steps.items() if s.status is StepStatus.SUCCEEDED}
    outputs = {key: h.state.steps[key].output for key in kept}
    before = len(h.dispatched)
    assert h.retry().changed
    _drive(h, data)
    assert h.state.status in RUN_TERMINAL
    rerun = {t.step_key for t in h.dispatched[before:] if not t.compensation}
    assert not rerun & kept
    assert {key: h.state.steps[key].output for key in kept} == outputs
    assert all(s.status in STEP_TERMINAL for s in h.state.steps.values())
    assert not h.state.timers
