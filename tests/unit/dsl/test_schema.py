"""Structural checks: every error carries position, step id and a hint; all are collected."""

import textwrap
from typing import Any

import pytest

from tideflow.dsl import validate
from tideflow.errors import Diagnostic

HEAD = 'name: flow\nversion: "1"\nsteps:\n'


def errors(text: str, **kwargs: Any) -> list[Diagnostic]:
    found = validate(textwrap.dedent(text), file="flow.yaml", **kwargs)
    return [d for d in found if d.severity == "error"]


def steps_errors(text: str, **kwargs: Any) -> list[Diagnostic]:
    """Errors of a definition whose steps (from line 4) are ``text``."""
    return errors(HEAD + textwrap.dedent(text), **kwargs)


def one(found: list[Diagnostic]) -> Diagnostic:
    assert len(found) == 1, "\n".join(d.format() for d in found)
    return found[0]


def test_a_valid_definition_has_no_errors() -> None:
    assert steps_errors("- {id: a, type: noop}\n") == []


def test_unknown_key_suggests_among_the_keys_of_that_step_type() -> None:
    error = one(
        steps_errors(
            """\
            - id: call
              type: http
              url: https://example.com
              retyr: 3
            """
        )
    )
    assert error.message == "unknown key 'retyr' in an http step"
    assert (error.file, error.line, error.column) == ("flow.yaml", 7, 3)
    assert error.step_id == "call"
    assert error.hint == "did you mean 'retry'?"
    assert error.path == "steps[0].retyr"


def test_config_key_of_another_type_is_unknown_with_did_you_mean() -> None:
    error = one(steps_errors("- {id: a, type: python, function: 'm:f', urll: x}\n"))
    assert error.message == "unknown key 'urll' in a python step"
    assert error.hint is not None
    assert "allowed keys in a python step" in error.hint  # nothing close: list the keys

    error = one(steps_errors("- {id: a, type: http, url: 'https://x', mehtod: GET}\n"))
    assert error.hint == "did you mean 'method'?"


def test_unknown_top_level_key() -> None:
    error = one(errors('name: flow\nversion: "1"\ndescripton: x\nsteps: [{id: a, type: noop}]\n'))
    assert error.message == "unknown key 'descripton' at the top level"
    assert (error.line, error.column) == (3, 1)
    assert error.hint == "did you mean 'description'?"
    assert error.step_id is None


def test_missing_required_top_level_keys() -> None:
    found = errors("description: nothing\n")
    messages = {d.message for d in found}
    assert messages == {
        "missing required key 'name' at the top level",
        "missing required key 'version' at the top level",
        "missing required key 'steps' at the top level",
    }
    assert all(d.hint for d in found)


def test_definition_must_be_a_mapping() -> None:
    error = one(errors("- a\n- b\n"))
    assert error.message == "a definition must be a mapping, got a list"
    error = one(errors("flow.yaml"))
    assert error.hint is not None
    assert "pathlib.Path" in error.hint


def test_empty_steps() -> None:
    error = one(errors('name: flow\nversion: "1"\nsteps: []\n'))
    assert "non-empty list of steps" in error.message
    assert error.line == 3


def test_wrong_types_say_what_was_expected() -> None:
    found = steps_errors(
        """\
        - id: a
          type: noop
          depends_on: b
          description: [x]
          cancel_others: "yes"
          join: any
        """
    )
    by_path = {d.path: d for d in found}
    assert by_path["steps[0].depends_on"].message == (
        "expected a list of step ids, got a string ('b')"
    )
    assert by_path["steps[0].depends_on"].hint == "write [b]"
    assert by_path["steps[0].description"].message == "description must be a string, got a list"
    assert by_path["steps[0].cancel_others"].line == 8
    assert all(d.step_id == "a" for d in found)


