"""DAG scheduling, joins, `when` and skip propagation, switch, set."""

from __future__ import annotations

import pytest

from tideflow.errors import IllegalTransition
from tideflow.model.states import StepStatus, check_step_transition

HEAD = """
name: t
version: "1"
"""


def test_chain_runs_in_order_and_output_defaults_to_sinks(harness):
    h = harness(
        HEAD
        + """
steps:
  - {id: a, type: noop}
  - {id: b, type: noop, depends_on: [a]}
  - {id: c, type: noop, depends_on: [b]}
"""
    )
    assert h.outstanding() == ["a"]
    h.complete("a", 1)
    assert h.outstanding() == ["b"]
    h.complete("b", 2)
    h.complete("c", 3)
    assert h.status == "succeeded"
    assert h.state.output == {"c": 3}
    assert h.finished[-1].status == "succeeded"


def test_parallel_steps_start_together_and_join_all_waits(harness):
    h = harness(
        HEAD
        + """
steps:
  - {id: a, type: noop}
  - {id: b, type: noop}
  - {id: c, type: noop, depends_on: [a, b]}
"""
    )
    assert sorted(h.outstanding()) == ["a", "b"]
    h.complete("a")
    assert h.step_status("c") == "pending"
    h.complete("b")
    assert h.outstanding() == ["c"]


def test_input_templates_see_inputs_and_dependencies(harness):
    h = harness(
        HEAD
        + """
steps:
  - {id: a, type: noop, input: {x: "{{ inputs.n }}"}}
  - {id: b, type: noop, depends_on: [a], input: {y: "{{ steps.a.output.x * 2 }}", s: "n={{ inputs.n }}"}}
""",
        {"n": 21},
    )
    assert h.tasks["a"].input == {"x": 21}
    h.complete("a", {"x": 21})
    assert h.tasks["b"].input == {"y": 42, "s": "n=21"}


def test_join_any_runs_once_on_first_success_and_cancels_others(harness):
    h = harness(
        HEAD
        + """
steps:
  - {id: a, type: noop}
  - {id: b, type: noop}
  - {id: c, type: noop, depends_on: [a, b], join: any, cancel_others: true}
"""
    )
    h.complete("b", "fast")
    assert h.outstanding() == ["c"]
    assert h.step_status("a") == "cancelled"
    assert ("a", 1) in h.cancelled_tasks
    h.complete("c")
    assert h.status == "succeeded"


def test_join_any_without_cancel_others_lets_others_finish(harness):
    h = harness(
        HEAD
        + """
steps:
  - {id: a, type: noop}
  - {id: b, type: noop}
  - {id: c, type: noop, depends_on: [a, b], join: any}
"""
    )
    h.complete("a")
    h.complete("c")
    assert h.status == "running"
    h.complete("b")
    assert h.status == "succeeded"
    assert [t.step_key for t in h.dispatched].count("c") == 1


def test_join_at_least(harness):
    h = harness(
        HEAD
        + """
steps:
  - {id: a, type: noop}
  - {id: b, type: noop}
  - {id: c, type: noop}
  - {id: d, type: noop, depends_on: [a, b, c], join: {at_least: 2}}
"""
    )
    h.complete("a")
    assert h.step_status("d") == "pending"
    h.complete("c")
    assert h.step_status("d") == "running"


def test_join_at_least_skips_when_impossible(harness):
    h = harness(
        HEAD
        + """
steps:
  - {id: a, type: noop, when: "{{ false }}"}
  - {id: b, type: noop, when: "{{ false }}"}
  - {id: c, type: noop}
  - {id: d, type: noop, depends_on: [a, b, c], join: {at_least: 2}}
"""
    )
    assert h.step_status("d") == "skipped"
    h.complete("c")
    assert h.status == "succeeded"


