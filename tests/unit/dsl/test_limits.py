"""Bad input to the definition compiler is a `DefinitionError` with a position, never a
crash: expressions too long or nested too deeply (Python's parser answers 10,000 '-'
with a MemoryError, deep trees with a RecursionError), definitions nested too deeply in
YAML, JSON or a mapping, and integers out of the range a run may hold."""

from __future__ import annotations

from typing import Any

import pytest

from tideflow.dsl import compile_definition
from tideflow.dsl.expr import MAX_DEPTH, MAX_LENGTH, compile_expression
from tideflow.dsl.loader import MAX_DEPTH as MAX_DEFINITION_DEPTH
from tideflow.errors import DefinitionError, ExpressionError


def yaml_when(expression: str) -> str:
    return f"name: w\nversion: '1'\nsteps:\n  - id: a\n    type: noop\n    when: '{expression}'\n"


def only_error(source: Any, file: str | None = None) -> Any:
    with pytest.raises(DefinitionError) as caught:
        compile_definition(source, file=file)
    errors = [d for d in caught.value.diagnostics if d.severity == "error"]
    assert len(errors) == 1, errors
    return errors[0]


@pytest.mark.parametrize("template", ["{{ %s }}", "${{ %s }}"])
def test_an_expression_of_100000_minus_signs_is_a_definition_error_with_a_position(
    template: str,
) -> None:
    error = only_error(yaml_when(template % ("-" * 100_000 + "1")))
    assert (error.line, error.path) == (6, "steps[0].when")
    assert error.column is not None


@pytest.mark.parametrize(
    ("source", "words"),
    [
        ("-" * 100_000 + "1", "too long: 100001 characters"),
        ("x" * (MAX_LENGTH + 1), f"over the limit of {MAX_LENGTH}"),
        ("-" * 9_000 + "1", "nested too deeply"),  # the parser's MemoryError
        ("not " * 2_000 + "true", "nested too deeply"),
        ("-" * (MAX_DEPTH + 1) + "1", f"more than {MAX_DEPTH} levels"),
        ("[" * 150 + "]" * 150, "nested too deeply"),
    ],
)
def test_an_expression_too_long_or_too_deep_is_a_compile_error(source: str, words: str) -> None:
    with pytest.raises(ExpressionError) as caught:
        compile_expression(source)
    assert words in caught.value.diagnostics[0].message
    assert caught.value.diagnostics[0].hint == "split the expression into steps" or (
        "too long" in words or "limit" in words
    )


def test_an_expression_as_deep_as_allowed_compiles_and_evaluates_deep_in_the_stack() -> None:
    compiled = compile_expression("-" * (MAX_DEPTH - 1) + "1")
    assert compiled.evaluate({}) == (-1) ** (MAX_DEPTH - 1)
    sums = compile_expression(" + ".join(["1"] * MAX_DEPTH))
    assert sums.evaluate({}) == MAX_DEPTH

    def deep(n: int) -> Any:
        return deep(n - 1) if n else sums.evaluate({})

    assert deep(400) == MAX_DEPTH  # an engine's own stack is not shallow


@pytest.mark.parametrize("literal", ["1180591620717411303424", "-1180591620717411303424"])
def test_an_integer_literal_out_of_range_is_a_compile_error(literal: str) -> None:
    with pytest.raises(ExpressionError) as caught:
        compile_expression(literal)
    assert "out of range" in caught.value.diagnostics[0].message
    assert compile_expression("9223372036854775808").evaluate({}) == 2**63


def nested(levels: int, leaf: Any = 1) -> Any:
    value = leaf
    for _ in range(levels):
        value = [value]
    return value


def deep_input(levels: int) -> dict[str, Any]:
    """A definition whose step input is nested ``levels`` below the definition's root."""
    return {
        "name": "deep",
        "version": "1",
        "steps": [{"id": "a", "type": "noop", "input": {"x": nested(levels - 4)}}],
    }


def test_a_definition_as_deep_as_allowed_compiles() -> None:
    compile_definition(deep_input(MAX_DEFINITION_DEPTH))


@pytest.mark.parametrize("levels", [MAX_DEFINITION_DEPTH + 1, 900, 5_000])
def test_a_mapping_nested_too_deeply_is_a_definition_error(levels: int) -> None:
    error = only_error(deep_input(levels))
    assert "nested too deeply" in error.message
    assert error.path is not None and error.path.startswith("steps[0].input.x[0]")


@pytest.mark.parametrize("levels", [MAX_DEFINITION_DEPTH + 1, 900, 100_000])
@pytest.mark.parametrize("file", [None, "flow.json"], ids=["yaml", "json"])
def test_text_nested_too_deeply_is_a_definition_error_with_a_position(
    levels: int, file: str | None
) -> None:
    text = '{"name": "deep", "version": "1", "steps": ' + "[" * levels + "]" * levels + "}"
    error = only_error(text, file)
    assert error.line == 1 and error.column is not None
    assert "nested too deeply" in error.message or "depth" in error.message


@pytest.mark.parametrize("n", [2**64, -(2**63) - 1, 2**70, -(2**70)])
@pytest.mark.parametrize("file", [None, "flow.json"], ids=["yaml", "json"])
def test_an_integer_out_of_range_in_a_definition_is_refused_at_its_position(
    n: int, file: str | None
) -> None:
    text = '{"name": "big",\n "version": "1",\n "steps": [{"id": "a", "type": "noop",\n'
    text += ' "input": {"n": [0, ' + str(n) + "]}}]}"
    error = only_error(text, file)
    assert (error.path, error.line) == ("steps[0].input.n[1]", 4)
    assert f"the integer {n} is out of range" in error.message
    assert error.hint is not None and "string" in error.hint


def test_an_integer_out_of_range_in_a_mapping_is_refused_by_path() -> None:
    error = only_error({**deep_input(5), "output": {"total": 2**70}})
    assert error.path == "output.total" and "out of range" in error.message


@pytest.mark.parametrize("n", [2**63, 2**64 - 1, -(2**63)])
def test_integers_in_range_are_kept_exact(n: int) -> None:
    text = '{"name": "ok", "version": "1", "steps": [{"id": "a", "type": "noop", '
    text += '"input": {"n": ' + str(n) + "}}]}"
    for file in (None, "flow.json"):
        plan = compile_definition(text, file=file)
        assert plan.source["steps"][0]["input"] == {"n": n}
