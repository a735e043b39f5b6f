"""Compiling to a Plan: graph checks, expressions, references, warnings, normalisation."""

import hashlib
import json
import textwrap
from pathlib import Path
from typing import Any

import orjson
import pytest

from tideflow.dsl import compile_definition, load_plan, validate
from tideflow.errors import DefinitionError, Diagnostic
from tideflow.model.plan import NO_RETRY, Backoff, OnError, Plan, Priority

HEAD = 'name: flow\nversion: "1"\nsteps:\n'

ORDER = textwrap.dedent(
    """\
    name: order-fulfillment
    version: "1.2.0"
    description: Reserve, charge, ship.
    input:
      type: object
      required: [order_id, amount]
      properties: {order_id: {type: string}, amount: {type: number}, items: {type: array}}
    defaults:
      retry: {max_attempts: 3, backoff: exponential, initial_delay: 1s, max_delay: 30s}
      timeout: 30s
      queue: orders
      priority: high
    timeout: 1h
    on_failure: compensate
    output: "{{ steps.ship.output }}"
    steps:
      - id: reserve
        type: python
        function: examples.orders:reserve
        input: {order_id: "{{ inputs.order_id }}"}
        compensate:
          type: python
          function: examples.orders:release
          input: {reservation: "{{ steps.reserve.output.id }}"}
      - id: route
        type: switch
        depends_on: [reserve]
        cases:
          - when: "{{ inputs.amount > 1000 }}"
            next: [approve]
        default: [charge]
      - id: approve
        type: wait
        signal: approval
        match: "signal.order_id == inputs.order_id"
        timeout: 2d
        timeout_action: continue
      - id: charge
        type: http
        url: "https://pay.example.com/charge"
        method: POST
        body: {amount: "{{ inputs.amount }}"}
        retry: {backoff: 5s}
      - id: pack
        type: map
        depends_on: [approve, charge]
        items: "{{ inputs.items }}"
        max_concurrency: 4
        step:
          type: shell
          command: [echo, "{{ item }}"]
      - id: poll
        type: loop
        depends_on: [pack]
        max_iterations: 10
        delay: 5s
        until: "steps.check.output.done"
        steps:
          - id: check
            type: http
            url: "https://ship.example.com/status"
          - id: note
            type: noop
            depends_on: [check]
            input: {status: "{{ steps.check.output }}", order: "{{ steps.reserve.output }}"}
      - id: ship
        type: python
        depends_on: [poll]
        join: any
        cancel_others: true
        function: examples.orders:ship
        input: {status: "{{ steps.poll.output }}"}
    """
)


def diagnostics(text: str, **kwargs: Any) -> list[Diagnostic]:
    return validate(textwrap.dedent(text), file="flow.yaml", **kwargs)


def errors(text: str, **kwargs: Any) -> list[Diagnostic]:
    return [d for d in diagnostics(text, **kwargs) if d.severity == "error"]


def warnings(text: str) -> list[Diagnostic]:
    return [d for d in diagnostics(text) if d.severity == "warning"]


def one(found: list[Diagnostic]) -> Diagnostic:
    assert len(found) == 1, "\n".join(d.format() for d in found)
    return found[0]


def steps(text: str) -> str:
    return HEAD + textwrap.dedent(text)


def normal(text: str) -> dict[str, Any]:
    return dict(compile_definition(textwrap.dedent(text)).source)


# --- the plan ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def plan() -> Plan:
    return compile_definition(ORDER, file="order.yaml")


def test_plan_top_level(plan: Plan) -> None:
    assert (plan.name, plan.version, plan.description) == (
        "order-fulfillment",
        "1.2.0",
        "Reserve, charge, ship.",
    )
    assert plan.timeout == 3600.0
    assert plan.on_failure is OnError.COMPENSATE
    assert plan.input_schema is not None
    assert plan.input_schema["required"] == ["order_id", "amount"]
    assert plan.output is not None
    assert plan.output.render({"steps": {"ship": {"output": 7}}}) == 7