def test_when_false_skips_and_skip_propagates_through_join_all(harness):
    h = harness(
        HEAD
        + """
steps:
  - {id: a, type: noop, when: "{{ inputs.go }}"}
  - {id: b, type: noop, depends_on: [a]}
  - {id: c, type: noop, depends_on: [b]}
""",
        {"go": False},
    )
    assert [h.step_status(k) for k in "abc"] == ["skipped", "skipped", "skipped"]
    assert h.status == "succeeded"


def test_join_all_runs_when_only_some_dependencies_skipped(harness):
    h = harness(
        HEAD
        + """
steps:
  - {id: a, type: noop, when: "{{ false }}"}
  - {id: b, type: noop}
  - {id: c, type: noop, depends_on: [a, b]}
"""
    )
    h.complete("b")
    assert h.outstanding() == ["c"]


SWITCH = (
    HEAD
    + """
steps:
  - id: route
    type: switch
    cases:
      - {when: "{{ inputs.score > 0.8 }}", next: [reject]}
      - {when: "{{ inputs.score > 0.3 }}", next: [review]}
    default: [publish]
  - {id: reject, type: noop}
  - {id: review, type: noop}
  - {id: publish, type: noop}
  - {id: notify, type: noop, depends_on: [reject, review, publish]}
"""
)


@pytest.mark.parametrize(("score", "chosen"), [(0.9, "reject"), (0.5, "review"), (0.1, "publish")])
def test_switch_activates_first_match_skips_the_rest_and_merge_runs(harness, score, chosen):
    h = harness(SWITCH, {"score": score})
    assert h.outstanding() == [chosen]
    others = {"reject", "review", "publish"} - {chosen}
    assert all(h.step_status(k) == "skipped" for k in others)
    h.complete(chosen)
    assert h.outstanding() == ["notify"]
    h.complete("notify")
    assert h.status == "succeeded"
    assert h.state.steps["route"].output["next"] == [chosen]


def test_switch_default_fail_fails_the_run(harness):
    h = harness(
        HEAD
        + """
steps:
  - id: route
    type: switch
    cases: [{when: "{{ inputs.x == 1 }}", next: [one]}]
    default: fail
  - {id: one, type: noop}
""",
        {"x": 2},
    )
    assert h.status == "failed"
    assert h.state.error.type == "NoMatchingCase"
    assert h.step_status("one") == "cancelled"


def test_set_computes_values(harness):
    h = harness(
        HEAD
        + """
steps:
  - {id: s, type: set, values: {total: "{{ inputs.a + inputs.b }}", label: "sum={{ inputs.a + inputs.b }}"}}
output: "{{ steps.s.output.total }}"
""",
        {"a": 2, "b": 3},
    )
    assert h.status == "succeeded"
    assert h.state.output == 5
    assert h.state.steps["s"].output == {"total": 5, "label": "sum=5"}


def test_expression_error_at_run_time_fails_the_step_not_the_engine(harness):
    h = harness(
        HEAD
        + """
steps:
  - {id: a, type: noop, input: {x: "{{ inputs.missing.deeper }}"}}
""",
        {},
    )
    assert h.status == "failed"
    assert h.state.steps["a"].error.type == "ExpressionError"


def test_transition_table_refuses_illegal_moves():
    with pytest.raises(IllegalTransition):
        check_step_transition("x", StepStatus.SUCCEEDED, StepStatus.RUNNING)
    with pytest.raises(IllegalTransition):
        check_step_transition("x", StepStatus.PENDING, StepStatus.RUNNING)
    check_step_transition("x", StepStatus.RUNNING, StepStatus.RETRYING)


def test_every_transition_is_recorded_with_time_and_cause(harness):
    h = harness(HEAD + "steps: [{id: a, type: noop}]\n")
    h.complete("a")
    subjects = [(t.subject, t.old, t.new) for t in h.transitions]
    assert subjects == [
        ("run", "pending", "running"),
        ("a", "pending", "ready"),
        ("a", "ready", "running"),
        ("a", "running", "running"),  # the worker started attempt 1: a recorded fact
        ("a", "running", "succeeded"),
        ("run", "running", "succeeded"),
    ]
    assert all(t.cause and t.time == h.now for t in h.transitions)
    assert h.transitions[3].cause == "attempt 1 started by test-worker"


