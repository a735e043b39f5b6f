"""A definition's input patterns run on RE2 (dsl/regexes.py): linear time whatever the
pattern and the text, patterns RE2 cannot take refused when the definition compiles, and
otherwise the same answers as jsonschema's own validator."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from tideflow.dsl.compiler import compile_definition
from tideflow.dsl.inputs import MAX_INPUT_ERRORS, validate_input
from tideflow.dsl.regexes import INPUT_FORMATS, InputValidator
from tideflow.errors import DefinitionError, InputValidationError
from tideflow.model.plan import Plan

EVIL = "^(a+)+$"
"""Python's ``re`` backtracks for minutes on 40 ``a`` and a ``!``."""
SLOW_TEXT = "a" * 40 + "!"


def flow(schema: dict[str, Any]) -> Plan:
    return compile_definition(
        {"name": "f", "version": "1", "input": schema, "steps": [{"id": "a", "type": "noop"}]}
    )


CATASTROPHIC = [
    {"type": "string", "pattern": EVIL},
    {"type": "object", "patternProperties": {EVIL: {"type": "integer"}}},
    {"type": "object", "patternProperties": {EVIL: True}, "additionalProperties": False},
    {"type": "object", "patternProperties": {EVIL: True}, "unevaluatedProperties": False},
    {"type": "object", "propertyNames": {"pattern": EVIL}},
]
CHILD = """
import json, sys
from tideflow.dsl.compiler import compile_definition
from tideflow.dsl.inputs import validate_input
from tideflow.errors import InputValidationError
out = []
for schema, value in json.loads(sys.argv[1]):
    plan = compile_definition(
        {"name": "f", "version": "1", "input": schema, "steps": [{"id": "a", "type": "noop"}]}
    )
    try:
        validate_input(plan, value)
        out.append("accepted")
    except InputValidationError:
        out.append("refused")
print(json.dumps(out))
"""


def test_backtracking_patterns_are_answered_at_once() -> None:
    """Each catastrophic case is checked in a child process with a deadline: on Python's
    ``re`` the child would still be backtracking when it is killed (and the test would
    fail rather than hang)."""
    cases = [
        (CATASTROPHIC[0], SLOW_TEXT),
        (CATASTROPHIC[1], {SLOW_TEXT: "x"}),
        (CATASTROPHIC[2], {SLOW_TEXT: 1}),
        (CATASTROPHIC[3], {SLOW_TEXT: 1}),
        (CATASTROPHIC[4], {SLOW_TEXT: 1}),
        (CATASTROPHIC[0], "a" * 100_000),
    ]
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CHILD), json.dumps(cases)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert json.loads(done.stdout) == [
        "refused",  # no match: the text ends with "!"
        "accepted",  # a key that does not match applies nothing
        "refused",
        "refused",
        "refused",
        "accepted",
    ]


@pytest.mark.parametrize(
    ("schema", "where", "pattern"),
    [
        ({"type": "string", "pattern": r"^(a)\1$"}, "input.pattern", r"^(a)\1$"),
        (
            {"properties": {"code": {"pattern": "^(?=x)"}}},
            "input.properties.code.pattern",
            "^(?=x)",
        ),
        ({"patternProperties": {"(?<!a)b": {}}}, "input.patternProperties.(?<!a)b", "(?<!a)b"),
        ({"$defs": {"id": {"pattern": "(unclosed"}}}, "input.$defs.id.pattern", "(unclosed"),
    ],
)
def test_a_pattern_re2_cannot_take_is_a_definition_error(
    schema: dict[str, Any], where: str, pattern: str
) -> None:
    with pytest.raises(DefinitionError) as caught:
        flow(schema)
    (diagnostic,) = caught.value.diagnostics
    assert diagnostic.path == where
    assert diagnostic.message.startswith(f"invalid input schema: pattern {pattern!r} is refused")
    assert diagnostic.hint is not None
    assert "RE2" in diagnostic.hint and "backreferences" in diagnostic.hint


def test_the_refusal_points_at_the_line_of_the_pattern() -> None:
    text = textwrap.dedent(
        """\
        name: f
        version: "1"
        input:
          type: object
          properties:
            twice: {type: string, pattern: '^(ab)\\1$'}
        steps: [{id: a, type: noop}]
        """
    )
    with pytest.raises(DefinitionError) as caught:
        compile_definition(text)
    (diagnostic,) = caught.value.diagnostics
    assert diagnostic.line == 6
    assert "invalid escape sequence" in diagnostic.message


