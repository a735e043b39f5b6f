"""Property tests of the definition parsers (Hypothesis): whatever comes in, the compiler
answers with a `Plan` or a `DefinitionError`, and an expression compiles or is an
`ExpressionError` and, compiled, evaluates to a value or an `ExpressionEvaluationError`.
Nothing else: no RecursionError, MemoryError, TypeError or KeyError from inside.

Bounded for CI: each test draws at most ``EXAMPLES`` inputs, no deadline (the machine is
shared). Inputs are drawn both blind (any text, any JSON-ish data) and shaped like the
real thing (definition keys and step types, expression tokens), so they reach past the
first check."""

from __future__ import annotations

import contextlib
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tideflow.dsl import compile_definition
from tideflow.dsl.expr import compile_expression, compile_template
from tideflow.errors import DefinitionError, ExpressionError, ExpressionEvaluationError
from tideflow.model.plan import Plan

EXAMPLES = 100
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)

NUMBERS = st.one_of(
    st.integers(),
    st.sampled_from([2**63, 2**64, -(2**63) - 1, 2**70, -(2**70), 10**400]),
    st.floats(allow_nan=True, allow_infinity=True),
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    NUMBERS,
    st.text(max_size=20),
    st.sampled_from(["{{ inputs.x }}", "{{ steps.a.output }}", "}}", "{{", "${{ 1 }}", "1h"]),
)
JSONISH = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
STEP_KEYS = [
    "id",
    "type",
    "depends_on",
    "when",
    "input",
    "output",
    "retry",
    "timeout",
    "steps",
    "branches",
    "cases",
    "items",
    "signal",
    "match",
    "buffer",
    "until",
    "max_iterations",
    "duration",
    "function",
    "config",
    "compensate",
    "workflow",
]
STEP_TYPES = ["noop", "wait", "loop", "map", "parallel", "switch", "sleep", "python", "http"]


@st.composite
def steps(draw: st.DrawFn, depth: int = 0) -> list[dict[str, Any]]:
    found = []
    for index in range(draw(st.integers(0, 3))):
        step: dict[str, Any] = {
            "id": f"s{depth}_{index}",
            "type": draw(st.sampled_from(STEP_TYPES)),
        }
        for key in draw(st.lists(st.sampled_from(STEP_KEYS), max_size=4, unique=True)):
            if key == "steps" and depth < 2:
                step[key] = draw(steps(depth + 1))
            else:
                step[key] = draw(JSONISH)
        found.append(step)
    return found


@st.composite
def definitions(draw: st.DrawFn) -> dict[str, Any]:
    data: dict[str, Any] = {"name": "fuzz", "version": "1", "steps": draw(steps())}
    for key in draw(st.lists(st.sampled_from(["input", "output", "timeout", "defaults"]))):
        data[key] = draw(JSONISH)
    if draw(st.booleans()):
        data.pop(draw(st.sampled_from(["name", "version", "steps"])))
    return data


def compiles_or_refuses(source: Any, file: str | None = None) -> None:
    outcome: Plan | DefinitionError
    try:
        outcome = compile_definition(source, file=file)
    except DefinitionError as exc:
        outcome = exc
    assert isinstance(outcome, Plan) or outcome.diagnostics  # an error says what is wrong


@FUZZ
@given(definitions())
def test_a_definition_shaped_mapping_compiles_or_is_a_definition_error(data: Any) -> None:
    compiles_or_refuses(data)


@FUZZ
@given(st.dictionaries(st.text(max_size=10), JSONISH, max_size=6))
def test_any_mapping_compiles_or_is_a_definition_error(data: dict[str, Any]) -> None:
    compiles_or_refuses(data)


YAML_TEXT = st.text(
    alphabet=st.sampled_from([*" \n\t-:[]{}'\"&*!|>#%@`,?$.\\0123456789abcnstuvy_", "\x00"]),
    max_size=200,
)


NESTED_TEXT = st.builds(
    lambda opening, closing, times: "name: x\nsteps: " + opening * times + closing * times,
    st.sampled_from(["[", "{a: ", "- "]),
    st.sampled_from(["]", "}", ""]),
    st.one_of(st.integers(0, 100), st.sampled_from([70, 900, 3_000])),
)
"""Text nested deeper than the compiler walks (YAML's own limit is 1,000 levels)."""


