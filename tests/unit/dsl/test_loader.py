import textwrap
from pathlib import Path

import pytest

from tideflow.dsl.loader import Positions, Reporter, format_path, load
from tideflow.errors import DefinitionError

YAML = textwrap.dedent(
    """\
    name: flow
    version: "1"
    steps:
      - id: a
        type: http
        retry:
          backoff: 5s
        url: 'https://x'
    """
)


def test_yaml_keeps_line_and_column_of_every_key_and_value() -> None:
    loaded = load(YAML)
    assert loaded.data["steps"][0]["retry"] == {"backoff": "5s"}
    positions = loaded.positions
    assert positions[("name",)] == (1, 7)
    assert positions.key(("name",)) == (1, 1)
    assert positions[("steps", 0)] == (4, 5)
    assert positions.key(("steps", 0, "retry", "backoff")) == (7, 7)
    assert positions[("steps", 0, "retry", "backoff")] == (7, 16)
    assert ("steps", 0, "url") in positions


def test_lookups_fall_back_to_the_nearest_ancestor() -> None:
    positions = load(YAML).positions
    assert positions.get(("steps", 0, "retry", "max_attempts")) is None
    assert positions.find(("steps", 0, "retry", "max_attempts")) == (7, 7)
    assert positions.find(("nothing", "here")) == (1, 1)


def test_json_is_loaded_with_positions() -> None:
    text = '{\n  "name": "flow",\n  "version": "1",\n  "steps": [{"id": "a", "type": "noop"}]\n}'
    loaded = load(text)
    assert loaded.data == {
        "name": "flow",
        "version": "1",
        "steps": [{"id": "a", "type": "noop"}],
    }
    assert loaded.positions[("steps", 0, "type")] == (4, 33)


def test_yaml_syntax_error_is_one_diagnostic_on_one_line() -> None:
    text = "name: flow\nsteps:\n  - id: a\n   type: noop: x\n"
    with pytest.raises(DefinitionError) as info:
        load(text, file="flow.yaml")
    [diagnostic] = info.value.diagnostics
    assert diagnostic.file == "flow.yaml"
    assert (diagnostic.line, diagnostic.column) == (4, 4)
    assert diagnostic.message.startswith("YAML syntax error: ")
    assert "\n" not in diagnostic.message
    assert "Traceback" not in str(info.value)
    assert diagnostic.hint


def test_unclosed_quote_is_a_syntax_error() -> None:
    with pytest.raises(DefinitionError) as info:
        load('name: "flow\nversion: 1\n')
    [diagnostic] = info.value.diagnostics
    assert diagnostic.line is not None
    assert "YAML syntax error" in diagnostic.message


def test_duplicate_keys_are_errors() -> None:
    with pytest.raises(DefinitionError) as info:
        load("name: a\nversion: '1'\nname: b\n", file="f.yaml")
    [diagnostic] = info.value.diagnostics
    assert "duplicate key 'name'" in diagnostic.message
    assert "line 1" in diagnostic.message
    assert (diagnostic.line, diagnostic.column) == (3, 1)


def test_merge_keys_and_aliases_are_expanded() -> None:
    text = textwrap.dedent(
        """\
        base: &base {type: noop, queue: fast}
        step:
          <<: *base
          queue: slow
        """
    )
    assert load(text).data["step"] == {"type": "noop", "queue": "slow"}


def test_recursive_alias_is_refused() -> None:
    with pytest.raises(DefinitionError, match="recursive YAML alias"):
        load("a: &x [1, *x]\n")


def test_timestamps_stay_strings_and_unknown_tags_are_errors() -> None:
    assert load("at: 2024-01-02\n").data == {"at": "2024-01-02"}
    with pytest.raises(DefinitionError, match="YAML syntax error"):
        load("a: !Ref b\n")


def test_several_documents_are_refused() -> None:
    with pytest.raises(DefinitionError, match="single document"):
        load("a: 1\n---\nb: 2\n")


def test_empty_text_loads_as_none() -> None:
    assert load("").data is None


def test_mapping_is_deep_copied_without_positions() -> None:
    source = {"name": "flow", "steps": ({"id": "a", "input": {"x": [1, 2]}},)}
    loaded = load(source)
    assert loaded.data == {"name": "flow", "steps": [{"id": "a", "input": {"x": [1, 2]}}]}
    loaded.data["steps"][0]["input"]["x"].append(3)
    assert source["steps"][0]["input"]["x"] == [1, 2]
    assert len(loaded.positions) == 0


def test_mapping_with_non_json_values_is_refused() -> None:
    with pytest.raises(DefinitionError, match="not a string"):
        load({1: "x"})
    with pytest.raises(DefinitionError) as info:
        load({"steps": [{"input": object()}]})
    assert info.value.diagnostics[0].path == "steps[0].input"


def test_path_is_read_and_named_in_diagnostics(tmp_path: Path) -> None:
    path = tmp_path / "flow.yaml"
    path.write_text(YAML)
    loaded = load(path)
    assert loaded.file == str(path)
    assert loaded.data["name"] == "flow"
    assert load(str(path)).data["name"] == "flow"  # a one-line str naming a yaml file


def test_missing_file_is_a_definition_error(tmp_path: Path) -> None:
    with pytest.raises(DefinitionError, match="cannot read"):
        load(tmp_path / "missing.yaml")


def test_reporter_fills_in_position_file_path_and_quoted_column_offset() -> None:
    loaded = load('when: "{{ a > }}"\nplain: x\n')
    report = Reporter(loaded.positions, "f.yaml")
    report.error(("when",), "bad", hint="fix", step_id="s", column_offset=3)
    report.error(("plain",), "unknown", at_key=True)
    report.warning(("plain",), "careful")
    first, second, third = report.diagnostics
    assert (first.file, first.line, first.column, first.step_id) == ("f.yaml", 1, 11, "s")
    assert first.path == "when"
    assert (second.line, second.column) == (2, 1)
    assert third.severity == "warning"
    assert report.has_errors


def test_relinked_positions_read_through_to_the_source() -> None:
    positions = load(YAML).positions
    view = positions.relinked({("steps", 0, "config", "url"): ("steps", 0, "url")})
    assert view[("steps", 0, "config", "url")] == positions[("steps", 0, "url")]
    assert view.source_path(("steps", 0, "config", "url", 1)) == ("steps", 0, "url", 1)
    assert isinstance(view, Positions)


def test_format_path() -> None:
    assert format_path(("steps", 3, "retry", "backoff")) == "steps[3].retry.backoff"
    assert format_path(()) == ""
