"""`tideflow validate`, `graph` and `run` on every kind of definition reference and on
files that are not definitions at all."""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Iterator

import pytest

from .conftest import STEPS_MODULE, Workdir, invoke, stdout_json, tideflow


@pytest.fixture(autouse=True)
def forget_definition_modules() -> Iterator[None]:
    """In-process commands import the definition files; each test starts without them."""
    yield
    for name in ("flow_code", "flow_bad", "flow_unbound"):
        sys.modules.pop(name, None)


BROKEN = """\
name: broken
version: "1"
steps:
  - id: route
    type: switch
    cases: [{when: "{{ inputs.x > 1 }}", next: [a]}]
  - {id: a, type: noop, depends_on: [b]}
  - {id: b, type: noop, depends_on: [a]}
  - {id: a, type: wait, signal: go, timeuot: 5s}
"""

PYTHON_FLOW = f"""\
from tideflow import Workflow

workflow = Workflow("from-code", "1", input={{"type": "object", "required": ["value"],
                                             "properties": {{"value": {{}}}}}})


@workflow.task()
def first(value):
    return {{"got": value}}


@workflow.task()
def second(first):
    return {{"after": first}}


other = Workflow("other", "1")
other.python("only", "{STEPS_MODULE}:echo", input={{"value": 1}})
"""


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("image.yaml", b"\x89PNG\r\n\x1a\n\x00\x00IHDR", "is not a text file: a NUL byte"),
        ("nul.yaml", b'name: x\nversion: "1"\x00\n', "is not a text file: a NUL byte"),
        ("latin1.yaml", b"name: caf\xe9\n", "is not UTF-8 text: byte 0xe9 at line 1"),
    ],
)
def test_a_file_that_is_not_text_is_one_line_and_exit_2(
    workdir: Workdir, name: str, content: bytes, message: str
) -> None:
    (workdir.path / name).write_bytes(content)
    for command in (["validate", name], ["run", name, "--store", "memory://"], ["graph", name]):
        done = tideflow(workdir.path, *command)
        assert done.returncode == 2, (command, done.stderr)
        assert "Traceback" not in done.stderr
        (line,) = done.stderr.strip().splitlines()
        assert line.startswith(f"error: {name} {message}")


def test_a_json_file_is_parsed_as_json(workdir: Workdir) -> None:
    text = '{"name": "j", "version": "1", "steps": [{"id": "a", "type": "noop"},]}\n'
    (workdir.path / "flow.json").write_text(text)
    done = invoke("run", "flow.json", "--store", "memory://")
    assert done.exit_code == 2
    assert done.stderr.startswith("flow.json:1:68: error: JSON syntax error: trailing comma")
    done = invoke("validate", "flow.json", "--format", "json")
    assert done.exit_code == 1
    [error] = stdout_json(done)["files"]["flow.json"]
    assert (error["line"], error["column"]) == (1, 68)


def test_a_definition_over_the_size_limit_is_refused(workdir: Workdir) -> None:
    done = tideflow(
        workdir.path, "validate", "quick.yaml", env={"TIDEFLOW_MAX_DEFINITION_BYTES": "50"}
    )
    assert done.returncode == 2
    assert done.stderr.strip().startswith("error: definition too large: more than 50 bytes")


def test_validate_reports_every_problem_at_once_in_text_and_json(workdir: Workdir) -> None:
    (workdir.path / "broken.yaml").write_text(BROKEN)
    done = invoke("validate", "broken.yaml")
    assert done.exit_code == 1
    lines = [line for line in done.stderr.splitlines() if not line.startswith("  hint:")]
    assert sorted(lines) == [
        "broken.yaml:4:5: error: missing required key 'default' in a switch step (step 'route')",
        "broken.yaml:7:38: error: dependency cycle: a -> b -> a (step 'a')",
        "broken.yaml:9:10: error: duplicate step id 'a' (defined on lines 7 and 9) (step 'a')",
        "broken.yaml:9:37: error: unknown key 'timeuot' in a wait step (step 'a')",
    ]
    report = stdout_json(invoke("validate", "broken.yaml", "--format", "json"))
    assert report["valid"] is False
    found = {
        (d["line"], d["step_id"], d["message"].split(" (")[0])
        for d in report["files"]["broken.yaml"]
    }
    assert found == {
        (4, "route", "missing required key 'default' in a switch step"),
        (7, "a", "dependency cycle: a -> b -> a"),
        (9, "a", "duplicate step id 'a'"),
        (9, "a", "unknown key 'timeuot' in a wait step"),
    }


STRICT = f"""\
name: strict
version: "1"
steps:
  - id: ok
    type: python
    function: "{STEPS_MODULE}:echo"
    input: {{value: 1}}
  - id: missing
    type: python
    function: "{STEPS_MODULE}:echo"
  - id: extra
    type: python
    function: "{STEPS_MODULE}:echo"
    input: {{value: 1, colour: red}}
  - id: gone
    type: python
    function: "{STEPS_MODULE}:nothing_here"
  - id: child
    type: subflow
    workflow: quick
  - id: orphan
    type: subflow
    workflow: nowhere
"""