def test_plan_graph_and_owners(plan: Plan) -> None:
    assert plan.graph.steps == ("reserve", "route", "approve", "charge", "pack", "poll", "ship")
    assert plan.graph.roots == ("reserve",)
    assert plan.graph.sinks == ("ship",)
    assert plan.graph.dependents["route"] == ("approve", "charge")
    assert plan.owners == {"pack_item": "pack", "check": "poll", "note": "poll"}
    assert list(plan.specs) == [
        "reserve",
        "route",
        "approve",
        "charge",
        "pack",
        "pack_item",
        "poll",
        "check",
        "note",
        "ship",
    ]


def test_switch_targets_depend_on_the_switch(plan: Plan) -> None:
    route = plan.specs["route"].switch
    assert route is not None
    assert route.default == ("charge",)
    assert route.cases[0].next == ("approve",)
    assert route.cases[0].when.evaluate({"inputs": {"amount": 5000}}) is True
    assert route.targets == frozenset({"approve", "charge"})
    assert plan.specs["approve"].depends_on == ("route",)
    assert plan.specs["charge"].depends_on == ("route",)


def test_action_step_spec(plan: Plan) -> None:
    reserve = plan.specs["reserve"]
    assert reserve.is_action
    assert reserve.config is not None
    assert reserve.config.render({}) == {"function": "examples.orders:reserve"}
    assert reserve.input is not None
    assert reserve.input.render({"inputs": {"order_id": "o1"}}) == {"order_id": "o1"}
    assert reserve.timeout == 30.0
    assert reserve.queue == "orders"
    assert reserve.priority is Priority.HIGH
    assert reserve.retry.max_attempts == 3
    assert reserve.retry.backoff is Backoff.EXPONENTIAL
    assert reserve.retry.max_delay == 30.0
    assert reserve.line == 17
    compensation = reserve.compensate
    assert compensation is not None
    assert compensation.type == "python"
    assert compensation.config.render({}) == {"function": "examples.orders:release"}
    assert compensation.retry.max_attempts == 3
    assert compensation.timeout == 30.0


def test_retry_backoff_shorthand_merges_over_defaults(plan: Plan) -> None:
    charge = plan.specs["charge"].retry
    assert charge.max_attempts == 3
    assert charge.backoff is Backoff.FIXED
    assert charge.initial_delay == 5.0
    assert charge.max_delay == 30.0


def test_engine_step_specs(plan: Plan) -> None:
    approve = plan.specs["approve"]
    assert approve.wait is not None
    assert approve.wait.signal == "approval"
    assert approve.wait.timeout == 172800.0
    assert approve.wait.timeout_action == "continue"
    assert approve.timeout is None  # a wait's timeout is the wait timeout
    assert approve.retry is NO_RETRY  # defaults apply to action steps only
    assert approve.queue == "default"

    pack = plan.specs["pack"].map
    assert pack is not None
    assert (pack.template, pack.max_concurrency, pack.tolerated_failures) == ("pack_item", 4, 0)
    assert plan.specs["pack_item"].config is not None

    poll = plan.specs["poll"].loop
    assert poll is not None
    assert poll.max_iterations == 10
    assert poll.delay == 5.0
    assert poll.until is not None
    assert poll.while_ is None
    assert poll.body.steps == ("check", "note")
    assert poll.body.roots == ("check",)
    assert poll.body.sinks == ("note",)
    assert poll.body.dependents == {"check": ("note",), "note": ()}


def test_join_and_cancel_others(plan: Plan) -> None:
    join = plan.specs["ship"].join
    assert (join.kind, join.cancel_others) == ("any", True)
    assert plan.specs["reserve"].join.kind == "all"


def test_hash_is_sha256_of_the_sorted_normal_form(plan: Plan) -> None:
    expected = hashlib.sha256(orjson.dumps(plan.source, option=orjson.OPT_SORT_KEYS)).hexdigest()
    assert plan.hash == expected
    assert "defaults" not in plan.source
    assert plan == compile_definition(ORDER)


