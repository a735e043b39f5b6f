"""With --json, an error is one JSON object on stdout, {"error": {type, message, hint?,
diagnostics?}}, with the same exit code as in text mode; `--version` prints the version."""

from __future__ import annotations

import importlib.metadata

from .conftest import Workdir, invoke, stdout_json, tideflow

BAD_DEFINITION = """
name: bad
version: "1"
steps:
  - {id: a, type: noop, depends_on: [missing]}
"""

TYPED = """
name: typed
version: "1"
input: {type: object, required: [order], properties: {order: {type: string}}}
steps: [{id: a, type: noop}]
"""


def test_a_definition_error_is_json_with_its_diagnostics(workdir: Workdir) -> None:
    (workdir.path / "bad.yaml").write_text(BAD_DEFINITION, encoding="utf-8")

    done = tideflow(workdir.path, "run", "bad.yaml", "--json", "--store", "memory://")

    assert done.returncode == 2
    error = stdout_json(done)["error"]
    assert error["type"] == "DefinitionError"
    assert "missing" in error["message"]
    (diagnostic,) = error["diagnostics"]
    assert diagnostic["file"] == "bad.yaml"
    assert diagnostic["line"] == 5
    assert diagnostic["step_id"] == "a"
    assert "unknown step 'missing'" in diagnostic["message"]
    assert "bad.yaml:5:" in done.stderr  # the text stays on stderr


def test_input_that_is_not_json_is_a_json_error_with_a_hint(workdir: Workdir) -> None:
    done = tideflow(
        workdir.path, "run", "quick.yaml", "--json", "--input", "{oops", "--store", "memory://"
    )

    assert done.returncode == 2
    error = stdout_json(done)["error"]
    assert error["type"] == "UsageError"
    assert error["message"].startswith("--input is not valid JSON")
    assert error["hint"] == "pass a JSON value, or @path/to/file.json"
    assert "diagnostics" not in error


def test_input_that_does_not_fit_the_schema_is_a_json_error(workdir: Workdir) -> None:
    (workdir.path / "typed.yaml").write_text(TYPED, encoding="utf-8")

    done = tideflow(workdir.path, "run", "typed.yaml", "--json", "--input", "{}")

    assert done.returncode == 2
    error = stdout_json(done)["error"]
    assert error["type"] == "InputValidationError"
    assert "order" in error["message"]


def test_store_and_lookup_errors_of_runs_commands_are_json(workdir: Workdir) -> None:
    missing = tideflow(workdir.path, "runs", "list", "--json", "--store", workdir.store)
    assert missing.returncode == 2
    assert stdout_json(missing)["error"]["type"] == "StoreError"
    assert str(workdir.db) in stdout_json(missing)["error"]["message"]

    assert tideflow(workdir.path, "db", "upgrade", "--store", workdir.store).returncode == 0
    for command in (["runs", "show", "nope"], ["runs", "history", "nope"]):
        done = tideflow(workdir.path, *command, "--json", "--store", workdir.store)
        assert done.returncode == 2, command
        assert stdout_json(done) == {
            "error": {"type": "NotFound", "message": f"no run 'nope' in {workdir.store}"}
        }


def test_without_json_an_error_leaves_stdout_empty(workdir: Workdir) -> None:
    # In one process: a --json invocation must not leave the next one in JSON mode.
    assert invoke("runs", "show", "nope", "--json", "--store", "memory://").exit_code == 2

    done = invoke("runs", "show", "nope", "--store", "memory://")

    assert done.exit_code == 2
    assert done.stdout == ""
    assert done.stderr.strip() == "error: no run 'nope' in memory://"


def test_version_prints_the_installed_version(workdir: Workdir) -> None:
    expected = f"tideflow {importlib.metadata.version('tideflow')}"
    for flag in ("--version", "-V"):
        done = tideflow(workdir.path, flag)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == expected


def test_validate_format_json_reports_an_unreadable_file_as_json(workdir: Workdir) -> None:
    done = tideflow(workdir.path, "validate", "--format", "json", "missing.yaml")

    assert done.returncode == 2
    report = stdout_json(done)
    assert report["valid"] is False
    (problem,) = report["files"]["missing.yaml"]
    assert problem["severity"] == "error"
    assert problem["message"] == "cannot read missing.yaml: No such file or directory"