def test_version_must_be_quoted() -> None:
    error = one(errors("name: flow\nversion: 1.2\nsteps: [{id: a, type: noop}]\n"))
    assert error.message == "version must be a string, got a number (1.2)"
    assert error.hint == 'quote it: version: "1.2"'
    assert (error.line, error.column) == (2, 10)


def test_bad_enum_value_lists_the_allowed_values() -> None:
    error = one(steps_errors("- {id: a, type: noop, priority: urgent}\n"))
    assert error.message == "invalid priority 'urgent'"
    assert error.hint == "allowed: high, low, normal"
    error = one(steps_errors("- {id: a, type: noop, on_error: continu}\n"))
    assert error.hint == "did you mean 'continue'? allowed: compensate, continue, fail"


def test_bad_durations() -> None:
    found = steps_errors(
        """\
        - id: a
          type: noop
          timeout: 5 minutes
          deadline: 0s
          retry: {max_attempts: 2, initial_delay: soon}
        """
    )
    assert {d.message for d in found} == {
        "initial_delay is not a valid duration: 'soon'",
        "timeout is not a valid duration: '5 minutes'",
        "deadline must be greater than zero, got '0s'",
    }
    timeout = next(d for d in found if "timeout" in d.message)
    assert (timeout.line, timeout.column) == (6, 12)
    assert timeout.hint is not None
    assert "PT5M" in timeout.hint


def test_bad_name_and_step_id_patterns_suggest_a_fix() -> None:
    found = errors('name: Order Flow\nversion: "1"\nsteps: [{id: Charge-Card, type: noop}]\n')
    name, step = found
    assert name.message.startswith("invalid name 'Order Flow'")
    assert name.hint is not None
    assert "'order_flow'" in name.hint
    assert step.message.startswith("invalid step id 'Charge-Card'")
    assert step.hint is not None
    assert "'charge_card'" in step.hint
    assert (step.line, step.column) == (3, 14)


def test_missing_step_id_and_type() -> None:
    found = steps_errors("- {type: noop}\n- {id: b}\n")
    assert [d.message for d in found] == [
        "missing required key 'id' in step",
        "missing required key 'type' in step",
    ]
    assert found[1].step_id == "b"
    assert found[1].hint is not None
    assert "python" in found[1].hint


def test_unknown_step_type_suggests_action_and_engine_types() -> None:
    error = one(steps_errors("- {id: a, type: swich}\n"))
    assert error.message == "unknown step type 'swich'"
    assert error.hint is not None
    assert error.hint.startswith("did you mean 'switch'?")
    assert "python" in error.hint
    assert "subflow" in error.hint
    assert (error.line, error.column) == (4, 17)


def test_all_errors_are_collected() -> None:
    found = steps_errors(
        """\
        - {id: a, type: noop, priorty: high}
        - {id: B, type: noop}
        - {id: c, type: wat}
        - {id: d, type: sleep}
        """
    )
    assert len(found) == 4
    assert [d.line for d in found] == [4, 5, 6, 7]


def test_switch_without_default() -> None:
    error = one(
        steps_errors(
            """\
            - id: route
              type: switch
              cases: [{when: "inputs.x > 1", next: [a]}]
            - {id: a, type: noop}
            """
        )
    )
    assert error.message == "missing required key 'default' in a switch step"
    assert error.hint == "add `default: [step ids]` (run when no case matches) or `default: fail`"
    assert (error.line, error.step_id) == (4, "route")


def test_switch_default_must_be_a_list_or_fail() -> None:
    error = one(
        steps_errors(
            """\
            - {id: route, type: switch, cases: [{when: x, next: [a]}], default: a}
            - {id: a, type: noop}
            """
        )
    )
    assert error.hint == "write default: [a] (a list of step ids) or default: fail"


def test_switch_case_keys() -> None:
    found = steps_errors(
        """\
        - {id: route, type: switch, cases: [{when: x, nxt: [a]}], default: fail}
        - {id: a, type: noop}
        """
    )
    messages = {d.message for d in found}
    assert "unknown key 'nxt' in a switch case" in messages
    assert "missing required key 'next' in a switch case" in messages