def test_json_definition_compiles_to_the_same_plan(plan: Plan, tmp_path: Path) -> None:
    import yaml

    text = json.dumps(yaml.safe_load(ORDER), indent=2)
    assert compile_definition(text).hash == plan.hash
    path = tmp_path / "order.json"
    path.write_text(text)
    assert load_plan(path).hash == plan.hash
    assert compile_definition(yaml.safe_load(ORDER)).hash == plan.hash


def test_other_engine_steps() -> None:
    compiled = compile_definition(
        steps(
            """\
            - {id: vals, type: set, values: {total: "{{ inputs.a + 1 }}"}}
            - {id: nap, type: sleep, duration: 10m, depends_on: [vals]}
            - {id: later, type: sleep, until: "{{ steps.vals.output.at }}", depends_on: [vals]}
            - id: child
              type: subflow
              workflow: billing
              version: "2"
              mode: async
              input: {total: "{{ steps.vals.output.total }}"}
              depends_on: [vals]
            - {id: tell, type: emit, event: {type: order.done, data: {n: 1}}}
            - id: repeat
              type: loop
              max_iterations: 3
              while: "iteration < 2"
              steps: [{id: tick, type: noop}]
            """
        )
    )
    specs = compiled.specs
    assert specs["vals"].set_values is not None
    assert specs["vals"].set_values.render({"inputs": {"a": 1}}) == {"total": 2}
    assert specs["nap"].sleep is not None
    assert specs["nap"].sleep.duration == 600.0
    assert specs["later"].sleep is not None
    assert specs["later"].sleep.until is not None
    child = specs["child"].subflow
    assert child is not None
    assert (child.workflow, child.version, child.mode) == ("billing", "2", "async")
    assert specs["tell"].emit is not None
    assert specs["tell"].emit.render({}) == {"type": "order.done", "data": {"n": 1}}
    loop = specs["repeat"].loop
    assert loop is not None
    assert loop.while_ is not None
    assert loop.until is None


def test_default_fail_and_at_least_join() -> None:
    compiled = compile_definition(
        steps(
            """\
            - {id: route, type: switch, cases: [{when: "true", next: [a, b]}], default: fail}
            - {id: a, type: noop}
            - {id: b, type: noop}
            - {id: merge, type: noop, depends_on: [a, b], join: {at_least: 2}}
            """
        )
    )
    switch = compiled.specs["route"].switch
    assert switch is not None
    assert switch.default is None
    assert compiled.specs["merge"].join.kind == "at_least"
    assert compiled.specs["merge"].join.at_least == 2


def test_sensitive_is_stored() -> None:
    compiled = compile_definition(steps("- {id: a, type: noop, sensitive: [token, card]}\n"))
    assert compiled.specs["a"].sensitive == ("card", "token")


def test_a_spec_knows_once_what_the_core_asks_of_it_per_attempt() -> None:
    compiled = compile_definition(
        steps(
            "- {id: plain, type: python, config: {function: m:f}, input: {n: 1}}\n"
            "- id: templated\n"
            "  type: http\n"
            "  config: {url: 'https://x', headers: {a: '{{ secrets.B_KEY }}'}}\n"
            "  input: {token: '{{ secrets.A_KEY }}'}\n"
            "  compensate: {type: http, config: {url: '{{ secrets.UNDO }}'}, input: {}}\n"
            "- {id: guarded, type: noop, when: 'inputs.go == 1'}\n"
            "- {id: pause, type: sleep, duration: 1s}\n"
        )
    )
    specs = compiled.specs
    assert [specs[i].is_action for i in ("plain", "templated", "guarded", "pause")] == [
        True,
        True,
        True,
        False,
    ]
    assert specs["plain"].constant_action  # no scope to build when it starts
    assert not specs["templated"].constant_action  # its templates read secrets
    assert not specs["guarded"].constant_action  # its when reads the inputs
    assert not specs["pause"].constant_action  # not an action
    assert specs["templated"].secrets == ("A_KEY", "B_KEY")
    assert specs["templated"].compensation_secrets == ("UNDO",)
    assert specs["plain"].secrets == specs["plain"].compensation_secrets == ()


