"""Each step kind's keys are declared once (`schema.ENGINE_KINDS`), checked, and documented;
so are the keys of the top level, triggers, retry, defaults and schedules, and the error
types the engine names (docs/dsl.md, docs/schedules.md)."""

import re
from pathlib import Path

import pytest

from tideflow.dsl import validate
from tideflow.dsl.schedules import SCHEDULE_KEYS
from tideflow.dsl.schema import (
    ACTION_STEP_KEYS,
    COMMON_STEP_KEYS,
    DEFAULTS_KEYS,
    ENGINE_KINDS,
    RETRY_KEYS,
    TOP_KEYS,
    TRIGGER_KEYS,
)
from tideflow.model.plan import ENGINE_TYPES

ROOT = Path(__file__).resolve().parents[3]
DOCS = ROOT / "docs" / "dsl.md"

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


def _first_table(section: str, doc: Path = DOCS) -> list[list[str]]:
    """The cells of the rows of the first table under the ``section`` heading."""
    text = doc.read_text(encoding="utf-8")
    body = text[text.index(f"\n{section}\n") + len(section) + 2 :]
    body = body[: body.index("\n#")] if "\n#" in body else body
    lines = body.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("|"))
    table = []
    for line in lines[first + 2 :]:  # after the header and its rule
        if not line.startswith("|"):
            break
        table.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return table


def _table_keys(section: str, doc: Path = DOCS) -> set[str]:
    """Every name in backticks in the first column of the first table under ``section``."""
    return {key for row in _first_table(section, doc) for key in re.findall(r"`([a-z_]+)", row[0])}


@pytest.mark.parametrize(
    ("section", "keys"),
    [("## Top level", TOP_KEYS), ("### Triggers", TRIGGER_KEYS)],
    ids=["top level", "triggers"],
)
def test_each_key_has_its_row(section: str, keys: frozenset[str]) -> None:
    assert _table_keys(section) == keys


def test_each_retry_key_has_its_row() -> None:
    assert _table_keys("## Retries, timeouts, deadlines and `on_error`") == RETRY_KEYS


def test_each_defaults_key_is_named_in_the_defaults_row() -> None:
    (row,) = [row for row in _first_table("## Top level") if row[0] == "`defaults`"]
    assert set(re.findall(r"`([a-z_]+)`", row[3])) >= DEFAULTS_KEYS


def test_each_schedule_key_has_its_row() -> None:
    assert _table_keys("## Syntax", ROOT / "docs" / "schedules.md") == SCHEDULE_KEYS


def test_the_error_types_are_one_table_naming_each_error_the_engine_names() -> None:
    text = DOCS.read_text(encoding="utf-8")
    section = text[text.index("\n## Error types\n") :]
    section = section[: section.index("\n## ", 1)]
    tables = re.findall(r"(?:^\|.*\n)+", section, flags=re.MULTILINE)
    assert len(tables) == 1, "one table of error types, no blank line inside it"
    documented = set(re.findall(r"^\| `([A-Za-z]+)`", tables[0], flags=re.MULTILINE))
    named: set[str] = set()
    for source in (ROOT / "src" / "tideflow" / "core").glob("*.py"):
        found = re.findall(r'engine_error\(\s*"([A-Za-z]+)"', source.read_text(encoding="utf-8"))
        named.update(found)
    assert "MaxIterationsExceeded" in named  # the scan reads the core
    assert named - documented == set()
