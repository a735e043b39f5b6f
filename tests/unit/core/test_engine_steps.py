"""wait, sleep, map, loop, subflow and emit."""

from __future__ import annotations

from datetime import UTC, datetime

from tideflow.model.events import ErrorInfo

HEAD = """
name: t
version: "1"
"""


def test_wait_receives_a_matching_signal(harness):
    h = harness(
        HEAD
        + """
steps:
  - {id: approve, type: wait, signal: approval, match: "{{ signal.order == inputs.order }}"}
  - {id: after, type: noop, depends_on: [approve], input: {by: "{{ steps.approve.output.by }}"}}
""",
        {"order": "A"},
    )
    assert h.step_status("approve") == "waiting"
    h.signal("approval", {"order": "B", "by": "eve"})
    assert h.step_status("approve") == "waiting"
    h.signal("approval", {"order": "A", "by": "bob"})
    assert h.tasks["after"].input == {"by": "bob"}


def test_a_signal_that_arrives_before_the_wait_is_kept_for_it(harness):
    h = harness(
        HEAD
        + """
steps:
  - {id: a, type: noop}
  - {id: w, type: wait, signal: go, depends_on: [a]}
"""
    )
    h.signal("go", {"early": True})
    h.complete("a")
    assert h.step_status("w") == "succeeded"
    assert h.state.steps["w"].output == {"early": True}
    assert h.state.signals == []


def test_wait_timeout_fail(harness):
    h = harness(HEAD + "steps: [{id: w, type: wait, signal: go, timeout: 10m}]\n")
    h.advance(600)
    assert h.status == "failed"
    assert h.state.steps["w"].error.type == "SignalTimeout"


def test_wait_timeout_continue(harness):
    h = harness(
        HEAD
        + """
steps:
  - {id: w, type: wait, signal: go, timeout: 10m, timeout_action: continue}
  - {id: escalate, type: noop, depends_on: [w], when: "{{ steps.w.output.timed_out }}"}
"""
    )
    h.advance(600)
    assert h.state.steps["w"].output == {"timed_out": True}
    assert h.outstanding() == ["escalate"]


def test_sleep_by_duration(harness):
    h = harness(
        HEAD
        + "steps: [{id: s, type: sleep, duration: 10m}, {id: a, type: noop, depends_on: [s]}]\n"
    )
    assert h.step_status("s") == "waiting"
    h.advance(599)
    assert h.step_status("s") == "waiting"
    h.advance(1)
    assert h.outstanding() == ["a"]


def test_sleep_until_a_time(harness):
    h = harness(HEAD + "steps: [{id: s, type: sleep, until: '{{ inputs.at }}'}]\n", start=False)
    at = datetime.fromtimestamp(h.now + 3600, UTC).isoformat()
    h.start({"at": at})
    assert list(h.timers.values()) == [h.now + 3600]
    h.advance(3600)
    assert h.status == "succeeded"


def test_sleep_until_the_past_finishes_at_once_and_garbage_fails(harness):
    h = harness(HEAD + "steps: [{id: s, type: sleep, until: '2001-01-01T00:00:00Z'}]\n")
    assert h.status == "succeeded"
    h = harness(
        HEAD + "steps: [{id: s, type: sleep, until: '{{ inputs.at }}'}]\n", {"at": "tomorrow"}
    )
    assert h.state.steps["s"].error.type == "ExpressionError"


MAP = (
    HEAD
    + """
steps:
  - id: each
    type: map
    items: "{{ inputs.items }}"
    max_concurrency: 2
    tolerated_failures: 1
    step: {id: work, type: noop, input: {n: "{{ item * 10 }}", i: "{{ index }}"}}
output: "{{ steps.each.output }}"
"""
)


def test_map_respects_max_concurrency_and_keeps_item_order(harness):
    h = harness(MAP, {"items": [1, 2, 3, 4]})
    assert sorted(h.outstanding()) == ["each[0]", "each[1]"]
    assert h.tasks["each[1]"].input == {"n": 20, "i": 1}
    h.complete("each[1]", "b")
    assert sorted(h.outstanding()) == ["each[0]", "each[2]"]
    h.complete("each[2]", "c")
    h.complete("each[3]", "d")
    h.complete("each[0]", "a")
    assert h.status == "succeeded"
    assert h.state.output == ["a", "b", "c", "d"]