# --- static checks -------------------------------------------------------------------


def test_duplicate_ids_name_both_lines_including_nested_steps() -> None:
    error = one(
        errors(
            steps(
                """\
                - {id: check, type: noop}
                - id: poll
                  type: loop
                  max_iterations: 2
                  until: "true"
                  steps:
                    - {id: check, type: noop}
                """
            )
        )
    )
    assert error.message == "duplicate step id 'check' (defined on lines 4 and 10)"
    assert (error.line, error.column, error.step_id) == (10, 12, "check")
    assert error.hint is not None
    assert "unique across the whole definition" in error.hint


def test_unknown_depends_on_suggests_a_step() -> None:
    error = one(
        errors(steps("- {id: reserve, type: noop}\n- {id: b, type: noop, depends_on: [reserv]}\n"))
    )
    assert error.message == "depends_on names unknown step 'reserv'"
    assert error.hint == "did you mean 'reserve'?"
    assert (error.line, error.column, error.step_id) == (5, 36, "b")


def test_depends_on_may_not_leave_its_graph() -> None:
    error = one(
        errors(
            steps(
                """\
                - {id: a, type: noop}
                - id: poll
                  type: loop
                  max_iterations: 2
                  until: "true"
                  steps:
                    - {id: inner, type: noop}
                - {id: after, type: noop, depends_on: [inner]}
                """
            )
        )
    )
    assert error.message == "'inner' is inside 'poll', not in the same graph as 'after'"
    assert error.step_id == "after"
    assert error.line == 11


def test_nested_step_depending_on_a_top_level_step_is_an_error() -> None:
    error = one(
        errors(
            steps(
                """\
                - {id: a, type: noop}
                - id: poll
                  type: loop
                  max_iterations: 2
                  until: "true"
                  depends_on: [a]
                  steps:
                    - {id: inner, type: noop, depends_on: [a]}
                """
            )
        )
    )
    assert error.message == "'a' is at the top level, not in the same graph as 'inner'"
    assert error.hint is not None
    assert "same level" in error.hint


def test_unknown_switch_target() -> None:
    found = errors(
        steps(
            """\
            - id: route
              type: switch
              cases: [{when: "true", next: [aprove]}]
              default: [self_]
            - {id: approve, type: noop}
            """
        )
    )
    first, second = found
    assert first.message == "next names unknown step 'aprove'"
    assert first.hint == "did you mean 'approve'?"
    assert (first.line, first.column) == (6, 33)
    assert second.line == 7


def test_switch_targeting_itself() -> None:
    error = one(
        errors(steps("- {id: r, type: switch, cases: [{when: x, next: [r]}], default: fail}\n"))
    )
    assert error.message == "switch 'r' targets itself"


def test_cycle_prints_the_path() -> None:
    error = one(
        errors(
            steps(
                """\
                - {id: a, type: noop, depends_on: [c]}
                - {id: b, type: noop, depends_on: [a]}
                - {id: c, type: noop, depends_on: [b]}
                - {id: d, type: noop, depends_on: [d]}
                """
            )
        )[:1]
    )
    assert error.message == "dependency cycle: a -> b -> c -> a"
    assert (error.line, error.column, error.step_id) == (4, 36, "a")
    assert error.hint is not None
    assert "loop step" in error.hint
    self_loop = errors(steps("- {id: d, type: noop, depends_on: [d]}\n"))
    assert one(self_loop).message == "dependency cycle: d -> d"


def test_cycle_through_a_switch_edge() -> None:
    error = one(
        errors(
            steps(
                """\
                - {id: start, type: noop, depends_on: [fix]}
                - {id: route, type: switch, depends_on: [start], cases: [{when: x, next: [fix]}], default: fail}
                - {id: fix, type: noop}
                """
            )
        )
    )
    assert error.message == "dependency cycle: start -> route -> fix -> start"