def test_format_regex_checks_the_input_with_re2() -> None:
    plan = flow({"type": "object", "properties": {"rule": {"type": "string", "format": "regex"}}})
    validate_input(plan, {"rule": "^[a-z]+$"})
    with pytest.raises(InputValidationError, match="is not a 'regex'"):
        validate_input(plan, {"rule": r"(a)\1"})


def test_a_large_bad_input_lists_the_first_errors_only() -> None:
    plan = flow({"type": "array", "items": {"type": "integer"}})
    with pytest.raises(InputValidationError) as caught:
        validate_input(plan, ["x"] * 10_000)
    assert len(caught.value.fields) == MAX_INPUT_ERRORS
    assert caught.value.message.endswith(f"(and more: the first {MAX_INPUT_ERRORS} are listed)")


# The keywords dsl/regexes.py re-implements give what jsonschema gives for every pattern
# both engines take: same errors, same paths, same messages.
SCHEMAS: list[tuple[dict[str, Any], list[Any]]] = [
    (
        {"type": "string", "pattern": "^[a-z]+[0-9]*$"},
        ["abc12", "Abc", "", "abc-1", 3],
    ),
    (
        {
            "type": "object",
            "properties": {"id": {"type": "string"}},
            "patternProperties": {"^x-": {"type": "integer"}, "_n$": {"type": "number"}},
            "additionalProperties": False,
        },
        [{"id": "a", "x-a": 1}, {"x-a": "no"}, {"other": 1, "more": 2}, {"a_n": "s"}, []],
    ),
    (
        {"type": "object", "patternProperties": {"^x-": True}, "additionalProperties": False},
        [{"x-1": 1}, {"y": 1}, {"y": 1, "z": 2}],
    ),
    (
        {"type": "object", "properties": {"a": True}, "additionalProperties": {"type": "string"}},
        [{"a": 1, "b": "s"}, {"b": 2}],
    ),
    (
        {"properties": {"a": True}, "additionalProperties": False},
        [{"a": 1}, {"b": 1}, {"b": 1, "c": 2}],
    ),
    (
        {
            "$defs": {"base": {"properties": {"kind": {"type": "string"}}}},
            "$ref": "#/$defs/base",
            "patternProperties": {"^meta_": {"type": "string"}},
            "allOf": [{"properties": {"n": {"type": "integer"}}}],
            "anyOf": [{"properties": {"m": True}}, {"required": ["z"]}],
            "if": {"required": ["kind"]},
            "then": {"properties": {"extra": True}},
            "else": {"properties": {"fallback": True}},
            "dependentSchemas": {"n": {"properties": {"n_unit": True}}},
            "unevaluatedProperties": False,
        },
        [
            {"kind": "k", "n": 1, "meta_a": "s", "extra": 1, "n_unit": "m"},
            {"kind": "k", "stray": 1},
            {"fallback": 1, "meta_b": 2},
            {"fallback": 1, "extra": 1, "other": 2},
        ],
    ),
    (
        {
            "properties": {"a": True},
            "additionalProperties": {"type": "integer"},
            "unevaluatedProperties": {"type": "string"},
        },
        [{"a": 1, "b": 2}, {"b": "s"}],
    ),
    (
        {"patternProperties": {"^k": True}, "unevaluatedProperties": {"type": "integer"}},
        [{"k1": "s", "z": 1}, {"z": "s", "y": "t"}],
    ),
    (
        {"type": "object", "propertyNames": {"pattern": "^[a-z]+$"}},
        [{"ok": 1}, {"Not": 1}],
    ),
]


def _errors(validator: Any, instance: Any) -> list[tuple[str, str, str]]:
    return sorted(
        (str(list(e.absolute_path)), str(list(e.absolute_schema_path)), e.message)
        for e in validator.iter_errors(instance)
    )


@pytest.mark.parametrize(("schema", "instances"), SCHEMAS)
def test_the_re2_validator_answers_as_jsonschema_does(
    schema: dict[str, Any], instances: list[Any]
) -> None:
    ours = InputValidator(schema, format_checker=INPUT_FORMATS)
    theirs = Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)
    for instance in instances:
        assert _errors(ours, instance) == _errors(theirs, instance), instance
