"""The expression and template language: what it computes, what it refuses, how it fails."""

from __future__ import annotations

import ast
import re
import time
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from tideflow.dsl.expr import (
    CompiledExpression,
    CompiledTemplate,
    compile_expression,
    compile_template,
    is_template_string,
)
from tideflow.errors import DefinitionError, ExpressionError, ExpressionEvaluationError, StepError
from tideflow.model.expressions import Expression, Template
from tideflow.model.secrets import SecretMarkers, secret_marker

NOW = 1_795_926_898.123  # 2026-11-29T04:34:58.123000+00:00


class View(Mapping[str, Any]):
    """A lazy, non-dict Mapping like the engine's scope views."""

    def __init__(self, data: dict[str, Any]) -> None:
        self._data = data

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


class Thing:
    """A non-mapping object with attributes: expressions must never reach them."""

    secret = "attribute"


def scope(**extra: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "inputs": {"order_id": "A-1", "amount": 12.5, "flag": True, "n": 3, "tags": ["x", "y"]},
        "steps": View(
            {
                "fetch": View(
                    {
                        "output": {"count": 5, "items": [1, 2, 3], "none": None},
                        "status": "succeeded",
                        "error": None,
                        "input": {},
                    }
                ),
            }
        ),
        "run": {
            "id": "r1",
            "name": "wf",
            "version": "1",
            "started_at": "2026-01-01T00:00:00+00:00",
        },
        "secrets": SecretMarkers(),
        "__now__": NOW,
    }
    base.update(extra)
    return base


def ev(source: str, **extra: Any) -> Any:
    return compile_expression(source).evaluate(scope(**extra))


def eval_error(source: str, **extra: Any) -> str:
    expr = compile_expression(source)
    with pytest.raises(ExpressionEvaluationError) as info:
        expr.evaluate(scope(**extra))
    return info.value.message


def compile_error(source: str) -> ExpressionError:
    with pytest.raises(ExpressionError) as info:
        compile_expression(source)
    return info.value


# --- literals -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("42", 42),
        ("-7", -7),
        ("2.5", 2.5),
        ("1e3", 1000.0),
        ("'single'", "single"),
        ('"double"', "double"),
        ("'it\\'s'", "it's"),
        ("true", True),
        ("false", False),
        ("null", None),
        ("True", True),
        ("False", False),
        ("None", None),
        ("[1, 'a', null]", [1, "a", None]),
        ("[]", []),
        ("{'k': 1, 'n': [true]}", {"k": 1, "n": [True]}),
        ("{}", {}),
        ("{'a': {'b': 2}}['a']['b']", 2),
    ],
)
def test_literals(source: str, expected: Any) -> None:
    assert ev(source) == expected
    assert type(ev(source)) is type(expected)


def test_mapping_keys_are_expressions() -> None:
    assert ev("{inputs.order_id: 1}") == {"A-1": 1}


def test_true_inside_a_string_is_not_translated() -> None:
    assert ev("'true or null'") == "true or null"


# --- operators ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("1 + 2", 3),
        ("'a' + 'b'", "ab"),
        ("[1] + [2]", [1, 2]),
        ("inputs.tags + ['z']", ["x", "y", "z"]),
        ("5 - 7", -2),
        ("3 * 4", 12),
        ("'ab' * 2", "abab"),
        ("2 * 'ab'", "abab"),
        ("[0] * 3", [0, 0, 0]),
        ("'ab' * -1", ""),
        ("7 / 2", 3.5),
        ("6 / 3", 2.0),
        ("7 % 3", 1),
        ("-7 % 3", 2),
        ("7.5 % 2", 1.5),
        ("-inputs.n", -3),
        ("- -1", 1),
        ("1 + 2 * 3", 7),
        ("(1 + 2) * 3", 9),
        ("inputs.amount * 2", 25.0),
    ],
)
def test_arithmetic(source: str, expected: Any) -> None:
    assert ev(source) == expected


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("1 == 1", True),
        ("1 == 2", False),
        ("'a' != 'b'", True),
        ("1 < 2", True),
        ("2 <= 2", True),
        ("3 > 4", False),
        ("4 >= 5", False),
        ("'a' < 'b'", True),
        ("1 < 2 < 3", True),
        ("1 < 3 < 2", False),
        ("3 > 2 == 2", True),
        ("null == null", True),
        ("[1, 2] == [1, 2]", True),
        ("steps.fetch.output.count > 3", True),
        ("steps.fetch.status == 'succeeded'", True),
    ],
)
def test_comparisons(source: str, expected: bool) -> None:
    assert ev(source) is expected