def test_cycle_inside_a_loop_body() -> None:
    error = one(
        errors(
            steps(
                """\
                - id: poll
                  type: loop
                  max_iterations: 2
                  until: "true"
                  steps:
                    - {id: x, type: noop, depends_on: [y]}
                    - {id: y, type: noop, depends_on: [x]}
                """
            )
        )
    )
    assert error.message == "dependency cycle: x -> y -> x"
    assert error.step_id == "x"


def test_join_at_least_more_than_dependencies() -> None:
    error = one(
        errors(
            steps(
                "- {id: a, type: noop}\n- {id: b, type: noop, depends_on: [a], join: {at_least: 2}}\n"
            )
        )
    )
    assert error.message == "join needs 2 dependencies to succeed, but 'b' has 1"
    assert error.line == 5


def test_expression_parse_error_points_at_the_column() -> None:
    error = one(errors(steps('- {id: a, type: noop, when: "inputs.x >"}\n')))
    assert error.message.startswith("invalid syntax")
    assert error.step_id == "a"
    assert error.hint == "check operators, quotes and brackets"
    # `"` is column 29, the text starts at 30, the error is at its end (offset 10)
    assert (error.line, error.column) == (4, 40)


def test_template_parse_error_points_into_the_string() -> None:
    error = one(
        errors(
            steps(
                """\
                - id: a
                  type: noop
                  input:
                    x: ok
                    y: 'id-{{ inputs.id + }}'
                """
            )
        )
    )
    assert error.path == "steps[0].input.y"
    assert error.line == 8
    assert error.column is not None
    assert error.column > 8


def test_expression_error_in_a_written_out_template_form() -> None:
    error = one(errors(steps('- {id: a, type: noop, when: "{{ 1 + }}"}\n')))
    assert error.line == 4
    assert error.column is not None
    assert error.column >= 30


def test_reading_a_step_that_is_not_a_dependency() -> None:
    error = one(
        errors(
            steps(
                """\
                - {id: a, type: noop}
                - {id: b, type: noop, input: {x: "{{ steps.a.output }}"}}
                """
            )
        )
    )
    assert error.message == "step 'b' reads steps.a but does not depend on a"
    assert error.hint == "add a to depends_on"
    assert (error.line, error.step_id, error.path) == (5, "b", "steps[1].input.x")


def test_reading_a_transitive_dependency_is_fine() -> None:
    text = steps(
        """\
        - {id: a, type: noop}
        - {id: b, type: noop, depends_on: [a]}
        - {id: c, type: noop, depends_on: [b], when: "steps.a.output.ok"}
        """
    )
    assert errors(text) == []


def test_reading_an_unknown_step_suggests_one() -> None:
    error = one(
        errors(
            steps(
                """\
                - {id: charge, type: noop}
                - {id: b, type: noop, depends_on: [charge], when: "steps.charg.output"}
                """
            )
        )
    )
    assert error.message == "step 'b' reads steps.charg, but there is no step 'charg'"
    assert error.hint == "did you mean 'charge'?"


def test_a_step_may_not_read_itself_but_its_compensation_may() -> None:
    error = one(errors(steps('- {id: a, type: noop, input: {x: "{{ steps.a.output }}"}}\n')))
    assert error.message == "step 'a' reads its own result (steps.a)"
    ok = steps(
        """\
        - id: a
          type: noop
          compensate: {type: noop, input: {undo: "{{ steps.a.output }}"}}
        """
    )
    assert errors(ok) == []


def test_nested_steps_read_owner_dependencies_and_loop_conditions_read_the_body() -> None:
    ok = steps(
        """\
        - {id: first, type: noop}
        - id: poll
          type: loop
          depends_on: [first]
          max_iterations: 3
          until: "steps.check.output.done and iteration > 0"
          steps:
            - {id: check, type: noop, input: {x: "{{ steps.first.output }}"}}
        - id: each
          type: map
          depends_on: [poll]
          items: "{{ steps.poll.output }}"
          step: {type: noop, input: {x: "{{ steps.first.output }}", i: "{{ item }}"}}
        """
    )
    assert errors(ok) == []


