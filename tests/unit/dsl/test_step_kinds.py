"""Each step kind's keys are declared once (`schema.ENGINE_KINDS`), checked, and documented."""

import re
from pathlib import Path

import pytest

from tideflow.dsl import validate
from tideflow.dsl.schema import ACTION_STEP_KEYS, COMMON_STEP_KEYS, ENGINE_KINDS
from tideflow.model.plan import ENGINE_TYPES

DOCS = Path(__file__).resolve().parents[3] / "docs" / "dsl.md"

ENGINE_STEPS = {
    "set": "{id: s, type: set, values: {a: 1}}",
    "switch": "{id: s, type: switch, cases: [{when: 'true', next: [t]}], default: fail}",
    "wait": "{id: s, type: wait, signal: x}",
    "sleep": "{id: s, type: sleep, duration: 1s}",
    "map": "{id: s, type: map, items: [1], step: {type: noop}}",
    "loop": "{id: s, type: loop, max_iterations: 2, until: 'true', steps: [{id: b, type: noop}]}",
    "subflow": "{id: s, type: subflow, workflow: child}",
    "emit": "{id: s, type: emit, event: {type: x.y}}",
}


def _definition(step: str) -> str:
    return f'name: flow\nversion: "1"\nsteps:\n  - {step}\n  - {{id: t, type: noop}}\n'


def test_every_engine_kind_is_declared_once() -> None:
    assert set(ENGINE_KINDS) == ENGINE_TYPES == set(ENGINE_STEPS)


@pytest.mark.parametrize("kind", sorted(ENGINE_STEPS))
def test_an_engine_step_is_valid_as_declared(kind: str) -> None:
    assert [d.format() for d in validate(_definition(ENGINE_STEPS[kind]))] == []


@pytest.mark.parametrize("kind", sorted(ENGINE_STEPS))
def test_an_unknown_key_on_an_engine_step_is_an_error_with_did_you_mean(kind: str) -> None:
    step = ENGINE_STEPS[kind][:-1] + ", timeuot: 1s}"
    (error,) = [d for d in validate(_definition(step), file="f.yaml") if d.severity == "error"]
    article = "an" if kind[0] in "aeiou" else "a"
    assert error.message == f"unknown key 'timeuot' in {article} {kind} step"
    assert error.hint == "did you mean 'timeout'?"
    assert (error.file, error.line, error.step_id, error.path) == (
        "f.yaml",
        4,
        "s",
        "steps[0].timeuot",
    )


def test_the_wait_that_waited_forever_is_refused() -> None:
    text = _definition("{id: s, type: wait, signal: x, timeuot: 1s}")
    assert [d.message for d in validate(text)] == ["unknown key 'timeuot' in a wait step"]


def _documented_keys(section: str) -> set[str]:
    """The first column of the first key table under the ``section`` heading of docs/dsl.md."""
    text = DOCS.read_text(encoding="utf-8")
    start = text.index(f"\n{section}\n")
    body = text[start + len(section) + 2 :]
    body = body[: body.index("\n#")] if "\n#" in body else body
    rows = re.findall(r"^\| `([a-z_.]+)`", body, flags=re.MULTILINE)
    assert rows, f"no key table under {section}"
    return {row.split(".")[0] for row in rows}


def test_the_common_keys_are_the_documented_ones() -> None:
    assert _documented_keys("## Steps: common keys") == COMMON_STEP_KEYS


def test_the_action_step_keys_are_the_documented_ones() -> None:
    assert _documented_keys("## Action steps") == ACTION_STEP_KEYS - COMMON_STEP_KEYS


@pytest.mark.parametrize("kind", sorted(ENGINE_TYPES))
def test_each_engine_kind_takes_the_documented_keys(kind: str) -> None:
    documented = _documented_keys(f"### `{kind}`")
    # A kind's table may repeat a common key it gives its own meaning (`timeout`, `input`).
    assert documented - COMMON_STEP_KEYS == ENGINE_KINDS[kind].keys
    assert set(ENGINE_KINDS[kind].required) <= documented