def test_loop_without_max_iterations() -> None:
    error = one(
        steps_errors(
            """\
            - id: poll
              type: loop
              until: steps.check.output.done
              steps: [{id: check, type: noop}]
            """
        )
    )
    assert error.message == "missing required key 'max_iterations' in a loop step"
    assert error.hint is not None
    assert "max_iterations: N" in error.hint
    assert error.step_id == "poll"


def test_loop_needs_exactly_one_condition() -> None:
    neither = one(
        steps_errors("- {id: poll, type: loop, max_iterations: 3, steps: [{id: c, type: noop}]}\n")
    )
    assert "needs `until` or `while`" in neither.message
    both = one(
        steps_errors(
            "- {id: poll, type: loop, max_iterations: 3, until: a, while: b,"
            " steps: [{id: c, type: noop}]}\n"
        )
    )
    assert both.message == "a loop takes `until` or `while`, not both"


def test_loop_body_steps_are_checked_with_their_own_ids() -> None:
    found = steps_errors(
        """\
        - id: poll
          type: loop
          max_iterations: 0
          until: "true"
          steps:
            - {id: check, type: noop, retries: 3}
        """
    )
    assert {(d.step_id, d.message) for d in found} == {
        ("poll", "max_iterations must be at least 1, got 0"),
        ("check", "unknown key 'retries' in a noop step"),
    }


def test_nested_step_errors_name_the_nested_step() -> None:
    found = steps_errors(
        """\
        - id: poll
          type: loop
          max_iterations: 2
          until: "true"
          steps:
            - {id: check, type: noop, retries: 3}
        """
    )
    error = one(found)
    assert error.step_id == "check"
    assert error.hint == "did you mean 'retry'?"
    assert error.line == 9


def test_sleep_needs_duration_or_until() -> None:
    error = one(steps_errors("- {id: nap, type: sleep, duration: 5m, until: x}\n"))
    assert error.message == "a sleep step needs exactly one of `duration` or `until`"


def test_map_template_is_checked_and_may_not_have_depends_on() -> None:
    found = steps_errors(
        """\
        - id: each
          type: map
          items: "{{ inputs.items }}"
          tolerated_failures: -1
          step: {type: noop, depends_on: [x], qeue: fast}
        """
    )
    messages = {d.message: d for d in found}
    assert "tolerated_failures must be at least 0, got -1" in messages
    template = messages["a map template cannot have depends_on"]
    assert template.step_id == "each_item"
    assert template.hint == "put the dependencies on the map step 'each'"
    assert messages["unknown key 'qeue' in a noop step"].hint == "did you mean 'queue'?"


def test_join_forms() -> None:
    ok = "- {id: a, type: noop}\n- {id: b, type: noop, depends_on: [a], join: {at_least: 1}}\n"
    assert steps_errors(ok) == []
    bad = one(steps_errors("- {id: a, type: noop, join: some}\n"))
    assert bad.hint == "write join: all, join: any or join: {at_least: N}"
    cancel = one(steps_errors("- {id: a, type: noop, cancel_others: true}\n"))
    assert cancel.message == "cancel_others needs `join: any` or `join: {at_least: N}`"


def test_retry_forms() -> None:
    assert steps_errors("- {id: a, type: noop, retry: 3}\n") == []
    assert steps_errors("- {id: a, type: noop, retry: false}\n") == []
    assert steps_errors("- {id: a, type: noop, retry: {backoff: 5s}}\n") == []
    found = steps_errors(
        "- {id: a, type: noop, retry: {backoff: 5s, initial_delay: 1s, multiplier: 0,"
        " backof: x, retry_on: Timeout}}\n"
    )
    messages = {d.message for d in found}
    assert messages == {
        "unknown key 'backof' in retry",
        "multiplier must be greater than zero, got 0",
        "expected a list of error type names, got a string ('Timeout')",
        "initial_delay conflicts with a duration in `backoff`",
    }
    bad = one(steps_errors("- {id: a, type: noop, retry: {backoff: sometimes}}\n"))
    assert bad.hint == "write one of fixed, linear, exponential, or a duration (fixed delay)"