def test_map_tolerates_failures_up_to_the_limit(harness):
    h = harness(MAP, {"items": [1, 2, 3]})
    h.fail("each[0]")
    assert h.step_status("each") == "running"
    h.complete("each[1]", "b")
    h.complete("each[2]", "c")
    assert h.state.output == [
        {"error": {"type": "RuntimeError", "message": "boom"}, "index": 0},
        "b",
        "c",
    ]
    h = harness(MAP, {"items": [1, 2, 3]})
    h.fail("each[0]")
    h.fail("each[1]")
    assert h.status == "failed"
    assert h.state.error.type == "TooManyFailures"
    assert h.step_status("each[2]") == "cancelled"


def test_map_over_nothing_and_over_a_non_list(harness):
    h = harness(MAP, {"items": []})
    assert h.status == "succeeded" and h.state.output == []
    h = harness(MAP, {"items": {"a": 1}})
    assert h.state.steps["each"].error.type == "InvalidItems"


LOOP = (
    HEAD
    + """
steps:
  - id: poll
    type: loop
    max_iterations: 3
    until: "{{ steps.check.output.done }}"
    delay: 30s
    steps:
      - {id: check, type: noop, input: {i: "{{ iteration }}"}}
      - {id: log, type: set, depends_on: [check], values: {seen: "{{ steps.check.output.done }}"}}
  - {id: after, type: noop, depends_on: [poll], input: {last: "{{ steps.poll.output.check }}"}}
"""
)


def test_loop_until_with_delay_and_nested_scope(harness):
    h = harness(LOOP)
    assert h.tasks["poll@0/check"].input == {"i": 0}
    h.complete("poll@0/check", {"done": False})
    assert h.step_status("poll@0/log") == "succeeded"
    assert "poll@1/check" not in h.tasks
    h.advance(30)
    assert h.tasks["poll@1/check"].input == {"i": 1}
    h.complete("poll@1/check", {"done": True})
    assert h.outstanding() == ["after"]
    assert h.tasks["after"].input == {"last": {"done": True}}


def test_loop_hitting_max_iterations_fails(harness):
    h = harness(LOOP)
    for i in range(3):
        h.complete(f"poll@{i}/check", {"done": False})
        h.advance(30)
    assert h.status == "failed"
    assert h.state.steps["poll"].error.type == "MaxIterationsExceeded"
    assert "poll@3/check" not in h.tasks


def test_loop_while_is_checked_before_each_iteration(harness):
    h = harness(
        HEAD
        + """
steps:
  - id: count
    type: loop
    max_iterations: 10
    while: "{{ iteration < inputs.n }}"
    steps:
      - {id: tick, type: set, values: {i: "{{ iteration }}"}}
output: "{{ steps.count.output }}"
""",
        {"n": 3},
    )
    assert h.status == "succeeded"
    assert h.state.output == {"tick": {"i": 2}}
    h = harness(
        HEAD
        + "steps: [{id: c, type: loop, max_iterations: 2, while: 'true', steps: [{id: t, type: noop}]}]\n"
    )
    h.complete("c@0/t")
    h.complete("c@1/t")
    assert h.state.steps["c"].error.type == "MaxIterationsExceeded"


def test_failure_inside_a_loop_fails_the_loop_step_with_its_on_error(harness):
    h = harness(
        HEAD
        + """
steps:
  - id: l
    type: loop
    max_iterations: 5
    until: "true"
    on_error: continue
    steps:
      - {id: a, type: noop}
      - {id: b, type: noop}
  - {id: after, type: noop, depends_on: [l]}
"""
    )
    h.fail("l@0/a")
    assert h.step_status("l@0/b") == "cancelled"
    assert h.step_status("l") == "failed"
    assert h.outstanding() == ["after"]