def test_comparison_chain_short_circuits() -> None:
    # The right-hand side would fail if evaluated.
    assert ev("2 < 1 < 1 / 0") is False


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("true and 1", 1),
        ("0 and 1 / 0", 0),
        ("null or 'x'", "x"),
        ("'first' or 1 / 0", "first"),
        ("false or false", False),
        ("true and true and 'last'", "last"),
        ("not true", False),
        ("not null", True),
        ("not []", True),
        ("not steps.fetch.output.items", False),
    ],
)
def test_boolean_operators_short_circuit_and_return_the_deciding_operand(
    source: str, expected: Any
) -> None:
    assert ev(source) == expected


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("'x' in inputs.tags", True),
        ("'z' in inputs.tags", False),
        ("'z' not in inputs.tags", True),
        ("'ell' in 'hello'", True),
        ("'order_id' in inputs", True),
        ("'fetch' in steps", True),
        ("'nope' not in steps", True),
        ("'count' in steps.fetch.output", True),
    ],
)
def test_membership(source: str, expected: bool) -> None:
    assert ev(source) is expected


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("inputs.tags[0]", "x"),
        ("inputs.tags[-1]", "y"),
        ("inputs['order_id']", "A-1"),
        ("steps['fetch']['output']['count']", 5),
        ("steps.fetch.output.items[1]", 2),
        ("'abc'[1]", "b"),
        ("inputs.tags[inputs.n - 2]", "y"),
        ("run.id", "r1"),
        ("item.name", "w"),
        ("{'a': 1}.a", 1),
    ],
)
def test_indexing_and_key_access(source: str, expected: Any) -> None:
    assert ev(source, item={"name": "w"}) == expected


def test_conditional() -> None:
    assert ev("'big' if inputs.amount > 10 else 'small'") == "big"
    assert ev("'big' if inputs.amount > 100 else 'small'") == "small"
    assert ev("1 if true else 1 / 0") == 1


def test_multiline_expression() -> None:
    assert ev("steps.fetch.output.count\n  if inputs.flag\n  else 0") == 5


def test_dot_access_works_on_any_mapping_not_only_dicts() -> None:
    assert ev("v.a.b", v=View({"a": View({"b": 1})})) == 1


# --- functions ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("len(inputs.tags)", 2),
        ("len('abc')", 3),
        ("len(inputs)", 5),
        ("len(steps.fetch)", 4),
        ("lower('AbC')", "abc"),
        ("upper('AbC')", "ABC"),
        ("int('42')", 42),
        ("int(3.9)", 3),
        ("int(true)", 1),
        ("float('2.5')", 2.5),
        ("float(2)", 2.0),
        ("str(5)", "5"),
        ("str(2.5)", "2.5"),
        ("str(true)", "true"),
        ("str(null)", ""),
        ("str([1, {'a': null}])", '[1,{"a":null}]'),
        ("str(steps.fetch.output)", '{"count":5,"items":[1,2,3],"none":null}'),
        ("round(2.567)", 3),
        ("round(2.567, 2)", 2.57),
        ("round(1234, -2)", 1200),
        ("min([3, 1, 2])", 1),
        ("min(3, 1, 2)", 1),
        ("max([3, 1, 2])", 3),
        ("max('a', 'b')", "b"),
        ("sum([1, 2, 3.5])", 6.5),
        ("sum([])", 0),
        ("any([0, null, 1])", True),
        ("any([])", False),
        ("all([1, 'x'])", True),
        ("all([1, 0])", False),
        ("keys({'a': 1, 'b': 2})", ["a", "b"]),
        ("values({'a': 1, 'b': 2})", [1, 2]),
        ("keys(steps.fetch)", ["output", "status", "error", "input"]),
        ("default(inputs.order_id, 'x')", "A-1"),
    ],
)
def test_functions(source: str, expected: Any) -> None:
    result = ev(source)
    assert result == expected
    assert type(result) is type(expected)