def test_defaults_block() -> None:
    error = one(
        errors(
            HEAD.replace("steps:", "defaults: {timeout: 1s, retries: 2}\nsteps:")
            + "- {id: a, type: noop}\n"
        )
    )
    assert error.message == "unknown key 'retries' in defaults"
    assert error.hint == "did you mean 'retry'?"


def test_input_schema_must_be_valid_json_schema() -> None:
    text = 'name: flow\nversion: "1"\ninput:\n  type: object\n  properties:\n    n: {type: integr}\nsteps: [{id: a, type: noop}]\n'
    error = one(errors(text))
    assert error.message.startswith("invalid input schema: ")
    assert error.path == "input.properties.n.type"
    assert error.line == 6


def test_action_config_is_validated_at_the_config_key() -> None:
    found = steps_errors(
        """\
        - id: run
          type: shell
          command: "echo hi"
          max_output_bytes: 0
        - {id: call, type: http, url: "ftp://x", expect_status: [200, 999]}
        - {id: py, type: python, function: "not a path"}
        """
    )
    by_step = {d.step_id: d for d in found}
    assert len(found) == 5
    command = next(d for d in found if "command" in d.message)
    assert command.message == "invalid shell config command: 'echo hi' is not of type 'array'"
    assert command.hint == "expected a list of argv strings, e.g. [echo, hello]"
    assert (command.line, command.column) == (6, 12)
    assert by_step["call"].line == 8
    assert by_step["py"].hint == (
        "expected an import path 'pkg.module:callable' or a registered name"
    )


@pytest.mark.parametrize("function", ["pkg.mod:func", "pkg.mod:Class.method", "registered.name"])
def test_python_function_forms(function: str) -> None:
    assert steps_errors(f"- {{id: a, type: python, function: '{function}'}}\n") == []


def test_missing_required_config_key() -> None:
    error = one(steps_errors("- {id: call, type: http, method: GET}\n"))
    assert error.message == "missing required key 'url' in http config"
    assert error.hint == "add `url:` (an http(s) URL)"


def test_explicit_config_block_is_checked_too() -> None:
    found = steps_errors("- {id: call, type: http, config: {url: 'https://x', mehtod: GET}}\n")
    error = one(found)
    assert error.message == "unknown key 'mehtod' in http config"
    assert error.hint == "did you mean 'method'?"
    conflict = one(
        steps_errors("- {id: c, type: http, url: 'https://a', config: {url: 'https://b'}}\n")
    )
    assert conflict.message == "'url' is given both on the step and under config"


def test_template_strings_are_accepted_where_other_types_are_expected() -> None:
    found = steps_errors(
        """\
        - id: run
          type: shell
          command: "{{ inputs.command }}"
          max_output_bytes: "{{ inputs.limit }}"
        - id: call
          type: http
          url: "{{ inputs.base }}/charge"
          expect_status: "{{ inputs.status }}"
          headers: {X-Id: "{{ run.id }}"}
          config: {timeout: "{{ inputs.t }}"}
        """
    )
    assert found == []


def test_http_config_timeout_is_a_duration() -> None:
    error = one(steps_errors("- {id: c, type: http, url: 'https://a', config: {timeout: soon}}\n"))
    assert error.message == "invalid timeout duration 'soon'"


