"""The API's compiler pool (api/compiling.py): definitions compile in warm processes with a
time bound, plans come back pickled and run as the ones compiled here, a compile past the
bound is stopped and its process replaced."""

from __future__ import annotations

import asyncio
import json
import os
import pickle
from pathlib import Path
from typing import Any

import pytest
from tests.processes import alive

from tideflow.api.compile_worker import summary_of
from tideflow.api.compiling import CompilerPool, compile_limits
from tideflow.dsl.compiler import compile_definition
from tideflow.errors import CompilerUnavailable, DefinitionError
from tideflow.runtime.runtime import Runtime

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"

FLOW: dict[str, Any] = {
    "name": "pickled",
    "version": "1",
    "input": {"type": "object", "properties": {"n": {"type": "integer"}}},
    "steps": [
        {
            "id": "base",
            "type": "set",
            "values": {"double": "{{ inputs.n * 2 }}", "label": "n={{ inputs.n }}"},
        },
        {
            "id": "route",
            "type": "switch",
            "depends_on": ["base"],
            "cases": [{"when": "{{ steps.base.output.double > 5 }}", "next": ["big"]}],
            "default": ["small"],
        },
        {"id": "big", "type": "set", "values": {"size": "big {{ steps.base.output.double }}"}},
        {"id": "small", "type": "set", "values": {"size": "small"}},
        {
            "id": "after",
            "type": "set",
            "depends_on": ["big", "small"],
            "when": "{{ inputs.n != 0 }}",
            "values": {"seen": "{{ [steps.base.output.label, inputs.n + 1] }}"},
        },
    ],
    "output": "{{ {'base': steps.base.output, 'after': steps.after.output} }}",
}


def big_definition(steps: int) -> dict[str, Any]:
    """About 130 bytes of JSON per step: 7,600 steps is a 1 MB definition."""
    return {
        "name": "big",
        "version": "1",
        "steps": [
            {
                "id": f"s{i}",
                "type": "set",
                "values": {"x": f"{{{{ inputs.a + {i} }}}}", "t": f"text {i} {{{{ inputs.b }}}}"},
                **({"depends_on": [f"s{i - 1}"]} if i else {}),
            }
            for i in range(steps)
        ],
    }


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_plan_comes_back_from_a_pickle(path: Path) -> None:
    plan = compile_definition(path)
    back = pickle.loads(pickle.dumps(plan))
    assert back.hash == plan.hash and back == plan
    assert back.specs == plan.specs and back.source == plan.source


async def test_a_plan_from_a_pickle_runs_as_the_one_compiled_here() -> None:
    here = compile_definition(FLOW)
    back = pickle.loads(pickle.dumps(here))
    outputs = []
    for plan in (here, back):
        async with Runtime(workers=1) as rt:
            await rt.client.register(plan)
            results = [
                await rt.client.wait(await rt.client.start("pickled", {"n": n}), 10) for n in (1, 4)
            ]
            outputs.append([(r.status, r.output) for r in results])
    assert outputs[0] == outputs[1]
    assert outputs[1][1][1]["after"] == {"seen": ["n=4", 5]}


async def test_the_pool_compiles_in_its_processes_what_compiles_here() -> None:
    async with (
        Runtime(workers=1) as rt,
        CompilerPool(rt.client.action_types, workers=1, wait=60) as pool,
    ):
        plan = await pool.compile(FLOW)
        assert plan.hash == compile_definition(FLOW).hash
        assert await pool.summary(FLOW) == summary_of(plan)
        yaml_text = "name: y\nversion: '2'\nsteps: [{id: a, type: noop}]\n...\n"
        assert (await pool.summary(yaml_text))["name"] == "y"
        (pid,) = pool.pids()
        assert pid != os.getpid()
        await rt.client.register(plan)
        result = await rt.client.wait(await rt.client.start("pickled", {"n": 4}), 10)
        assert result.output["after"] == {"seen": ["n=4", 5]}


async def test_a_definition_error_comes_back_with_every_diagnostic() -> None:
    bad = {"name": "Bad Name", "version": "1", "steps": [{"id": "a", "type": "noop"}, 42]}
    with pytest.raises(DefinitionError) as here:
        compile_definition(bad)
    async with Runtime(workers=0) as rt, CompilerPool(rt.client.action_types, wait=60) as pool:
        with pytest.raises(DefinitionError) as there:
            await pool.summary(bad)
        text = "name: f\nversion: '1'\nsteps:\n  - {id: a, type: http}\n...\n"
        with pytest.raises(DefinitionError) as action:  # the executors' config schemas
            await pool.compile(text)
    assert there.value.diagnostics == here.value.diagnostics
    assert "missing required key 'url'" in action.value.message


async def test_a_compile_past_the_time_bound_is_stopped_and_its_process_replaced() -> None:
    """A 2 MB definition takes seconds to compile; the bound is one second."""
    async with (
        Runtime(workers=0) as rt,
        CompilerPool(rt.client.action_types, workers=1, timeout=1, wait=60) as pool,
    ):
        await pool.summary(FLOW)  # the process is up
        (first,) = pool.pids()
        with pytest.raises(DefinitionError) as caught:
            await pool.summary(big_definition(15_000))
        assert "took longer than 1 s, the server's limit" in caught.value.message
        assert "TIDEFLOW_COMPILE_TIMEOUT" in (caught.value.diagnostics[0].hint or "")
        assert not alive(first)
        assert (await pool.summary(FLOW))["name"] == "pickled"  # a fresh process took over
        assert pool.pids() != [first]


async def test_no_free_process_in_time_is_a_503() -> None:
    async with (
        Runtime(workers=0) as rt,
        CompilerPool(rt.client.action_types, workers=1, timeout=60, wait=0.2) as pool,
    ):
        await pool.ready()
        busy = asyncio.create_task(pool.summary(big_definition(7600)))
        await asyncio.sleep(0)  # it takes the only process
        with pytest.raises(CompilerUnavailable):
            await pool.summary(FLOW)
        assert (await busy)["name"] == "big"
    with pytest.raises(CompilerUnavailable):  # closed
        await pool.summary(FLOW)


def test_the_bounds_come_from_the_environment() -> None:
    assert compile_limits({}) == (2, 30.0)
    env = {"TIDEFLOW_COMPILE_WORKERS": "4", "TIDEFLOW_COMPILE_TIMEOUT": "2.5"}
    assert compile_limits(env) == (4, 2.5)
    for name, value in [
        ("TIDEFLOW_COMPILE_WORKERS", "0"),
        ("TIDEFLOW_COMPILE_WORKERS", "1.5"),
        ("TIDEFLOW_COMPILE_TIMEOUT", "-1"),
        ("TIDEFLOW_COMPILE_TIMEOUT", "inf"),
        ("TIDEFLOW_COMPILE_TIMEOUT", "soon"),
    ]:
        with pytest.raises(ValueError, match=name):
            compile_limits({name: value})


def test_a_definition_of_7600_steps_is_a_1_mb_body() -> None:
    assert 950_000 < len(json.dumps(big_definition(7600))) < 1 << 20