@pytest.mark.parametrize(
    ("source", "fragment"),
    [
        ("len(5)", "len(): expects a string, list or mapping, got an integer"),
        ("lower(5)", "lower(): expects a string, got an integer"),
        ("upper(null)", "upper(): expects a string, got null"),
        ("int('x')", "int(): cannot convert 'x' to an integer"),
        ("int([1])", "int(): expects a number or string, got a list"),
        ("float('abc')", "float(): cannot convert 'abc' to a number"),
        ("round('1')", "round(): expects a number, got a string"),
        ("round(1, 1000)", "digits must be an integer between -100 and 100"),
        ("min([])", "min(): needs at least one value, got an empty list"),
        ("max(5)", "max(): expects a list or several values, got an integer"),
        ("min([1, 'a'])", "min():"),
        ("sum(['a'])", "sum(): expects a list of numbers"),
        ("any(5)", "any(): expects a list, got an integer"),
        ("all('ab')", "all(): expects a list, got a string"),
        ("keys([1])", "keys(): expects a mapping, got a list"),
        ("values('x')", "values(): expects a mapping, got a string"),
    ],
)
def test_function_argument_errors(source: str, fragment: str) -> None:
    assert fragment in eval_error(source)


@pytest.mark.parametrize(
    "source",
    ["len()", "len(1, 2)", "now(1)", "default(1)", "round(1, 2, 3)", "min()", "lower(x=1)"],
)
def test_function_arity_is_checked_at_compile_time(source: str) -> None:
    error = compile_error(source)
    assert "argument" in error.diagnostics[0].message


def test_default_replaces_missing_names_keys_indexes_and_null() -> None:
    assert ev("default(nothing, 1)") == 1
    assert ev("default(inputs.missing, 2)") == 2
    assert ev("default(inputs.tags[9], 3)") == 3
    assert ev("default(steps.fetch.output.none, 4)") == 4
    assert ev("default(steps.fetch.output.none.deeper, 5)") == 5
    assert ev("default(steps.nope.output, 6)") == 6
    assert ev("default(.missing.deeper, 7)") == 7
    assert ev("default(default(inputs.a, inputs.b), 8)") == 8


def test_default_evaluates_its_fallback_lazily() -> None:
    assert ev("default(inputs.order_id, 1 / 0)") == "A-1"
    assert ev("default(0, 1 / 0)") == 0
    assert ev("default(false, nope)") is False


def test_default_does_not_hide_real_errors() -> None:
    assert "division by zero" in eval_error("default(1 / 0, 1)")
    assert "cannot combine" in eval_error("default('a' + 1, 1)")
    assert "not a mapping" in eval_error("default(inputs.order_id.x, 1)")
    assert "unknown name 'nope'" in eval_error("default(inputs.missing, nope)")


def test_now_reads_the_clock_from_the_scope() -> None:
    expected = datetime.fromtimestamp(NOW, UTC).isoformat()
    assert ev("now()") == expected == "2026-11-29T04:34:58.123000+00:00"
    assert ev("now()", __now__=0.0) == "1970-01-01T00:00:00+00:00"
    assert ev("now() > run.started_at") is True


def test_now_without_a_clock_is_an_error_default_does_not_hide() -> None:
    expr = compile_expression("default(now(), 'x')")
    with pytest.raises(ExpressionEvaluationError, match="__now__"):
        expr.evaluate({})
    with pytest.raises(ExpressionEvaluationError, match="epoch seconds, got a string"):
        expr.evaluate({"__now__": "yesterday"})


# --- Go-template style ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("{{ .order_id }}", "A-1"),
        (".order_id", "A-1"),
        (".tags[1]", "y"),
        ("{{ .n + .n }}", 6),
        ("[.n, (.amount)]", [3, 12.5]),
        ("len(.tags)", 2),
        ("not .flag", False),
        (".n if .flag else .amount", 3),
        ("'x' in .tags", True),
        ("{'k': .n}", {"k": 3}),
        ("'.n'", ".n"),
        ("'a' + \".n\"", "a.n"),
        (".5 + .n", 3.5),
        ("default(.nope, .n)", 3),
    ],
)
def test_go_style_leading_dot_means_inputs(source: str, expected: Any) -> None:
    assert ev(source) == expected


def test_go_style_nested_path() -> None:
    assert ev("{{ .a.b }}", inputs={"a": {"b": "deep"}}) == "deep"


def test_dot_after_a_name_is_key_access_not_go_style() -> None:
    assert ev("run .id") == "r1"
    assert compile_expression("{{ .a.b }}").input_references() == {"a"}


