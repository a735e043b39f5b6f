"""A large run input is checked against its schema in a thread, never on the event loop:
a megabyte through jsonschema is seconds of Python (runtime/catalog.py, admit_input)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

import tideflow.dsl.inputs
from tideflow.dsl.compiler import compile_definition
from tideflow.dsl.regexes import stored_definitions
from tideflow.errors import DefinitionError, InputValidationError
from tideflow.model.plan import Plan
from tideflow.runtime.catalog import INLINE_INPUT_CHECK
from tideflow.runtime.runtime import Runtime

FLOW = {
    "name": "items",
    "version": "1",
    "input": {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "items": {"type": "object", "properties": {"id": {"pattern": "^[a-z0-9-]+$"}}},
            }
        },
    },
    "steps": [{"id": "a", "type": "noop"}],
}


def items(count: int) -> dict[str, Any]:
    return {"items": [{"id": f"item-{i}"} for i in range(count)]}


@pytest.fixture
def checked_on(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The thread each run input was checked on."""
    threads: list[int] = []
    real = tideflow.dsl.inputs.validate_input

    def spy(plan: Plan, value: Any) -> None:
        threads.append(threading.get_ident())
        real(plan, value)

    monkeypatch.setattr(tideflow.dsl.inputs, "validate_input", spy)
    return threads


async def test_a_large_input_is_checked_off_the_loop(checked_on: list[int]) -> None:
    large = items(10_000)
    assert len(str(large)) > INLINE_INPUT_CHECK
    async with Runtime(workers=1) as rt:
        await rt.client.register(FLOW)
        small_run = await rt.client.start("items", items(2))
        large_run = await rt.client.start("items", large)
        bad = {"items": [{"id": "item-1"}] * 5000 + [{"id": "NOT OK"}]}
        with pytest.raises(InputValidationError, match="does not match"):
            await rt.client.start("items", bad)
        for run_id in (small_run, large_run):
            assert (await rt.client.wait(run_id, 10)).status == "succeeded"
    loop_thread = threading.get_ident()
    assert checked_on[0] == loop_thread
    assert checked_on[1] != loop_thread and checked_on[2] != loop_thread


async def test_a_definition_stored_with_a_pattern_re2_refuses_still_loads(
    tmp_path: Path,
) -> None:
    """Registered before patterns ran on RE2: its plan loads (its runs go on) and a new
    run's input is refused saying why, never matched by a backtracking engine."""
    source = {
        "name": "legacy",
        "version": "1",
        "input": {"type": "object", "properties": {"code": {"pattern": "^(?=x)x+$"}}},
        "steps": [{"id": "a", "type": "noop"}],
    }
    with pytest.raises(DefinitionError, match="refused by RE2"):
        compile_definition(source)
    with stored_definitions():  # as an older tideflow compiled and stored it
        old = compile_definition(source)
    store = f"sqlite:///{tmp_path / 'legacy.db'}"
    async with Runtime(workers=0, store=store) as rt:
        await rt.store.save_definition(old)
    async with Runtime(workers=1, store=store) as rt:
        plan = await rt.client.definition("legacy")
        assert plan.hash == old.hash
        with pytest.raises(InputValidationError, match="cannot be checked: RE2 refuses it"):
            await rt.client.start("legacy", {"code": "xx"})
        run_id = await rt.client.start("legacy", {"other": 1})
        assert (await rt.client.wait(run_id, 10)).status == "succeeded"