def test_compensate_is_an_action_with_its_type_keys() -> None:
    found = steps_errors(
        """\
        - id: a
          type: noop
          compensate: {type: python, functon: "m:f", retry: 2}
        - id: b
          type: noop
          compensate: {type: sleep}
        """
    )
    messages = [d.message for d in found]
    assert "unknown key 'functon' in a python compensation" in messages
    assert "missing required key 'function' in python config" in messages
    assert "unknown action type 'sleep'" in messages


def test_plugin_action_types() -> None:
    types: dict[str, Any] = {
        "ftp": {
            "type": "object",
            "properties": {"host": {"type": "string"}},
            "required": ["host"],
        },
        "anything": None,
    }
    assert steps_errors("- {id: a, type: ftp, host: x}\n", action_types=types) == []
    assert steps_errors("- {id: a, type: anything, whatever: 1}\n", action_types=types) == []
    typo, missing = steps_errors("- {id: a, type: ftp, hots: x}\n", action_types=types)
    assert typo.hint == "did you mean 'host'?"
    assert missing.message == "missing required key 'host' in ftp config"
    error = one(steps_errors("- {id: a, type: python, function: 'm:f'}\n", action_types=types))
    assert error.message == "unknown step type 'python'"


def test_emit_and_subflow_and_wait_keys() -> None:
    found = steps_errors(
        """\
        - {id: e, type: emit, event: {source: x, dta: 1}}
        - {id: s, type: subflow, workflow: Other Flow, mode: later}
        - {id: w, type: wait, timeout_action: skip}
        """
    )
    messages = {d.message for d in found}
    assert messages == {
        "unknown key 'dta' in event",
        "missing required key 'type' in event",
        "invalid name 'Other Flow': must match [a-z0-9][a-z0-9_.-]*",
        "invalid mode 'later'",
        "missing required key 'signal' in a wait step",
        "invalid timeout_action 'skip'",
    }


def test_expression_keys_accept_booleans_but_not_other_values() -> None:
    assert steps_errors("- {id: a, type: noop, when: false}\n") == []
    error = one(steps_errors("- {id: a, type: noop, when: 3}\n"))
    assert error.message == "expected an expression string, got an integer (3)"


@pytest.mark.parametrize("key", ["input", "values"])
def test_mappings_of_templates(key: str) -> None:
    kind = "set" if key == "values" else "noop"
    error = one(steps_errors(f"- {{id: a, type: {kind}, {key}: [1]}}\n"))
    assert error.step_id == "a"
    assert error.line == 4


def test_schedule_to_start_and_idempotent_are_checked_on_action_steps() -> None:
    assert steps_errors("- {id: a, type: noop, schedule_to_start: 30s, idempotent: false}\n") == []
    bad_bool = one(steps_errors("- {id: a, type: noop, idempotent: 'no'}\n"))
    assert "idempotent must be true or false" in bad_bool.message
    assert (bad_bool.step_id, bad_bool.line) == ("a", 4)
    bad_duration = one(steps_errors("- {id: a, type: noop, schedule_to_start: soon}\n"))
    assert "schedule_to_start is not a valid duration" in bad_duration.message
    assert bad_duration.hint and "30s" in bad_duration.hint
    zero = one(steps_errors("- {id: a, type: noop, schedule_to_start: 0s}\n"))
    assert "greater than zero" in zero.message
    typo = one(steps_errors("- {id: a, type: noop, idempotant: false}\n"))
    assert typo.hint == "did you mean 'idempotent'?"


def test_schedule_to_start_and_idempotent_are_refused_on_engine_steps() -> None:
    found = steps_errors(
        """\
        - id: w
          type: wait
          signal: go
          idempotent: false
          schedule_to_start: 1m
        """
    )
    assert sorted((d.line, d.step_id) for d in found) == [(7, "w"), (8, "w")]
    (idempotent,) = [d for d in found if d.line == 7]
    assert "'idempotent' applies to action steps only" in idempotent.message
    assert "a wait step runs in the engine" in idempotent.message
    assert idempotent.hint == "remove 'idempotent' from this step"