# --- templates ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("{{ inputs.n }}", 3),
        ("  {{ inputs.amount }} ", 12.5),
        ("{{ inputs.flag }}", True),
        ("{{ inputs.tags }}", ["x", "y"]),
        ("{{ null }}", None),
        ("{{ steps.fetch.output }}", {"count": 5, "items": [1, 2, 3], "none": None}),
    ],
)
def test_a_sole_template_keeps_the_type(value: str, expected: Any) -> None:
    rendered = compile_template(value).render(scope())
    assert rendered == expected
    assert type(rendered) is type(expected)


def test_a_sole_template_turns_lazy_views_into_plain_data() -> None:
    rendered = compile_template("{{ steps.fetch }}").render(scope())
    assert type(rendered) is dict
    assert rendered["status"] == "succeeded"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("id-{{ inputs.order_id }}", "id-A-1"),
        ("n={{ inputs.n }}", "n=3"),
        ("x={{ inputs.amount }}", "x=12.5"),
        ("x={{ 1e20 }}", "x=1e+20"),
        ("f={{ inputs.flag }}/{{ false }}", "f=true/false"),
        ("v=[{{ null }}]", "v=[]"),
        ("t={{ inputs.tags }}", 't=["x","y"]'),
        ("m={{ {'a': 1, 'b': [null]} }}", 'm={"a":1,"b":[null]}'),
        ("{{ inputs.n }}{{ inputs.n }}", "33"),
        ("{{ inputs.n }} {{ inputs.n }}", "3 3"),
        ("s={{ steps.fetch.output.items }}", "s=[1,2,3]"),
    ],
)
def test_interpolation_renders_text(value: str, expected: str) -> None:
    assert compile_template(value).render(scope()) == expected


def test_template_walks_json_like_values_and_keeps_keys_literal() -> None:
    value = {
        "url": "https://x/{{ inputs.order_id }}",
        "{{ key }}": "literal key",
        "body": {"n": "{{ inputs.n }}", "list": ["{{ inputs.flag }}", 1, None, "plain"]},
        "const": {"a": [1, 2]},
    }
    template = compile_template(value)
    assert not template.is_constant
    rendered = template.render(scope())
    assert rendered == {
        "url": "https://x/A-1",
        "{{ key }}": "literal key",
        "body": {"n": 3, "list": [True, 1, None, "plain"]},
        "const": {"a": [1, 2]},
    }
    assert rendered["const"] is value["const"]  # constant parts are shared, not copied
    assert [e.source for e in template.expressions()] == [
        "inputs.order_id",
        "inputs.n",
        "inputs.flag",
    ]


@pytest.mark.parametrize("value", [None, 1, 2.5, True, "plain", "a } b {", [], {}, {"a": [1, "x"]}])
def test_constant_templates_render_to_the_same_object(value: Any) -> None:
    template = compile_template(value)
    assert template.is_constant
    assert template.expressions() == []
    assert template.render({}) is value


def test_is_template_string() -> None:
    assert is_template_string("a {{ b }}")
    assert is_template_string("{{")
    assert not is_template_string("a { b } }}")


def test_braces_inside_an_expression_do_not_close_the_template() -> None:
    assert compile_template("{{ {'a': {'b': 1}} }}").render({}) == {"a": {"b": 1}}
    assert compile_template("{{ {'a': 1}}}").render({}) == {"a": 1}
    assert compile_template("x{{ '}}' }}y").render({}) == "x}}y"
    assert compile_template("{{ '{{' }}").render({}) == "{{"


def test_compiled_objects_satisfy_the_model_protocols() -> None:
    expression: Expression = compile_expression("1")
    template: Template = compile_template("{{ 1 }}")
    assert isinstance(expression, CompiledExpression)
    assert isinstance(template, CompiledTemplate)


def test_compile_expression_accepts_a_sole_template() -> None:
    bare = compile_expression("steps.fetch.output.count > 3")
    wrapped = compile_expression("  {{ steps.fetch.output.count > 3 }} ")
    assert bare == wrapped
    assert hash(bare) == hash(wrapped)
    assert wrapped.source == "steps.fetch.output.count > 3"
    assert wrapped.evaluate(scope()) is True


@pytest.mark.parametrize("source", ["x {{ a }}", "{{ a }} {{ b }}", "{{ a }} x"])
def test_compile_expression_refuses_text_around_the_template(source: str) -> None:
    error = compile_error(source)
    assert "expected a single expression" in error.diagnostics[0].message


