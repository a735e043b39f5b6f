"""Definition files: JSON is parsed as JSON, and what is not a text definition is refused
with one line saying why (never a UnicodeDecodeError or a YAML reader error)."""

import json
from pathlib import Path

import pytest

from tideflow.dsl import compile_definition, validate
from tideflow.dsl.loader import MAX_BYTES_VARIABLE, load
from tideflow.errors import DefinitionError, DefinitionUnreadable

TRAILING_COMMA = '{"name": "flow",\n "version": "1",\n "steps": [{"id": "a", "type": "noop"},]}\n'


def only(exc: pytest.ExceptionInfo[DefinitionError]) -> str:
    (diagnostic,) = exc.value.diagnostics
    return diagnostic.message


def test_a_json_file_is_parsed_as_json(tmp_path: Path) -> None:
    path = tmp_path / "flow.json"
    path.write_text(TRAILING_COMMA, encoding="utf-8")
    with pytest.raises(DefinitionError) as info:
        load(path)
    (diagnostic,) = info.value.diagnostics
    assert diagnostic.message == "JSON syntax error: trailing comma is not allowed"
    assert (diagnostic.file, diagnostic.line, diagnostic.column) == (str(path), 3, 39)
    assert "YAML" not in (diagnostic.hint or "")
    # The same text as YAML is a flow mapping YAML accepts.
    yaml_path = tmp_path / "flow.yaml"
    yaml_path.write_text(TRAILING_COMMA, encoding="utf-8")
    assert load(yaml_path).data["steps"] == [{"id": "a", "type": "noop"}]


def test_a_json_syntax_error_counts_columns_in_characters(tmp_path: Path) -> None:
    path = tmp_path / "flow.json"
    path.write_text('{"description": "café ☕", x}', encoding="utf-8")
    with pytest.raises(DefinitionError) as info:
        load(path)
    assert (info.value.diagnostics[0].line, info.value.diagnostics[0].column) == (1, 27)


def test_diagnostics_of_a_json_definition_carry_positions(tmp_path: Path) -> None:
    path = tmp_path / "flow.json"
    steps = [{"id": "a", "type": "noop"}, {"id": "b", "type": "wait", "signal": "x", "timeuot": 1}]
    path.write_text(json.dumps({"name": "flow", "version": "1", "steps": steps}, indent=2))
    (error,) = validate(path)
    assert error.message == "unknown key 'timeuot' in a wait step"
    assert (error.line, error.column, error.step_id) == (13, 7, "b")


def test_a_duplicate_key_in_json_is_an_error_at_its_position(tmp_path: Path) -> None:
    path = tmp_path / "flow.json"
    path.write_text('{"name": "a",\n "version": "1",\n "steps": [{"id": "a", "id": "b"}]}')
    with pytest.raises(DefinitionError) as info:
        load(path)
    (diagnostic,) = info.value.diagnostics
    assert diagnostic.message == "duplicate key 'id' (first defined on line 3)"
    assert (diagnostic.line, diagnostic.column, diagnostic.path) == (3, 24, "steps[0].id")


def test_json_positions_are_computed_only_when_asked(tmp_path: Path) -> None:
    path = tmp_path / "wide.json"
    steps = [{"id": f"s{i}", "type": "noop", "input": {"i": i}} for i in range(20_000)]
    text = json.dumps({"name": "wide", "version": "1", "steps": steps}, indent=1)
    path.write_text(text)
    loaded = load(path)
    assert len(loaded.data["steps"]) == 20_000
    assert loaded.positions.peek(("steps", 19_999)) is None  # nothing scanned yet
    lines = text.splitlines()
    line = lines.index('    "i": 19999') + 1
    assert loaded.positions[("steps", 19_999, "input", "i")] == (line, 10)
    assert loaded.positions.key(("steps", 19_999, "input", "i")) == (line, 5)
    assert loaded.positions.peek(("steps", 19_999)) is not None


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR",
            "is not a text file: a NUL byte at line 3, column 1",
        ),
        (b'name: x\nversion: "1"\x00\n', "is not a text file: a NUL byte at line 2, column 13"),
        (b"name: caf\xe9\n", "is not UTF-8 text: byte 0xe9 at line 1, column 10"),
    ],
)
@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_a_file_that_is_not_utf8_text_is_refused_in_one_line(
    tmp_path: Path, content: bytes, message: str, suffix: str
) -> None:
    path = tmp_path / f"flow{suffix}"
    path.write_bytes(content)
    with pytest.raises(DefinitionUnreadable) as info:
        compile_definition(path)
    assert only(info) == f"{path} {message}"
    assert "\n" not in only(info)


def test_a_control_character_in_yaml_text_is_a_clear_error() -> None:
    with pytest.raises(DefinitionError) as info:
        load('name: x\nversion: "\x07"\n')
    (diagnostic,) = info.value.diagnostics
    assert diagnostic.message == "character U+0007 is not allowed in a YAML definition"
    assert (diagnostic.line, diagnostic.column) == (2, 11)


def test_a_definition_larger_than_the_limit_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(MAX_BYTES_VARIABLE, "64")
    path = tmp_path / "flow.yaml"
    path.write_text('name: flow\nversion: "1"\nsteps: [{id: a, type: noop}]\n' + "#" * 64)
    with pytest.raises(DefinitionUnreadable) as info:
        load(path)
    assert only(info).startswith("definition too large: more than 64 bytes")
    with pytest.raises(DefinitionUnreadable):
        load("x" * 65)


def test_a_yaml_alias_bomb_is_refused_as_too_large_not_as_a_syntax_error() -> None:
    rows = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    rows += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 7)]
    with pytest.raises(DefinitionError) as info:
        load("\n".join(rows) + "\n")
    assert only(info).startswith("definition too large: more than 200000 values")