@st.composite
def nested_data(draw: st.DrawFn) -> dict[str, Any]:
    value: Any = draw(SCALARS)
    for _ in range(draw(st.one_of(st.integers(0, 100), st.sampled_from([70, 900, 3_000])))):
        value = [value] if draw(st.booleans()) else {"k": value}
    return {"name": "x", "version": "1", "steps": [{"id": "a", "type": "noop", "input": value}]}


@FUZZ
@given(nested_data())
def test_data_nested_at_any_depth_compiles_or_is_a_definition_error(data: Any) -> None:
    compiles_or_refuses(data)


@FUZZ
@given(st.one_of(YAML_TEXT, st.text(max_size=200), NESTED_TEXT))
def test_any_yaml_text_compiles_or_is_a_definition_error(text: str) -> None:
    compiles_or_refuses(text)


@FUZZ
@given(st.one_of(YAML_TEXT, st.text(max_size=200), NESTED_TEXT.map(lambda t: t[15:])))
def test_any_json_text_compiles_or_is_a_definition_error(text: str) -> None:
    compiles_or_refuses(text, file="fuzz.json")


EXPRESSION_TOKENS = st.sampled_from(
    [
        "inputs",
        "steps",
        "run",
        "secrets",
        ".x",
        ".a",
        "['k']",
        "[0]",
        "[",
        "]",
        "(",
        ")",
        "{",
        "}",
        "{{",
        "}}",
        " + ",
        " - ",
        "-",
        " * ",
        " / ",
        " % ",
        " ** ",
        " == ",
        " < ",
        " and ",
        " or ",
        "not ",
        " if ",
        " else ",
        " in ",
        ",",
        ":",
        "1",
        "0",
        "1.5",
        "1e999",
        "18446744073709551616",
        "'s'",
        '"t"',
        "true",
        "null",
        "len(",
        "default(",
        "upper(",
        "join(",
        "random_int(",
        "now()",
        "__class__",
        "lambda x: x",
        "\n",
    ]
)
REPEATED = st.builds(
    lambda token, times, tail: token * times + tail + "1",
    st.one_of(st.sampled_from(["-", "not ", "(", "[", "1 + ", "inputs.x["]), EXPRESSION_TOKENS),
    st.one_of(st.integers(0, 200), st.sampled_from([150, 1_000, 5_000, 20_000])),
    st.lists(EXPRESSION_TOKENS, max_size=3).map("".join),
)
"""One token many times (``-`` 20,000 times, ``not `` or ``[`` 5,000 times): the nesting
that Python's parser answers with a MemoryError or RecursionError."""
EXPRESSIONS = st.one_of(
    st.text(max_size=60), st.lists(EXPRESSION_TOKENS, max_size=25).map("".join), REPEATED
)
SCOPE = {
    "inputs": {"x": [1, 2, 3], "a": {"x": "text"}},
    "steps": {"a": {"output": {"x": 1}, "status": "succeeded"}},
    "run": {"id": "r1"},
    "secrets": {},
}


@FUZZ
@given(EXPRESSIONS)
def test_any_expression_compiles_or_is_an_expression_error_and_evaluates_or_fails_cleanly(
    source: str,
) -> None:
    try:
        compiled = compile_expression(source)
    except ExpressionError as exc:
        refused = exc
    else:
        with contextlib.suppress(ExpressionEvaluationError):
            compiled.evaluate(SCOPE)
        return
    assert refused.diagnostics and isinstance(getattr(refused, "column_offset", None), int)


@FUZZ
@given(st.lists(EXPRESSION_TOKENS, max_size=12).map(lambda t: "x {{ " + "".join(t) + " }} y"))
def test_any_template_compiles_or_is_an_expression_error(source: str) -> None:
    try:
        compiled = compile_template({"k": [source]})
    except ExpressionError:
        return
    with contextlib.suppress(ExpressionEvaluationError):
        compiled.render(SCOPE)