def test_template_equality() -> None:
    assert compile_template({"a": "{{ 1 }}"}) == compile_template({"a": "{{ 1 }}"})
    assert compile_template("{{ 1 }}") != compile_template("{{ 2 }}")
    assert hash(compile_template("{{ 1 }}")) == hash(compile_template("{{ 1 }}"))


# --- compile errors -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "source",
    [
        "__import__('os')",
        "().__class__",
        "''.__class__.__mro__",
        "a.__dict__",
        "_private",
        "inputs._hidden",
        "lambda: 1",
        "[x for x in inputs.tags]",
        "{x: 1 for x in inputs.tags}",
        "{x for x in inputs.tags}",
        "any(x for x in inputs.tags)",
        "2 ** 3",
        "7 // 2",
        "1 << 2",
        "1 >> 2",
        "1 & 2",
        "1 | 2",
        "1 ^ 2",
        "~1",
        "+1",
        "f'{inputs}'",
        "[*inputs.tags]",
        "{**inputs}",
        "(x := 1)",
        "open('/etc/passwd')",
        "eval('1')",
        "getattr(inputs, 'x')",
        "inputs.get('x')",
        "'x'.upper",
        "'x'.upper()",
        "[1].count",
        "true.real",
        "len",
        "inputs.tags[0:1]",
        "(1, 2)",
        "{1, 2}",
        "a is None",
        "a is not None",
        "b'bytes'",
        "1j",
        "...",
        "len(*inputs.tags)",
        "inputs.n if",
        "1 +",
        "'unterminated",
    ],
)
def test_rejected_constructs(source: str) -> None:
    error = compile_error(source)
    assert isinstance(error, DefinitionError)
    assert len(error.diagnostics) == 1
    diagnostic = error.diagnostics[0]
    assert diagnostic.hint
    assert source.strip()[:20] in diagnostic.message
    column = getattr(error, "column_offset", None)
    assert isinstance(column, int)
    assert 0 <= column <= len(source)


@pytest.mark.parametrize(
    ("source", "column"),
    [
        ("a + b.__x", 6),
        ("2 ** 3", 2),
        ("1 +* 2", 3),
        ("x +", 3),
        ("é + (", 4),
        ("'é' + lambda: 1", 6),
        ("{{ .a.__d }}", 6),
        ("  {{ a ** 2 }}", 7),
        ("{{ }}", 2),
        (".a + .b + __c", 10),
    ],
)
def test_compile_errors_carry_the_column_in_the_original_string(source: str, column: int) -> None:
    assert getattr(compile_error(source), "column_offset", None) == column


def test_compile_error_names_the_expression_and_explains() -> None:
    error = compile_error("{{ steps.a.output.upper() }}")
    message = error.diagnostics[0].message
    assert "`steps.a.output.upper()`" in message
    assert "cannot be called" in message
    assert "upper(x)" in (error.diagnostics[0].hint or "")


@pytest.mark.parametrize(
    ("value", "column"),
    [
        ("{{ a", 0),
        ("x {{ a }} {{ b", 10),
        ("a }} {{ b }}", 2),
        ("{{ a }} }}", 8),
        ("{{ 'a }}", 0),
        ("{{ [1, 2 }}", 0),
        ("id-{ inputs.x }}", 14),
        ("}}", 0),
    ],
)
def test_unbalanced_braces_are_compile_errors(value: str, column: int) -> None:
    with pytest.raises(ExpressionError) as info:
        compile_template(value)
    assert getattr(info.value, "column_offset", None) == column
    assert info.value.diagnostics[0].hint


def test_template_errors_name_the_path_inside_the_value() -> None:
    with pytest.raises(ExpressionError) as info:
        compile_template({"headers": {"X": ["ok", "{{ 1 ** 2 }}"]}})
    assert info.value.diagnostics[0].path == "headers.X[1]"
    assert getattr(info.value, "column_offset", None) == 5


def test_empty_expression_is_an_error() -> None:
    assert "empty expression" in compile_error("{{   }}").diagnostics[0].message
    assert "empty expression" in compile_error("").diagnostics[0].message


def test_non_string_expression_is_an_error() -> None:
    with pytest.raises(ExpressionError, match="expected an expression string"):
        compile_expression(True)  # type: ignore[arg-type]


