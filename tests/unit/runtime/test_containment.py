"""What a run produces or receives is checked before it can reach the store, and user code
cannot take the engine down: values no store can hold fail their step, limits hold,
`SystemExit` fails the step, a runtime that was never started says so."""

from __future__ import annotations

import asyncio
import itertools
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tideflow.dsl import compile_definition
from tideflow.errors import InputValidationError, RuntimeNotStarted
from tideflow.model.plan import Plan
from tideflow.runtime.runtime import Runtime
from tideflow.testing.waiting import step_is, wait_until
from tideflow.worker.executors.functions import register, unregister

ACCOUNT = "1234567890123456789012"
WAIT = 20.0


def flow(text: str) -> Plan:
    return compile_definition(textwrap.dedent(text))


_names = itertools.count()


def one_step(step: str, output: str | None = None) -> Plan:
    out = f"\noutput: {output!r}" if output else ""
    return flow(f'name: one{next(_names)}\nversion: "1"\nsteps:\n  - {step}{out}\n')


NOOP = one_step("{id: a, type: noop}")
FUNCTIONS = {
    "c.nan": lambda: {"x": float("nan")},
    "c.inf": lambda: [float("-inf")],
    "c.big": lambda: 2**70,
    "c.long": lambda: "x" * 200,
    "c.echo": lambda n: n,
}


def _raise(exc: BaseException) -> Any:
    def fn() -> None:
        raise exc

    return fn


async def _async_exit() -> None:
    sys.exit(4)


@pytest.fixture(autouse=True)
def functions() -> Iterator[None]:
    extra = {
        "c.exit": _raise(SystemExit(3)),
        "c.interrupt": _raise(KeyboardInterrupt("stop")),
        "c.generator_exit": _raise(GeneratorExit()),
        "c.async_exit": _async_exit,
    }
    for name, fn in {**FUNCTIONS, **extra}.items():
        register(name)(fn)
    yield
    for name in {**FUNCTIONS, **extra}:
        unregister(name)


@pytest.fixture(params=["memory", "sqlite"])
async def rt(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Runtime]:
    store = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path}/runs.db"
    async with Runtime(store=store, workers=2, max_step_output=100, max_run_input=1000) as rt:
        yield rt


async def run(rt: Runtime, plan: Plan, input: Any = None) -> Any:
    return await asyncio.wait_for(rt.run(plan, input), WAIT)


async def assert_store_takes_new_runs(rt: Runtime) -> None:
    assert (await run(rt, NOOP)).status == "succeeded"


@pytest.mark.parametrize(
    "step",
    [
        '{id: a, type: set, values: {n: "{{ int(inputs.account) }}"}}',
        '{id: a, type: set, values: {n: "{{ 10000000000 * 10000000000 * 10000000000 }}"}}',
        '{id: a, type: set, values: {n: "{{ 1e308 * 10 }}"}}',
        '{id: a, type: python, function: c.echo, input: {n: "{{ int(inputs.account) }}"}}',
        '{id: a, type: emit, event: {type: t, data: "{{ int(inputs.account) }}"}}',
        '{id: a, type: map, items: "{{ [int(inputs.account)] }}", step: {id: i, type: noop}}',
    ],
)
async def test_an_engine_value_no_store_can_hold_fails_its_step(rt: Runtime, step: str) -> None:
    result = await run(rt, one_step(step), {"account": ACCOUNT})
    assert result.status == "failed"
    assert result.steps["a"].status == "failed"
    assert result.steps["a"].error["type"] == "OutputNotSerializable"
    assert "cannot be stored as JSON" in result.steps["a"].error["message"]
    await assert_store_takes_new_runs(rt)


async def test_a_run_output_no_store_can_hold_fails_the_run(rt: Runtime) -> None:
    plan = one_step("{id: a, type: noop}", "{{ int(inputs.account) }}")
    result = await run(rt, plan, {"account": ACCOUNT})
    assert result.status == "failed"
    assert result.error["type"] == "OutputNotSerializable"
    assert result.error["message"].startswith("run output: the run's output cannot be stored")
    await assert_store_takes_new_runs(rt)


@pytest.mark.parametrize(
    ("function", "error", "words"),
    [
        ("c.nan", "OutputNotSerializable", "nan is not a number"),
        ("c.inf", "OutputNotSerializable", "-inf is not a number"),
        ("c.big", "OutputNotSerializable", "64-bit"),
        ("c.long", "OutputTooLarge", "over the limit of 100 bytes"),
    ],
)
async def test_an_action_output_that_cannot_be_stored_fails_its_step(
    rt: Runtime, function: str, error: str, words: str
) -> None:
    result = await run(rt, one_step(f"{{id: a, type: python, function: {function}}}"))
    assert result.status == "failed"
    assert result.steps["a"].error["type"] == error
    assert words in result.steps["a"].error["message"]
    await assert_store_takes_new_runs(rt)


@pytest.mark.parametrize(
    ("value", "words"),
    [({"n": 2**70}, "64-bit"), ({"s": "x" * 1000}, "over the limit of 1000 bytes")],
)
async def test_an_input_that_cannot_be_stored_is_refused_and_no_run_is_made(
    rt: Runtime, value: Any, words: str
) -> None:
    with pytest.raises(InputValidationError) as caught:
        await rt.start_run(NOOP, value)
    assert caught.value.message.startswith("the run input")
    assert words in caught.value.message
    assert (await rt.store.list_runs()).runs == []


async def test_a_signal_payload_that_cannot_be_stored_is_refused(rt: Runtime) -> None:
    plan = one_step("{id: a, type: wait, signal: go}", "{{ steps.a.output }}")
    run_id = await rt.start_run(plan)
    await wait_until(rt, run_id, step_is("a", "waiting"))
    for payload, words in [(float("nan"), "nan"), ("x" * 200, "over the limit")]:
        with pytest.raises(InputValidationError) as caught:
            await rt.signal(run_id, "go", payload)
        assert caught.value.message.startswith("the payload of signal 'go'")
        assert words in caught.value.message
    await rt.signal(run_id, "go", "fine")
    assert (await asyncio.wait_for(rt.wait(run_id), WAIT)).output == "fine"


@pytest.mark.parametrize(
    ("function", "error", "message"),
    [
        ("c.exit", "SystemExit", "3"),
        ("c.interrupt", "KeyboardInterrupt", "stop"),
        ("c.generator_exit", "GeneratorExit", "GeneratorExit"),
        ("c.async_exit", "SystemExit", "4"),
    ],
)
async def test_user_code_that_exits_fails_only_its_step(
    rt: Runtime, function: str, error: str, message: str
) -> None:
    result = await run(rt, one_step(f"{{id: a, type: python, function: {function}}}"))
    assert result.status == "failed"
    assert result.steps["a"].error["type"] == error
    assert result.steps["a"].error["message"] == message
    await assert_store_takes_new_runs(rt)


async def test_a_runtime_that_was_not_started_says_so() -> None:
    rt = Runtime()
    calls = [
        rt.run(NOOP),
        rt.start_run(NOOP),
        rt.signal("r", "go"),
        rt.cancel("r"),
        rt.wait("r"),
    ]
    for call in calls:
        with pytest.raises(RuntimeNotStarted) as caught:
            await asyncio.wait_for(call, WAIT)
        assert "use `async with Runtime(...)` or `await rt.start()`" in caught.value.message
    async with rt:
        assert (await run(rt, NOOP)).status == "succeeded"
    with pytest.raises(RuntimeNotStarted):
        await rt.start_run(NOOP)
