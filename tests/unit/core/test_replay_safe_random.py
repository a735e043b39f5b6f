"""`uuid()`, `random()` and `random_int(a, b)`: drawn from the run id, the step instance and
a per-call counter, so a replayed, restored or recovered run computes the same values."""

from __future__ import annotations

import re
import uuid

from tideflow.core.resume import resume_commands
from tideflow.model import codec
from tideflow.model.commands import DispatchTask
from tideflow.testing.harness import CoreHarness

from .conftest import plan_of

HEAD = """
name: t
version: "1"
"""

DRAWS = (
    HEAD
    + """
steps:
  - id: a
    type: noop
    input: {id: "{{ uuid() }}", other: "{{ uuid() }}", r: "{{ random() }}", n: "{{ random_int(1, 6) }}"}
  - id: b
    type: noop
    input: {id: "{{ uuid() }}", r: "{{ random() }}", n: "{{ random_int(1, 6) }}"}
"""
)


def _run(text: str, run_id: str = "run-1") -> CoreHarness:
    h = CoreHarness(plan_of(text), run_id=run_id)
    h.start({})
    return h


def test_same_run_and_step_give_the_same_values_and_calls_differ() -> None:
    first, second = _run(DRAWS), _run(DRAWS)
    a = first.tasks["a"].input
    assert a == second.tasks["a"].input
    assert uuid.UUID(a["id"]).version == 4
    assert a["id"] != a["other"]  # the per-call counter
    assert 0.0 <= a["r"] < 1.0
    assert a["n"] in range(1, 7) and isinstance(a["n"], int)


def test_other_steps_and_other_runs_draw_other_values() -> None:
    h = _run(DRAWS)
    a, b = h.tasks["a"].input, h.tasks["b"].input
    assert a["id"] != b["id"] and a["r"] != b["r"]
    other = _run(DRAWS, run_id="run-2").tasks["a"].input
    assert other["id"] != a["id"] and other["r"] != a["r"]


def test_loop_iterations_and_map_items_draw_their_own_values() -> None:
    h = _run(
        HEAD
        + """
steps:
  - id: each
    type: map
    items: [1, 2, 3]
    step: {id: item, type: noop, input: {id: "{{ uuid() }}"}}
  - id: poll
    type: loop
    max_iterations: 3
    until: "{{ iteration == 1 }}"
    steps:
      - {id: check, type: noop, input: {id: "{{ uuid() }}"}}
"""
    )
    ids = {h.tasks[f"each[{i}]"].input["id"] for i in range(3)}
    assert len(ids) == 3
    first = h.tasks["poll@0/check"].input["id"]
    h.complete("poll@0/check")
    assert h.tasks["poll@1/check"].input["id"] not in {first, *ids}


def test_replay_from_the_history_and_from_a_stored_state_gives_the_same_values() -> None:
    text = (
        HEAD
        + """
steps:
  - {id: a, type: noop}
  - {id: b, type: set, values: {id: "{{ uuid() }}", n: "{{ random_int(-5, 5) }}"}, depends_on: [a]}
"""
    )
    live = _run(text)
    live.complete("a")
    values = live.state.steps["b"].output
    assert re.fullmatch(r"[0-9a-f-]{36}", values["id"])
    replayed = CoreHarness(plan_of(text))
    for event in live.events:  # what a store does on load: replay the history
        replayed.apply(event)
    assert replayed.state.steps["b"].output == values
    restored = codec.loads(codec.dumps(live.state))
    assert restored.steps["b"].output == values


def test_config_draws_the_same_on_every_attempt_and_on_recovery() -> None:
    text = (
        HEAD
        + """
steps:
  - id: call
    type: http
    url: "https://example.com/orders"
    headers: {X-Request-Id: "{{ uuid() }}"}
    input: {id: "{{ uuid() }}"}
    retry: {max_attempts: 2, backoff: 1s}
"""
    )
    h = _run(text)
    first = h.tasks["call"].config["headers"]["X-Request-Id"]
    assert first != h.tasks["call"].input["id"]
    h.fail("call")
    h.advance(1)
    assert h.tasks["call"].attempt == 2
    assert h.tasks["call"].config["headers"]["X-Request-Id"] == first
    attempt_input = h.tasks["call"].input
    # a started attempt lost in a crash is dispatched again with the same config
    h.lost("call")
    assert h.tasks["call"].config["headers"]["X-Request-Id"] == first
    assert h.tasks["call"].input == attempt_input
    # an attempt recovery finds queued (never started) is dispatched again from the stored state
    queued = CoreHarness(plan_of(text), run_id="run-1", auto_start=False)
    queued.start({})
    restored = codec.loads(codec.dumps(queued.state))
    (task,) = [c for c in resume_commands(h.plan, restored, h.now) if isinstance(c, DispatchTask)]
    assert task.config["headers"]["X-Request-Id"] == first