def test_strict_imports_functions_and_checks_them_against_input(workdir: Workdir) -> None:
    (workdir.path / "strict.yaml").write_text(STRICT)
    assert invoke("validate", "strict.yaml").exit_code == 0  # not strict: nothing imported
    report = stdout_json(invoke("validate", "strict.yaml", "--strict", "--format", "json"))
    found = sorted((d["line"], d["step_id"], d["message"]) for d in report["files"]["strict.yaml"])
    assert [(line, step) for line, step, _ in found] == [
        (8, "missing"),
        (14, "extra"),
        (17, "gone"),
        (23, "orphan"),
    ]
    messages = [message for _, _, message in found]
    assert messages[0] == f"missing required parameter 'value' of '{STEPS_MODULE}:echo'"
    assert messages[1] == f"input key 'colour' is not a parameter of '{STEPS_MODULE}:echo'"
    assert "has no attribute 'nothing_here'" in messages[2]
    assert messages[3].startswith("subflow workflow 'nowhere' is not in the definition files in")


def test_strict_finds_subflows_in_the_store(workdir: Workdir) -> None:
    child = 'name: nowhere\nversion: "2"\nsteps: [{id: a, type: noop}]\n'
    (workdir.path / "elsewhere").mkdir()
    (workdir.path / "elsewhere" / "nowhere.yaml").write_text(child)
    flow = 'name: p\nversion: "1"\nsteps: [{id: c, type: subflow, workflow: nowhere}]\n'
    (workdir.path / "parent.yaml").write_text(flow)
    assert invoke("validate", "parent.yaml", "--strict").exit_code == 1
    assert (
        invoke("validate", "parent.yaml", "--strict", "--definitions", "elsewhere").exit_code == 0
    )
    registered = invoke(
        "definitions", "register", "elsewhere/nowhere.yaml", "--store", workdir.store
    )
    assert registered.exit_code == 0, registered.stderr
    done = invoke("validate", "parent.yaml", "--strict", "--store", workdir.store)
    assert done.exit_code == 0, done.stderr


def test_run_validate_and_graph_take_a_python_definition(workdir: Workdir) -> None:
    (workdir.path / "flow_code.py").write_text(PYTHON_FLOW)
    done = tideflow(
        workdir.path,
        "run",
        "flow_code.py",
        "--input",
        '{"value": 7}',
        "--json",
        "--store",
        "memory://",
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["steps"]["second"]["output"] == {"after": {"got": 7}}
    assert invoke("validate", "flow_code.py", "--strict").exit_code == 0
    assert "first --> second" in invoke("graph", "flow_code.py").stdout
    other = invoke("run", "flow_code.py:other", "--json", "--store", "memory://")
    assert stdout_json(other)["steps"]["only"]["output"] == {"echo": 1}
    as_module = invoke("graph", "flow_code:workflow")
    assert as_module.exit_code == 0 and "first --> second" in as_module.stdout


@pytest.mark.parametrize(
    ("code", "reference", "message"),
    [
        ("x = 1\n", "flow_bad.py", "flow_bad.py defines no tideflow Workflow"),
        ("1 / 0\n", "flow_bad.py", "importing flow_bad.py failed: ZeroDivisionError"),
        (PYTHON_FLOW.replace("workflow", "one"), "flow_bad.py", "defines several workflows"),
        (PYTHON_FLOW, "flow_bad.py:first", "flow_bad.py:first is a function, not a tideflow"),
        (PYTHON_FLOW, "missing.py", "cannot read missing.py: no such file"),
    ],
)
def test_a_python_definition_that_gives_no_workflow_is_one_line(
    workdir: Workdir, code: str, reference: str, message: str
) -> None:
    (workdir.path / "flow_bad.py").write_text(code)
    done = tideflow(workdir.path, "run", reference, "--store", "memory://")
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert message in line
    assert invoke("validate", reference).exit_code == 2


def test_an_unbound_task_parameter_is_a_definition_error(workdir: Workdir) -> None:
    code = textwrap.dedent(
        """\
        from tideflow import Workflow
        workflow = Workflow("w", "1", input={"type": "object", "properties": {}})

        @workflow.task()
        def lonely(value):
            return value
        """
    )
    (workdir.path / "flow_unbound.py").write_text(code)
    done = invoke("validate", "flow_unbound.py")
    assert done.exit_code == 1
    assert (
        "missing required parameter 'value' of flow_unbound:lonely (step 'lonely')" in done.stderr
    )
    assert invoke("run", "flow_unbound.py", "--store", "memory://").exit_code == 2