def test_subflow_sync_waits_for_the_child(harness):
    h = harness(
        HEAD
        + """
steps:
  - {id: child, type: subflow, workflow: other, input: {x: "{{ inputs.x }}"}}
output: "{{ steps.child.output }}"
""",
        {"x": 5, "secret": "not passed"},
    )
    start = h.children["child"]
    assert start.input == {"x": 5} and start.wait and start.workflow == "other"
    h.child_finished("child", "succeeded", {"y": 6})
    assert h.state.output == {"y": 6}


def test_subflow_sync_child_failure_fails_the_step(harness):
    h = harness(HEAD + "steps: [{id: child, type: subflow, workflow: other}]\n")
    h.child_finished("child", "failed", error=ErrorInfo(type="ValueError", message="bad"))
    assert h.state.steps["child"].error.type == "ChildRunFailed"
    assert "ValueError" in h.state.steps["child"].error.message


def test_subflow_async_returns_the_run_id_at_once(harness):
    h = harness(HEAD + "steps: [{id: child, type: subflow, workflow: other, mode: async}]\n")
    assert h.status == "succeeded"
    assert h.state.steps["child"].output == {"run_id": h.children["child"].child_run_id}
    assert not h.children["child"].wait


def test_cancelling_a_run_cancels_its_sync_child(harness):
    h = harness(HEAD + "steps: [{id: child, type: subflow, workflow: other}]\n")
    h.cancel()
    assert h.cancelled_children == [h.children["child"].child_run_id]


def test_emit_publishes_a_cloudevent(harness):
    h = harness(
        HEAD
        + """
steps:
  - {id: e, type: emit, event: {type: order.shipped, source: shop, data: {id: "{{ inputs.id }}"}}}
""",
        {"id": 7},
    )
    (event,) = h.emitted
    assert event["type"] == "order.shipped" and event["specversion"] == "1.0"
    assert event["data"] == {"id": 7} and event["source"] == "shop"
    assert event["id"] == f"{h.run_id}:e"
    assert h.state.steps["e"].output == event


def test_map_item_skipped_by_its_when_is_a_null_slot_not_a_failure(harness):
    h = harness(
        HEAD
        + """
steps:
  - id: each
    type: map
    items: "{{ inputs.items }}"
    step: {type: noop, when: "{{ item != 2 }}"}
output: "{{ steps.each.output }}"
""",
        {"items": [1, 2, 3]},
    )
    h.complete("each[0]", "a")
    h.complete("each[2]", "c")
    assert h.status == "succeeded"
    assert h.state.output == ["a", None, "c"]


def test_engine_step_timeout_stops_its_work_and_fails_it(harness):
    h = harness(
        HEAD
        + """
steps:
  - id: l
    type: loop
    timeout: 1m
    max_iterations: 100
    until: "false"
    delay: 10s
    steps: [{id: t, type: noop}]
"""
    )
    for i in range(6):
        h.complete(f"l@{i}/t")
        h.advance(10)
    assert h.state.steps["l"].error.type == "TimeoutError"
    assert h.status == "failed"
    assert ("l@6/t", 1) in h.cancelled_tasks


def test_emit_keeps_subject(harness):
    h = harness(HEAD + "steps: [{id: e, type: emit, event: {type: t, subject: order-7}}]\n")
    assert h.emitted[0]["subject"] == "order-7"


def test_map_failed_item_is_an_error_entry_a_real_null_stays_null(harness):
    h = harness(MAP, {"items": [1, 2]})
    h.complete("each[0]", None)
    h.fail("each[1]", "ValueError", "bad item")
    assert h.status == "succeeded"
    assert h.state.output == [
        None,
        {"error": {"type": "ValueError", "message": "bad item"}, "index": 1},
    ]


def test_a_loop_iteration_ended_by_a_skip_cascade_starts_the_next_iteration_once(harness):
    h = harness(
        HEAD
        + """
steps:
  - id: lp
    type: loop
    max_iterations: 3
    until: "{{ iteration >= 1 }}"
    steps:
      - {id: a, type: set, values: {x: 1}, when: "{{ false }}"}
      - {id: b, type: set, values: {x: 2}, depends_on: [a]}
"""
    )
    assert h.status == "succeeded"
    readied = [t.subject for t in h.transitions if t.new == "ready"]
    assert readied.count("lp@1/a") == 1