def test_absurd_nesting_is_a_compile_error_not_a_crash() -> None:
    for source in ["1" + "+1" * 100_000, "(" * 300 + "1" + ")" * 300, "-" * 5000 + "1"]:
        compile_error(source)


# --- evaluation errors ----------------------------------------------------------------------


def test_evaluation_errors_are_step_errors_that_are_not_retried() -> None:
    expr = compile_expression("1 / 0")
    with pytest.raises(ExpressionEvaluationError) as info:
        expr.evaluate({})
    assert isinstance(info.value, StepError)
    assert info.value.retryable is False
    assert info.value.type_name == "ExpressionError"


def test_unknown_name_lists_the_names_in_scope() -> None:
    message = eval_error("stpes.fetch")
    assert message.startswith("cannot evaluate `stpes.fetch`: unknown name 'stpes'")
    assert "inputs, run, secrets, steps" in message
    assert "__now__" not in message


def test_missing_key_lists_the_available_keys() -> None:
    message = eval_error("steps.fetch.output.cnt > 3")
    assert "`steps.fetch.output` has no key 'cnt'" in message
    assert "count, items, none" in message


def test_missing_key_listing_is_capped() -> None:
    big = {f"k{i:02}": i for i in range(30)}
    message = eval_error("big.nope", big=big)
    assert "k00, k01" in message
    assert "k09 and 20 more" in message
    assert "k29" not in message


@pytest.mark.parametrize(
    ("source", "fragment"),
    [
        ("'a' + 1", "'+' cannot combine a string and an integer"),
        ("[1] + 'a'", "'+' cannot combine a list and a string"),
        ("'a' - 'b'", "'-' cannot combine a string and a string"),
        ("'%s' % 1", "'%' cannot combine a string and an integer"),
        ("'a' * 'b'", "'*' cannot combine"),
        ("{} + {}", "'+' cannot combine a mapping and a mapping"),
        ("1 / 0", "division by zero"),
        ("1 % 0", "division by zero"),
        ("1.5 / 0", "division by zero"),
        ("-'a'", "cannot negate a string"),
        ("1 < 'a'", "cannot compare an integer and a string with '<'"),
        ("null > 1", "cannot compare null and an integer with '>'"),
        ("1 in 5", "cannot compare an integer and an integer with 'in'"),
        ("inputs.tags[5]", "index 5 is out of range: `inputs.tags` has length 2"),
        ("inputs.tags['a']", "a list index must be an integer, got a string"),
        ("inputs.order_id.x", "`inputs.order_id` is a string, not a mapping"),
        ("inputs.tags.count", "`inputs.tags` is a list, not a mapping"),
        ("thing.secret", "is a Thing, not a mapping"),
        ("inputs.n[0]", "`inputs.n` is an integer, not a mapping"),
        ("steps.fetch.output.none.x", "cannot read 'x' of null"),
        ("{[1]: 2}", "a list cannot be a mapping key"),
        ("inputs[[1]]", "a list cannot be a mapping key"),
    ],
)
def test_evaluation_error_messages(source: str, fragment: str) -> None:
    message = eval_error(source, thing=Thing())
    assert message.startswith(f"cannot evaluate `{source}`: ")
    assert fragment in message


def test_sub_expression_is_named_when_it_is_not_the_whole() -> None:
    message = eval_error("inputs.n + (inputs.order_id - 1)")
    assert "in `inputs.order_id - 1`" in message


def test_attributes_of_python_objects_are_never_read() -> None:
    # A str has .upper, a list has .count, Thing has .secret: none is reachable.
    for source in ["inputs.order_id.upper", "inputs.tags.count", "thing.secret"]:
        with pytest.raises(ExpressionEvaluationError):
            compile_expression(source).evaluate(scope(thing=Thing()))


@pytest.mark.parametrize(
    "source",
    [
        "'a' * 1_000_001",
        "[0] * 1_000_001",
        "'ab' * 600_000",
        "big + big",
        "[big] * 2000000",
        "(('a' * 1000000) + 'a')",
        "[[0] * 1_000_000] * 1_000_000",
        "[['a' * 1000]] * 1001",
        "[{'k': 'a' * 1000}] * 1000",
    ],
)
def test_results_over_a_million_items_are_refused(source: str) -> None:
    assert "the limit is 1,000,000" in eval_error(source, big="x" * 600_000)


def test_results_at_the_limit_are_fine() -> None:
    assert len(ev("'a' * 1_000_000")) == 1_000_000
    assert len(ev("[1] * 1_000_000")) == 1_000_000