def test_reading_a_nested_step_from_outside() -> None:
    error = one(
        errors(
            steps(
                """\
                - id: poll
                  type: loop
                  max_iterations: 3
                  until: "true"
                  steps: [{id: check, type: noop}]
                - {id: after, type: noop, depends_on: [poll], when: "steps.check.output"}
                """
            )
        )
    )
    assert error.message == "step 'after' reads steps.check but does not depend on check"
    assert error.hint == "'check' runs inside 'poll'; read steps.poll.output and depend on poll"


def test_nested_step_reading_a_top_level_step_its_loop_does_not_depend_on() -> None:
    error = one(
        errors(
            steps(
                """\
                - {id: a, type: noop}
                - id: poll
                  type: loop
                  max_iterations: 3
                  until: "true"
                  steps: [{id: check, type: noop, when: "steps.a.output"}]
                """
            )
        )
    )
    assert error.hint == "add a to depends_on of 'poll' (which contains 'check')"


def test_run_output_reads_any_top_level_step_only() -> None:
    ok = 'output: "{{ steps.b.output }}"\n' + steps(
        "- {id: a, type: noop}\n- {id: b, type: noop}\n"
    )
    assert errors(ok) == []
    bad = 'output: {x: "{{ steps.check.output }}"}\n' + steps(
        "- {id: poll, type: loop, max_iterations: 2, until: 'true', steps: [{id: check, type: noop}]}\n"
    )
    error = one(errors(bad))
    assert error.message == "the run output reads steps.check, which is not a top-level step"
    assert error.hint == "'check' runs inside 'poll'; read steps.poll.output"
    assert (error.line, error.path) == (1, "output.x")


# --- warnings ------------------------------------------------------------------------


def test_constant_false_when_is_a_warning_and_propagates() -> None:
    text = steps(
        """\
        - {id: a, type: noop, when: false}
        - {id: b, type: noop, depends_on: [a]}
        - {id: c, type: noop, when: "inputs.go"}
        """
    )
    found = warnings(text)
    assert [(w.step_id, w.message) for w in found] == [
        ("a", "step 'a' can never run: its `when` is always false"),
        ("b", "step 'b' can never run: none of its dependencies can ever run"),
    ]
    assert found[0].line == 4
    assert compile_definition(textwrap.dedent(text)).specs["a"].when is not None


def test_join_over_exclusive_switch_branches_can_never_run() -> None:
    text = steps(
        """\
        - id: route
          type: switch
          cases: [{when: "inputs.x", next: [a]}]
          default: [b]
        - {id: a, type: noop}
        - {id: b, type: noop}
        - {id: merge, type: noop, depends_on: [a, b]}
        - {id: both, type: noop, depends_on: [a, b], join: {at_least: 2}}
        """
    )
    found = warnings(text)
    assert [w.step_id for w in found] == ["both"]
    assert "at most 1 can" in found[0].message


def test_undeclared_input_is_a_warning() -> None:
    text = (
        'name: flow\nversion: "1"\ninput: {type: object, properties: {amount: {type: number}}}\n'
        'steps: [{id: a, type: noop, input: {x: "{{ inputs.amont }}", y: "{{ .amount }}"}}]\n'
    )
    warning = one(warnings(text))
    assert warning.message == "inputs.amont is not declared in the input schema"
    assert warning.hint is not None
    assert warning.hint.startswith("did you mean 'amount'?")
    assert warning.line == 4
    compile_definition(text)  # warnings do not fail the compile


def test_no_input_warning_without_declared_properties() -> None:
    assert warnings(steps('- {id: a, type: noop, input: {x: "{{ inputs.anything }}"}}\n')) == []


def test_secrets_in_engine_expressions_are_a_warning() -> None:
    text = steps(
        """\
        - {id: a, type: set, values: {token: "{{ secrets.TOKEN }}"}}
        - {id: b, type: http, url: "https://x", headers: {Authorization: "{{ secrets.TOKEN }}"}}
        """
    )
    warning = one(warnings(text))
    assert warning.step_id == "a"
    assert "secrets.TOKEN" in warning.message


# --- normalisation -------------------------------------------------------------------


