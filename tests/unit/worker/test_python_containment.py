"""A python step cannot take the worker down: what it raises fails the step, a thread it
hangs is abandoned (named in a warning, no longer counted, not keeping the process alive),
and `os._exit` needs `isolation: process`, where it fails only the step."""

from __future__ import annotations

import asyncio
import importlib
import logging
import textwrap
import threading
from collections.abc import AsyncIterator

import pytest

from tideflow.dsl import compile_definition
from tideflow.errors import StepTimeout
from tideflow.runtime.runtime import Runtime
from tideflow.worker.executors.errors import FunctionRaised
from tideflow.worker.executors.python import PythonExecutor

from .conftest import ModuleDir, make_ctx

HANG = """
import threading
release = threading.Event()
def hang():
    release.wait(60)
    return "late"
def quick():
    return threading.current_thread().name
"""


@pytest.fixture
async def single() -> AsyncIterator[PythonExecutor]:
    executor = PythonExecutor(max_workers=1)
    yield executor
    await executor.aclose()


async def test_a_hung_thread_is_abandoned_named_and_does_not_starve_the_pool(
    single: PythonExecutor, modules: ModuleDir, caplog: pytest.LogCaptureFixture
) -> None:
    mod = modules.write(HANG)
    caplog.set_level(logging.WARNING, logger="tideflow.worker")
    try:
        with pytest.raises(StepTimeout):
            await single.execute(make_ctx(timeout=0.2), {"function": f"{mod}:hang"}, None)
        (abandoned,) = single.pool.abandoned()
        hung = next(t for t in threading.enumerate() if t.name == abandoned)
        assert hung.daemon  # it cannot keep the process from exiting
        # The pool has one thread; the hung one no longer counts, so this call runs at once.
        other = await single.execute(make_ctx(timeout=5), {"function": f"{mod}:quick"}, None)
        assert other != abandoned
    finally:
        importlib.import_module(mod).release.set()
    (record,) = [r for r in caplog.records if "abandoned" in r.getMessage()]
    message = record.getMessage()
    assert "run run-1 step step" in message
    assert f"'{mod}:hang'" in message
    assert abandoned in message


async def test_an_abandoned_thread_that_returns_rejoins_or_leaves_the_pool(
    single: PythonExecutor, modules: ModuleDir
) -> None:
    mod = modules.write(HANG)
    module = modules.import_(mod)
    with pytest.raises(StepTimeout):
        await single.execute(make_ctx(timeout=0.2), {"function": f"{mod}:hang"}, None)
    (abandoned,) = single.pool.abandoned()
    await single.execute(make_ctx(), {"function": f"{mod}:quick"}, None)
    hung = next(t for t in threading.enumerate() if t.name == abandoned)
    module.release.set()
    await asyncio.to_thread(hung.join, 10)
    assert not hung.is_alive()  # the pool was full again: the returning thread ended
    assert single.pool.abandoned() == []


async def test_system_exit_in_a_thread_is_a_step_error(
    single: PythonExecutor, modules: ModuleDir
) -> None:
    mod = modules.write("import sys\ndef leave():\n    sys.exit(3)\n")
    with pytest.raises(FunctionRaised) as caught:
        await single.execute(make_ctx(), {"function": f"{mod}:leave"}, None)
    assert caught.value.type_name == "SystemExit"
    assert caught.value.message == "3"
    assert "SystemExit" in caught.value.classes


async def test_os_exit_with_process_isolation_fails_only_the_step(modules: ModuleDir) -> None:
    mod = modules.write("import os\ndef die():\n    os._exit(5)\n")
    plan = compile_definition(
        textwrap.dedent(
            f"""
            name: dies
            version: "1"
            steps:
              - {{id: a, type: python, function: "{mod}:die", isolation: process}}
              - {{id: b, type: noop}}
            """
        )
    )
    async with Runtime(workers=2) as rt:
        result = await asyncio.wait_for(rt.run(plan), 30)
        assert result.status == "failed"
        assert result.steps["a"].error is not None
        assert result.steps["a"].error["type"] == "IsolatedProcessDied"
        assert "exited with code 5" in result.steps["a"].error["message"]
        assert result.steps["b"].status == "succeeded"
