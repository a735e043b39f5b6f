"""`tideflow validate`, `graph` and `run`'s refusal of bad input, as real processes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def tideflow(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tideflow.cli.main", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def flows(tmp_path: Path) -> Path:
    (tmp_path / "cyclic.yaml").write_text(
        "name: cyc\nversion: '1'\nsteps:\n"
        "  - {id: a, type: noop, depends_on: [c]}\n"
        "  - {id: b, type: noop, depends_on: [a]}\n"
        "  - {id: c, type: noop, depends_on: [b]}\n"
    )
    (tmp_path / "typo.yaml").write_text(
        "name: typo\nversion: '1'\nsteps:\n  - id: a\n    type: noop\n    retyr: {max_attempts: 2}\n"
    )
    (tmp_path / "broken.yaml").write_text("name: broken\nversion: '1'\nsteps: [ {id: a\n")
    (tmp_path / "typed.yaml").write_text(
        "name: typed\nversion: '1'\n"
        "input: {type: object, required: [order], properties: {order: {type: object, "
        "properties: {amount: {type: number}}}}}\n"
        "steps: [{id: a, type: noop}]\n"
    )
    return tmp_path


def test_validate_a_cycle_exits_1_and_prints_the_path(flows: Path) -> None:
    done = tideflow("validate", str(flows / "cyclic.yaml"))
    assert done.returncode == 1
    assert (
        "a -> b -> c -> a" in done.stderr
        or "c -> a -> b -> c" in done.stderr
        or "->" in done.stderr
    )
    assert "cycle" in done.stderr.lower()


def test_validate_unknown_key_names_line_column_and_suggestion(flows: Path) -> None:
    done = tideflow("validate", str(flows / "typo.yaml"))
    assert done.returncode == 1
    assert "typo.yaml:6:5" in done.stderr
    assert "retry" in done.stderr and "retyr" in done.stderr


def test_validate_yaml_syntax_error_is_one_line_with_position(flows: Path) -> None:
    done = tideflow("validate", str(flows / "broken.yaml"))
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    first = done.stderr.strip().splitlines()[0]
    assert first.startswith(f"{flows / 'broken.yaml'}:")


def test_validate_json_format_for_tools(flows: Path) -> None:
    done = tideflow(
        "validate", "--format", "json", str(flows / "typo.yaml"), str(ROOT / "examples/etl.yaml")
    )
    assert done.returncode == 1
    report = json.loads(done.stdout)
    assert report["valid"] is False
    (problem,) = report["files"][str(flows / "typo.yaml")]
    assert (problem["line"], problem["column"], problem["step_id"]) == (6, 5, "a")
    assert report["files"][str(ROOT / "examples/etl.yaml")] == []


def test_run_refuses_input_that_is_not_json(flows: Path) -> None:
    done = tideflow(
        "run", str(flows / "typed.yaml"), "--input", "{order: 1}", "--store", "memory://"
    )
    assert done.returncode == 2
    assert "not valid JSON" in done.stderr


def test_run_refuses_input_that_fails_the_schema_with_its_path(flows: Path) -> None:
    done = tideflow(
        "run",
        str(flows / "typed.yaml"),
        "--input",
        '{"order": {"amount": "ten"}}',
        "--store",
        "memory://",
    )
    assert done.returncode == 2
    assert "order" in done.stderr and "amount" in done.stderr


def test_run_a_definition_that_does_not_compile_exits_2(flows: Path) -> None:
    done = tideflow("run", str(flows / "cyclic.yaml"), "--store", "memory://")
    assert done.returncode == 2
    assert "cycle" in done.stderr.lower()


def test_graph_prints_mermaid_and_dot() -> None:
    mermaid = tideflow("graph", "examples/content_moderation.yaml")
    assert mermaid.returncode == 0
    assert mermaid.stdout.startswith("flowchart")
    dot = tideflow("graph", "--format", "dot", "examples/content_moderation.yaml")
    assert dot.returncode == 0
    assert dot.stdout.startswith("digraph")
    assert "->" in dot.stdout


def test_help_everywhere_has_examples() -> None:
    for command in (["run"], ["validate"], ["graph"], ["executors", "list"]):
        done = tideflow(*command, "--help")
        assert done.returncode == 0
        assert "Examples" in done.stdout


def test_run_resolves_subflows_in_the_file_directory_or_definitions_dir(tmp_path: Path) -> None:
    (tmp_path / "parent.yaml").write_text(
        "name: parent\nversion: '1'\n"
        "steps: [{id: kid, type: subflow, workflow: child, input: {n: 20}}]\n"
        "output: '{{ steps.kid.output }}'\n"
    )
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "child.yaml").write_text(
        "name: child\nversion: '1'\nsteps: [{id: s, type: set, values: {v: '{{ inputs.n + 1 }}'}}]\n"
        "output: '{{ steps.s.output.v }}'\n"
    )
    missing = tideflow("run", str(tmp_path / "parent.yaml"), "--json", "--store", "memory://")
    assert missing.returncode == 1
    assert json.loads(missing.stdout)["error"]["type"] == "ChildRunFailed"
    found = tideflow(
        "run",
        str(tmp_path / "parent.yaml"),
        "--json",
        "--store",
        "memory://",
        "--definitions",
        str(lib),
    )
    assert found.returncode == 0, found.stderr
    assert json.loads(found.stdout)["output"] == 21
    (tmp_path / "child.yaml").write_text((lib / "child.yaml").read_text())
    beside = tideflow("run", str(tmp_path / "parent.yaml"), "--json", "--store", "memory://")
    assert json.loads(beside.stdout)["output"] == 21