def test_direct_config_keys_equal_an_explicit_config_block() -> None:
    direct = normal(steps("- {id: a, type: http, url: 'https://x', method: POST}\n"))
    explicit = normal(steps("- {id: a, type: http, config: {url: 'https://x', method: POST}}\n"))
    mixed = normal(steps("- {id: a, type: http, url: 'https://x', config: {method: POST}}\n"))
    assert direct == explicit == mixed
    assert direct["steps"][0]["config"] == {"url": "https://x", "method": "POST"}


def test_equivalent_definitions_normalise_alike() -> None:
    short = steps(
        """\
        - {id: a, type: noop}
        - {id: b, type: noop}
        - {id: c, type: noop, depends_on: [b, a], when: "inputs.x > 1", retry: 4}
        - {id: r, type: switch, cases: [{when: "true", next: [e, d]}], default: fail}
        - {id: d, type: noop}
        - {id: e, type: noop}
        """
    )
    long = steps(
        """\
        - {id: a, type: noop, queue: default, priority: normal, on_error: fail}
        - {id: b, type: noop, join: all, retry: {max_attempts: 1, backoff: fixed}}
        - id: c
          type: noop
          depends_on: [a, b, a]
          when: "{{ inputs.x > 1 }}"
          retry: {max_attempts: 4, backoff: exponential, initial_delay: 1s, multiplier: 2}
        - {id: r, type: switch, cases: [{when: "{{ true }}", next: [d, e]}], default: fail}
        - {id: d, type: noop, depends_on: [r]}
        - {id: e, type: noop, depends_on: [r]}
        """
    )
    assert normal(short) == normal(long)
    assert compile_definition(short).hash == compile_definition(long).hash


def test_defaults_inheritance() -> None:
    text = (
        'name: flow\nversion: "1"\n'
        "defaults: {timeout: 30s, queue: fast, priority: low, retry: {max_attempts: 5, jitter: true}}\n"
        + textwrap.dedent(
            """\
            steps:
              - {id: plain, type: noop}
              - {id: own, type: noop, timeout: 1m, queue: slow, priority: high, retry: 2}
              - {id: opt_out, type: noop, retry: false}
              - {id: nap, type: sleep, duration: 1h}
            """
        )
    )
    specs = compile_definition(text).specs
    plain, own, opt_out, nap = (specs[s] for s in ("plain", "own", "opt_out", "nap"))
    assert (plain.timeout, plain.queue, plain.priority) == (30.0, "fast", Priority.LOW)
    assert (plain.retry.max_attempts, plain.retry.jitter) == (5, True)
    assert (own.timeout, own.queue, own.priority) == (60.0, "slow", Priority.HIGH)
    assert (own.retry.max_attempts, own.retry.jitter) == (2, True)  # merged key by key
    assert opt_out.retry is NO_RETRY
    assert (nap.timeout, nap.queue, nap.retry) == (None, "default", NO_RETRY)


def test_retry_block_without_max_attempts_means_three() -> None:
    specs = compile_definition(steps("- {id: a, type: noop, retry: {jitter: true}}\n")).specs
    assert specs["a"].retry.max_attempts == 3


def test_error_from_defaults_is_reported_at_the_defaults() -> None:
    text = 'name: flow\nversion: "1"\ndefaults: {timeout: 30s}\nsteps: [{id: a, type: noop}]\n'
    assert compile_definition(text).specs["a"].timeout == 30.0


def test_map_template_gets_an_id() -> None:
    compiled = normal(steps("- {id: each, type: map, items: [1, 2], step: {type: noop}}\n"))
    assert compiled["steps"][0]["step"]["id"] == "each_item"


# --- the API -------------------------------------------------------------------------


def test_compile_raises_with_every_error() -> None:
    with pytest.raises(DefinitionError) as info:
        compile_definition(steps("- {id: a, type: noop, depends_on: [x, y]}\n"), file="f.yaml")
    assert len(info.value.diagnostics) == 2
    assert "f.yaml:4:" in str(info.value)