def test_template_errors_name_the_failing_expression() -> None:
    template = compile_template({"url": "https://x/{{ inputs.nope }}"})
    with pytest.raises(ExpressionEvaluationError, match=re.escape("cannot evaluate `inputs.nope`")):
        template.render(scope())


def test_text_conversion_errors_are_evaluation_errors() -> None:
    template = compile_template("x={{ thing }}")
    with pytest.raises(ExpressionEvaluationError, match="cannot turn a Thing into text"):
        template.render(scope(thing=Thing()))


# --- references -----------------------------------------------------------------------------


def test_reference_analysis() -> None:
    expr = compile_expression(
        "steps.a.output + steps['b'].status + inputs.x + inputs['y'] + .z + secrets.TOKEN"
        " + default(steps.c, inputs.w)"
    )
    assert expr.step_references() == {"a", "b", "c"}
    assert expr.input_references() == {"x", "y", "z", "w"}
    assert expr.secret_references() == {"TOKEN"}


def test_dynamic_and_whole_references_are_not_named() -> None:
    expr = compile_expression("steps[inputs.which].output + len(inputs)")
    assert expr.step_references() == set()
    assert expr.input_references() == {"which"}


def test_template_references_are_the_union() -> None:
    template = compile_template(
        {"a": "{{ steps.one.output }}", "b": ["Bearer {{ secrets.API_KEY }}", "{{ .id }}"]}
    )
    assert template.step_references() == {"one"}
    assert template.input_references() == {"id"}
    assert template.secret_references() == {"API_KEY"}
    assert compile_template("x").step_references() == frozenset()


def test_names_inside_strings_are_not_references() -> None:
    expr = compile_expression("'steps.a' + \"inputs.b\"")
    assert expr.step_references() == expr.input_references() == frozenset()


# --- secrets --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("{{ secrets.TOKEN }}", secret_marker("TOKEN")),
        ("Bearer {{ secrets.TOKEN }}", "Bearer " + secret_marker("TOKEN")),
        ("{{ 'Bearer ' + secrets['TOKEN'] }}", "Bearer " + secret_marker("TOKEN")),
        ("{{ [secrets.A, {'k': secrets.B}] }}", [secret_marker("A"), {"k": secret_marker("B")}]),
        ("{{ secrets.A if inputs.flag else secrets.B }}", secret_marker("A")),
        ("{{ default(secrets.A, 'x') }}", secret_marker("A")),
        ("{{ str(secrets.A) }}", secret_marker("A")),
    ],
)
def test_secrets_pass_through_as_markers(value: str, expected: Any) -> None:
    assert compile_template(value).render(scope()) == expected


@pytest.mark.parametrize(
    ("source", "fragment"),
    [
        ("secrets", "secrets can only be read by a literal name"),
        ("keys(secrets)", "secrets can only be read by a literal name"),
        ("secrets[inputs.name]", "secrets can only be read by a literal name"),
        ("secrets['not-a-name']", "secrets can only be read by a literal name"),
        ("secrets.A == 'x'", "secrets.A can only be passed into a value"),
        ("len(secrets.A)", "secrets.A can only be passed into a value"),
        ("lower(secrets.A)", "secrets.A can only be passed into a value"),
        ("secrets.A[0]", "secrets.A can only be passed into a value"),
        ("1 if secrets.A else 2", "secrets.A can only be passed into a value"),
        ("secrets.A or 'x'", "secrets.A can only be passed into a value"),
        ("{secrets.A: 1}", "secrets.A can only be passed into a value"),
        ("'x' + lower(secrets.A)", "secrets.A can only be passed into a value"),
    ],
)
def test_secrets_cannot_be_inspected(source: str, fragment: str) -> None:
    error = compile_error(source)
    assert fragment in error.diagnostics[0].message
    assert error.diagnostics[0].hint


# --- compiled once --------------------------------------------------------------------------


def test_evaluation_does_not_parse_again(monkeypatch: pytest.MonkeyPatch) -> None:
    expr = compile_expression("steps.fetch.output.count > 3 and inputs.flag")
    template = compile_template({"a": "n={{ inputs.n }}", "b": "{{ .n }}"})

    def no_parse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("parsed at evaluation time")

    monkeypatch.setattr(ast, "parse", no_parse)
    assert expr.evaluate(scope()) is True
    assert template.render(scope()) == {"a": "n=3", "b": 3}


