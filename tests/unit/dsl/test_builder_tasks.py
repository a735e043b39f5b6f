"""`@wf.task` binds a function's parameters to input, and refuses one it cannot bind."""

import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tideflow import Workflow
from tideflow.errors import DefinitionError

DOCS = Path(__file__).resolve().parents[3] / "docs" / "concepts.md"
SCHEMA = {"type": "object", "required": ["order_id"], "properties": {"order_id": {}, "note": {}}}


def fetch() -> dict[str, Any]:
    return {}


def pack(fetch: dict[str, Any], order_id: str, note: str = "", ctx: Any = None) -> None: ...


def flexible(order_id: str, **rest: Any) -> None: ...


def inputs_of(wf: Workflow, step_id: str) -> Any:
    return next(s for s in wf.to_dict()["steps"] if s["id"] == step_id)


def test_parameters_bind_to_upstream_outputs_and_declared_inputs() -> None:
    wf = Workflow("t", "1", input=SCHEMA)
    wf.task()(fetch)
    wf.task()(pack)
    step = inputs_of(wf, "pack")
    assert step["input"] == {
        "fetch": "{{ steps.fetch.output }}",
        "order_id": "{{ inputs.order_id }}",
    }
    assert step["depends_on"] == ["fetch"]  # named after a step: depends on it
    assert wf.compile().specs["pack"].depends_on == ("fetch",)


def test_an_explicit_input_wins_and_fills_what_is_not_declared() -> None:
    wf = Workflow("t", "1", input=SCHEMA)
    wf.task()(fetch)
    wf.task(input={"order_id": "A-1", "note": "{{ inputs.note }}"})(pack)
    assert inputs_of(wf, "pack")["input"] == {
        "fetch": "{{ steps.fetch.output }}",
        "order_id": "A-1",
        "note": "{{ inputs.note }}",
    }


def test_without_an_input_schema_parameters_read_the_run_input_of_their_name() -> None:
    wf = Workflow("t", "1")
    wf.task()(flexible)
    assert inputs_of(wf, "flexible")["input"] == {"order_id": "{{ inputs.order_id }}"}


def test_a_required_parameter_left_unbound_is_a_compile_error_naming_step_and_parameter() -> None:
    wf = Workflow("t", "1", input={"type": "object", "properties": {"other": {}}})
    wf.task("packing")(pack)
    with pytest.raises(DefinitionError) as info:
        wf.compile()
    messages = [(d.step_id, d.message) for d in info.value.diagnostics]
    assert messages == [
        ("packing", f"missing required parameter 'fetch' of {__name__}:pack"),
        ("packing", f"missing required parameter 'order_id' of {__name__}:pack"),
    ]


def test_an_input_key_the_function_does_not_take_is_a_compile_error() -> None:
    wf = Workflow("t", "1", input=SCHEMA)
    wf.task()(fetch)
    wf.task(input={"colour": "red"})(pack)
    with pytest.raises(DefinitionError, match="input key 'colour' is not a parameter"):
        wf.to_dict()
    wf = Workflow("t", "1", input=SCHEMA)
    wf.task(input={"colour": "red"})(flexible)  # **rest takes it
    assert inputs_of(wf, "flexible")["input"]["colour"] == "red"


@pytest.fixture
def docs_example(tmp_path: Path) -> Iterator[Path]:
    text = DOCS.read_text(encoding="utf-8")
    block = re.search(r"```python\n(from tideflow import Workflow\n.*?)```", text, re.DOTALL)
    assert block is not None
    (tmp_path / "concepts_example.py").write_text(block.group(1), encoding="utf-8")
    sys.path.insert(0, str(tmp_path))
    yield tmp_path
    sys.path.remove(str(tmp_path))
    sys.modules.pop("concepts_example", None)


def test_the_task_example_in_the_concepts_doc_works_as_written(docs_example: Path) -> None:
    import concepts_example  # type: ignore[import-not-found]

    plan = concepts_example.plan
    ship = plan.specs["ship"]
    assert ship.depends_on == ("charge",)
    assert ship.input is not None
    assert ship.input.render({"inputs": {"order_id": "A1"}}) == {"order_id": "A1"}
    assert concepts_example.ship("A1") == {"tracking": "T-A1"}