def test_join_any_whose_dependencies_all_failed_fails_the_run(harness):
    h = harness(
        HEAD
        + """
steps:
  - {id: a, type: noop, on_error: continue}
  - {id: b, type: noop, on_error: continue}
  - {id: c, type: noop, depends_on: [a, b], join: any}
"""
    )
    h.fail("a", "RuntimeError", "mirror a down")
    assert h.step_status("c") == "pending"
    h.fail("b", "ValueError", "mirror b refused")
    assert h.step_status("c") == "failed"
    assert h.status == "failed"
    error = h.state.error
    assert error.type == "JoinFailed"
    assert "a: RuntimeError: mirror a down" in error.message
    assert "b: ValueError: mirror b refused" in error.message
    assert error.to_dict()["causes"] == [
        {"step": "a", "type": "RuntimeError", "message": "mirror a down"},
        {"step": "b", "type": "ValueError", "message": "mirror b refused"},
    ]


def test_join_any_with_one_failed_and_one_succeeded_runs(harness):
    h = harness(
        HEAD
        + """
steps:
  - {id: a, type: noop, on_error: continue}
  - {id: b, type: noop, on_error: continue}
  - {id: c, type: noop, depends_on: [a, b], join: any}
"""
    )
    h.fail("a")
    h.complete("b", "copy")
    h.complete("c")
    assert h.status == "succeeded"


def test_join_any_only_skipped_is_still_skipped(harness):
    h = harness(
        HEAD
        + """
steps:
  - {id: a, type: noop, when: "{{ false }}"}
  - {id: b, type: noop, when: "{{ false }}"}
  - {id: c, type: noop, depends_on: [a, b], join: any}
"""
    )
    assert h.step_status("c") == "skipped"
    assert h.status == "succeeded"


def test_join_at_least_fails_as_soon_as_it_cannot_be_reached(harness):
    h = harness(
        HEAD
        + """
steps:
  - {id: a, type: noop, on_error: continue}
  - {id: b, type: noop, on_error: continue}
  - {id: c, type: noop}
  - {id: d, type: noop, depends_on: [a, b, c], join: {at_least: 2}}
"""
    )
    h.fail("a")
    assert h.step_status("d") == "pending"
    h.fail("b", "KeyError", "k")
    # c is still running: 2 successes are out of reach already
    assert h.step_status("d") == "failed"
    assert h.status == "failed"
    assert h.state.error.type == "JoinFailed"
    assert "fewer than 2" in h.state.error.message
    assert ("c", 1) in h.cancelled_tasks


def test_failed_join_respects_its_own_on_error_continue(harness):
    h = harness(
        HEAD
        + """
steps:
  - {id: a, type: noop, on_error: continue}
  - {id: b, type: noop, on_error: continue}
  - {id: c, type: noop, depends_on: [a, b], join: any, on_error: continue}
  - {id: report, type: noop, depends_on: [c], input: {why: "{{ steps.c.error.causes }}"}}
"""
    )
    h.fail("a")
    h.fail("b")
    assert h.step_status("c") == "failed"
    assert [cause["step"] for cause in h.tasks["report"].input["why"]] == ["a", "b"]
    h.complete("report")
    assert h.status == "succeeded"


def test_join_branch_with_on_error_fail_still_fails_the_scope_at_once(harness):
    h = harness(
        HEAD
        + """
steps:
  - {id: a, type: noop}
  - {id: b, type: noop}
  - {id: c, type: noop, depends_on: [a, b], join: any}
"""
    )
    h.fail("a", "RuntimeError", "down")
    assert h.status == "failed"
    assert h.state.error.type == "RuntimeError"
    assert h.step_status("b") == "cancelled"