def test_evaluation_is_fast() -> None:
    expr = compile_expression("steps.fetch.output.count > 3 and inputs.flag")
    names = scope()
    runs = 5_000
    started = time.perf_counter()
    for _ in range(runs):
        expr.evaluate(names)
    per_call = (time.perf_counter() - started) / runs
    assert per_call < 50e-6  # a few microseconds in practice; generous for slow CI


# --- properties -----------------------------------------------------------------------------

_OPS = ["+", "-", "*"]


@st.composite
def arithmetic(draw: st.DrawFn, depth: int = 0) -> str:
    if depth >= 3 or draw(st.booleans()):
        return str(draw(st.integers(min_value=-1000, max_value=1000)))
    left = draw(arithmetic(depth + 1))
    right = draw(arithmetic(depth + 1))
    op = draw(st.sampled_from(_OPS))
    return f"({left} {op} {right})"


@given(arithmetic())
def test_integer_arithmetic_agrees_with_python(source: str) -> None:
    assert compile_expression(source).evaluate({}) == _python(source)


@given(
    st.integers(min_value=-(10**6), max_value=10**6),
    st.integers(min_value=-(10**6), max_value=10**6).filter(bool),
    st.sampled_from(["/", "%", "<", "<=", ">", ">=", "==", "!="]),
)
def test_division_and_comparison_agree_with_python(a: int, b: int, op: str) -> None:
    source = f"{a} {op} {b}"
    assert compile_expression(source).evaluate({}) == _python(source)


@given(st.integers(), st.integers())
def test_integers_from_the_scope(a: int, b: int) -> None:
    expr = compile_expression("{{ .a - .b * 2 if .a > .b else .a + .b }}")
    assert expr.evaluate({"inputs": {"a": a, "b": b}}) == (a - b * 2 if a > b else a + b)


_TEXT_WITHOUT_TEMPLATES = st.text().filter(lambda s: "{{" not in s and "}}" not in s)
_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | _TEXT_WITHOUT_TEMPLATES,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4)
    ),
    max_leaves=20,
)


@given(_JSON)
def test_values_without_templates_render_to_themselves(value: Any) -> None:
    template = compile_template(value)
    assert template.is_constant
    assert template.render(scope()) is value


@given(_TEXT_WITHOUT_TEMPLATES, _TEXT_WITHOUT_TEMPLATES)
def test_interpolation_keeps_the_surrounding_text(before: str, after: str) -> None:
    # Braces touching the template would change where it opens or closes.
    assume(not after.startswith("}") and not before.endswith("{"))
    value = f"{before}{{{{ inputs.order_id }}}}{after}"
    rendered = compile_template(value).render(scope())
    if before.strip() or after.strip():
        assert rendered == f"{before}A-1{after}"
    else:
        assert rendered == "A-1"


def _python(source: str) -> Any:
    """The reference result: Python's own evaluation of a pure-literal arithmetic string."""
    return eval(compile(ast.parse(source, mode="eval"), "<test>", "eval"), {"__builtins__": {}})


def test_replay_safe_random_functions_need_the_runs_draws() -> None:
    from tideflow.model.expressions import DRAWS_KEY, Draws

    for source in ("uuid()", "random()", "random_int(1, 2)"):
        with pytest.raises(ExpressionEvaluationError, match="only available while a run"):
            compile_expression(source).evaluate({})
    scope = {DRAWS_KEY: Draws("r", "a")}
    expr = compile_expression("[random_int(0, 1), random_int(7, 7), random_int(-2, -2)]")
    low, seven, minus_two = expr.evaluate(scope)
    assert low in (0, 1) and seven == 7 and minus_two == -2


def test_random_int_bounds_are_checked_when_they_come_from_the_scope() -> None:
    from tideflow.model.expressions import DRAWS_KEY, Draws

    expr = compile_expression("random_int(inputs.a, inputs.b)")
    scope: dict[str, Any] = {DRAWS_KEY: Draws("r", "a"), "inputs": {"a": 3, "b": 1}}
    with pytest.raises(ExpressionEvaluationError, match="the low bound is above the high bound"):
        expr.evaluate(scope)
    scope["inputs"] = {"a": 0, "b": 2**64}
    with pytest.raises(ExpressionEvaluationError, match="between -2\\*\\*63 and 2\\*\\*63 - 1"):
        expr.evaluate(scope)