def test_validate_never_raises_for_bad_yaml() -> None:
    found = validate("name: [\n", file="f.yaml")
    assert len(found) == 1
    assert found[0].message.startswith("YAML syntax error")


def test_load_plan_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "flow.yaml"
    path.write_text(steps("- {id: a, type: noop, depends_on: [b]}\n"))
    with pytest.raises(DefinitionError) as info:
        load_plan(path)
    assert info.value.diagnostics[0].file == str(path)


def test_validate_input_reports_every_error_best_first() -> None:
    from tideflow.dsl import validate_input
    from tideflow.errors import InputValidationError

    compiled = compile_definition(
        'name: flow\nversion: "1"\n'
        "input:\n  type: object\n  required: [order_id]\n"
        "  properties: {amount: {type: number}, items: {type: array, items: {type: string}}}\n"
        "steps: [{id: a, type: noop}]\n"
    )
    validate_input(compiled, {"order_id": "o1", "amount": 3, "items": ["x"]})
    with pytest.raises(InputValidationError) as info:
        validate_input(compiled, {"amount": "3", "items": ["x", 2]})
    lines = str(info.value).splitlines()
    assert lines[0] == "run input of flow 1 does not match its input schema:"
    assert lines[1] == "  $: 'order_id' is a required property"
    assert "  $.amount: '3' is not of type 'number'" in lines
    assert "  $.items[1]: 2 is not of type 'string'" in lines
    assert info.value.fields[0] == ("$", "'order_id' is a required property")
    assert ("$.amount", "'3' is not of type 'number'") in info.value.fields


def test_validate_input_without_schema_accepts_anything() -> None:
    from tideflow.dsl import validate_input

    validate_input(compile_definition(steps("- {id: a, type: noop}\n")), [1, "anything"])


@pytest.mark.parametrize(
    ("call", "message"),
    [
        ("random_int(6, 1)", "random_int(6, 1): the low bound is above the high bound"),
        ("random_int(1.5, 3)", "random_int() takes two integers, got a number (1.5)"),
        ("random_int('a', x)", "random_int() takes two integers, got a string"),
        ("random_int(1)", "random_int() takes 2 argument(s), got 1"),
        ("uuid(1)", "uuid() takes 0 argument(s), got 1"),
        ("random(1, 2)", "random() takes 0 argument(s), got 2"),
    ],
)
def test_replay_safe_random_functions_check_their_arguments(call: str, message: str) -> None:
    error = one(errors(steps(f'- {{id: a, type: noop, input: {{n: "{{{{ {call} }}}}"}}}}\n')))
    assert error.message.startswith(message)
    assert (error.line, error.step_id) == (4, "a")
    assert error.column is not None


def test_random_int_with_bounds_known_at_run_time_compiles() -> None:
    compile_definition(
        steps('- {id: a, type: noop, input: {n: "{{ random_int(-3, inputs.n) }}"}}\n')
    )


def test_schedule_to_start_and_idempotent_compile_and_keep_existing_hashes() -> None:
    from tideflow.dsl.compiler import compile_definition as compile_

    head = 'name: t\nversion: "1"\n'
    plan = compile_(
        head
        + "defaults: {schedule_to_start: 2m, timeout: 10s}\n"
        + "steps:\n  - {id: a, type: noop, idempotent: false}\n"
        + "  - {id: b, type: noop, schedule_to_start: 5s}\n"
        + "  - {id: s, type: sleep, duration: 1s}\n"
    )
    a, b, s = plan.specs["a"], plan.specs["b"], plan.specs["s"]
    assert (a.schedule_to_start, a.idempotent, a.timeout) == (120.0, False, 10.0)
    assert (b.schedule_to_start, b.idempotent) == (5.0, True)
    assert s.schedule_to_start is None  # defaults apply to action steps only
    plain = compile_(head + "steps: [{id: a, type: noop}]\n")
    explicit = compile_(head + "steps: [{id: a, type: noop, idempotent: true}]\n")
    assert plain.hash == explicit.hash  # the default is left out of the normal form
    assert "idempotent" not in plain.source["steps"][0]
