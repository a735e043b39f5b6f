"""The python executor: import paths, registration, ctx, errors, threads and processes."""

from __future__ import annotations

import asyncio
import importlib
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from tests.processes import alive, eventually

from tideflow.errors import StepTimeout
from tideflow.worker.executors.errorinfo import error_info_from_exception
from tideflow.worker.executors.errors import (
    FunctionNotFound,
    FunctionRaised,
    InvalidStepInput,
    IsolatedProcessDied,
    OutputNotSerializable,
)
from tideflow.worker.executors.python import PythonExecutor, register, registered, unregister

from .conftest import ModuleDir, make_ctx


@pytest.fixture
async def python() -> AsyncIterator[PythonExecutor]:
    executor = PythonExecutor(max_workers=2)
    yield executor
    await executor.aclose()


async def test_sync_function_gets_input_as_keyword_arguments(
    python: PythonExecutor, modules: ModuleDir
) -> None:
    mod = modules.write("def add(a, b=1):\n    return {'sum': a + b}\n")
    out = await python.execute(make_ctx(), {"function": f"{mod}:add"}, {"a": 2, "b": 3})
    assert out == {"sum": 5}


async def test_a_sync_callable_that_returns_a_coroutine_has_it_awaited(
    python: PythonExecutor, modules: ModuleDir
) -> None:
    # An object whose __call__ is a coroutine function is not one itself (it runs in a
    # thread): the coroutine it returns is awaited on the loop, its result is the output.
    mod = modules.write(
        "class Double:\n"
        "    async def __call__(self, n):\n"
        "        return {'twice': 2 * n}\n"
        "double = Double()\n"
    )
    out = await python.execute(make_ctx(), {"function": f"{mod}:double"}, {"n": 4})
    assert out == {"twice": 8}


async def test_async_function_runs_on_the_loop(python: PythonExecutor, modules: ModuleDir) -> None:
    mod = modules.write(
        """
        import asyncio, threading
        async def where(x):
            await asyncio.sleep(0)
            return [x, threading.current_thread() is threading.main_thread()]
        """
    )
    assert await python.execute(make_ctx(), {"function": f"{mod}:where"}, {"x": 1}) == [1, True]


async def test_ctx_parameter_receives_the_step_context(
    python: PythonExecutor, modules: ModuleDir
) -> None:
    mod = modules.write(
        "def f(n, ctx):\n    return [n, ctx.run_id, ctx.attempt, ctx.idempotency_key]\n"
    )
    out = await python.execute(make_ctx(attempt=3), {"function": f"{mod}:f"}, {"n": 1})
    assert out == [1, "run-1", 3, "run-1:step"]


async def test_none_input_means_no_arguments(python: PythonExecutor, modules: ModuleDir) -> None:
    mod = modules.write("def f():\n    return 'ok'\n")
    assert await python.execute(make_ctx(), {"function": f"{mod}:f"}, None) == "ok"


async def test_dotted_qualname(python: PythonExecutor, modules: ModuleDir) -> None:
    mod = modules.write(
        """
        class Math:
            @staticmethod
            def double(x):
                return x * 2
        """
    )
    assert await python.execute(make_ctx(), {"function": f"{mod}:Math.double"}, {"x": 4}) == 8


async def test_stdlib_function_from_sys_path(python: PythonExecutor) -> None:
    out = await python.execute(make_ctx(), {"function": "json:dumps"}, {"obj": [1]})
    assert out == "[1]"


async def test_current_directory_comes_before_sys_path(
    python: PythonExecutor, modules: ModuleDir
) -> None:
    modules.write("def f():\n    return 'from cwd'\n", name="tf_cwd_first_probe")
    out = await python.execute(make_ctx(), {"function": "tf_cwd_first_probe:f"}, None)
    assert out == "from cwd"
    assert os.getcwd() in importlib.import_module("sys").path


async def test_registered_function_by_name(python: PythonExecutor) -> None:
    @register("tf_test_triple")
    def triple(x: int) -> int:
        return x * 3

    @register
    def tf_test_named(x: int) -> int:
        return x + 1

    try:
        assert await python.execute(make_ctx(), {"function": "tf_test_triple"}, {"x": 2}) == 6
        assert await python.execute(make_ctx(), {"function": "tf_test_named"}, {"x": 2}) == 3
        assert registered()["tf_test_triple"] is triple
    finally:
        unregister("tf_test_triple")
        unregister("tf_test_named")


def test_registering_another_function_under_a_taken_name_fails() -> None:
    register("tf_test_taken")(lambda: 1)
    try:
        with pytest.raises(ValueError, match="already registered"):

            @register("tf_test_taken")
            def other() -> int:
                return 2
    finally:
        unregister("tf_test_taken")


async def test_exception_keeps_its_type_bases_and_a_trimmed_traceback(
    python: PythonExecutor, modules: ModuleDir
) -> None:
    mod = modules.write(
        """
        class PaymentDown(ConnectionRefusedError):
            pass
        def deep(n):
            if n == 0:
                raise PaymentDown("gateway refused")
            return deep(n - 1)
        def charge():
            return deep(60)
        """
    )
    with pytest.raises(ConnectionError) as caught:
        await python.execute(make_ctx(), {"function": f"{mod}:charge"}, None)
    info = error_info_from_exception(caught.value)
    assert info.type == "PaymentDown"
    assert info.message == "gateway refused"
    assert info.retryable
    assert info.classes[:4] == (
        "PaymentDown",
        "ConnectionRefusedError",
        "ConnectionError",
        "OSError",
    )
    assert "Exception" not in info.classes and "object" not in info.classes
    assert info.matches(("ConnectionError",))
    assert info.details is not None
    assert "PaymentDown: gateway refused" in info.details
    assert info.details.count('File "') <= 20
    assert len(info.details) <= 8 * 1024 + 1


async def test_the_functions_own_timeout_error_is_not_a_step_timeout(
    python: PythonExecutor, modules: ModuleDir
) -> None:
    mod = modules.write("def f():\n    raise TimeoutError('upstream slow')\n")
    with pytest.raises(TimeoutError) as caught:
        await python.execute(make_ctx(), {"function": f"{mod}:f"}, None)
    assert not isinstance(caught.value, StepTimeout)
    assert error_info_from_exception(caught.value).type == "TimeoutError"


async def test_missing_module(python: PythonExecutor, modules: ModuleDir) -> None:
    with pytest.raises(FunctionNotFound) as caught:
        await python.execute(make_ctx(), {"function": "tf_no_such_module:f"}, None)
    assert not caught.value.retryable
    assert "tf_no_such_module" in caught.value.message
    assert str(modules.path) in caught.value.message
    assert "sys.path" in caught.value.message


async def test_missing_attribute(python: PythonExecutor, modules: ModuleDir) -> None:
    mod = modules.write("def f():\n    pass\n")
    with pytest.raises(FunctionNotFound) as caught:
        await python.execute(make_ctx(), {"function": f"{mod}:g"}, None)
    assert f"module {mod!r}" in caught.value.message
    assert "'g'" in caught.value.message


async def test_module_that_fails_to_import(python: PythonExecutor, modules: ModuleDir) -> None:
    mod = modules.write("import tf_missing_dependency_xyz\ndef f():\n    pass\n")
    with pytest.raises(FunctionNotFound) as caught:
        await python.execute(make_ctx(), {"function": f"{mod}:f"}, None)
    assert "tf_missing_dependency_xyz" in caught.value.message
    info = error_info_from_exception(caught.value)
    assert info.type == "FunctionNotFound"
    assert info.details is not None and "ModuleNotFoundError" in info.details


async def test_unknown_registered_name(python: PythonExecutor) -> None:
    with pytest.raises(FunctionNotFound, match="no python function registered as 'tf_nope'"):
        await python.execute(make_ctx(), {"function": "tf_nope"}, None)


async def test_input_must_be_a_mapping(python: PythonExecutor) -> None:
    with pytest.raises(InvalidStepInput, match="mapping of keyword arguments, got list"):
        await python.execute(make_ctx(), {"function": "json:dumps"}, [1, 2])


async def test_input_that_does_not_fit_the_signature(
    python: PythonExecutor, modules: ModuleDir
) -> None:
    mod = modules.write("def f(a):\n    return a\n")
    with pytest.raises(InvalidStepInput) as caught:
        await python.execute(make_ctx(), {"function": f"{mod}:f"}, {"a": 1, "b": 2})
    assert "'b'" in caught.value.message
    assert not caught.value.retryable


async def test_output_must_be_json(python: PythonExecutor, modules: ModuleDir) -> None:
    mod = modules.write("def f():\n    return {'x': object()}\ndef g():\n    return (1, 2)\n")
    with pytest.raises(OutputNotSerializable) as caught:
        await python.execute(make_ctx(), {"function": f"{mod}:f"}, None)
    assert not caught.value.retryable
    assert await python.execute(make_ctx(), {"function": f"{mod}:g"}, None) == [1, 2]


async def test_sync_functions_share_a_bounded_thread_pool(
    python: PythonExecutor, modules: ModuleDir
) -> None:
    mod = modules.write(
        "import threading\ndef who():\n    return threading.current_thread().name\n"
    )
    calls = [python.execute(make_ctx(), {"function": f"{mod}:who"}, None) for _ in range(12)]
    names = set(await asyncio.gather(*calls))
    assert len(names) <= 2
    assert all(name.startswith("tideflow-python") for name in names)


async def test_thread_mode_timeout(python: PythonExecutor, modules: ModuleDir) -> None:
    mod = modules.write(
        "import threading\nrelease = threading.Event()\ndef wait():\n    release.wait(10)\n"
    )
    started = time.monotonic()
    try:
        with pytest.raises(StepTimeout) as caught:
            await python.execute(make_ctx(timeout=0.3), {"function": f"{mod}:wait"}, None)
    finally:
        importlib.import_module(mod).release.set()
    assert time.monotonic() - started < 3
    assert "isolation: process" in caught.value.message


async def test_process_isolation_returns_the_result(
    python: PythonExecutor, modules: ModuleDir
) -> None:
    mod = modules.write(
        """
        import os
        def pid_and_sum(a, b, ctx):
            print("chatter on stdout must not break the reply")
            return {"pid": os.getpid(), "sum": a + b, "step": ctx.step_key}
        """
    )
    config = {"function": f"{mod}:pid_and_sum", "isolation": "process"}
    out = await python.execute(make_ctx(), config, {"a": 1, "b": 2})
    assert out["sum"] == 3
    assert out["step"] == "step"
    assert out["pid"] != os.getpid()


async def test_process_isolation_async_function(python: PythonExecutor, modules: ModuleDir) -> None:
    mod = modules.write(
        "import asyncio\nasync def f(x):\n    await asyncio.sleep(0)\n    return x\n"
    )
    config = {"function": f"{mod}:f", "isolation": "process"}
    assert await python.execute(make_ctx(), config, {"x": "async"}) == "async"


async def test_process_isolation_transfers_the_exception(
    python: PythonExecutor, modules: ModuleDir
) -> None:
    mod = modules.write(
        "class Declined(ValueError):\n    pass\ndef pay():\n    raise Declined('card declined')\n"
    )
    with pytest.raises(FunctionRaised) as caught:
        await python.execute(make_ctx(), {"function": f"{mod}:pay", "isolation": "process"}, None)
    info = error_info_from_exception(caught.value)
    assert info.type == "Declined"
    assert info.classes == ("Declined", "ValueError")
    assert info.message == "card declined"
    assert info.retryable
    assert info.details is not None and "in pay" in info.details


async def test_process_isolation_missing_function(
    python: PythonExecutor, modules: ModuleDir
) -> None:
    mod = modules.write("x = 1\n")
    with pytest.raises(FunctionRaised) as caught:
        await python.execute(make_ctx(), {"function": f"{mod}:nope", "isolation": "process"}, None)
    assert caught.value.type_name == "FunctionNotFound"
    assert not caught.value.retryable


async def test_cancelling_an_isolated_call_kills_the_child_and_its_children(
    python: PythonExecutor, modules: ModuleDir, tmp_path: Path
) -> None:
    pidfile = tmp_path / "pids"
    mod = modules.write(
        f"""
        import os, subprocess, time
        def stuck():
            sleeper = subprocess.Popen(["sleep", "60"])
            with open({str(pidfile)!r}, "w") as f:
                f.write(f"{{os.getpid()}} {{sleeper.pid}}")
            time.sleep(60)
        """
    )
    config = {"function": f"{mod}:stuck", "isolation": "process", "kill_grace": 0.5}
    task = asyncio.create_task(python.execute(make_ctx(timeout=None), config, None))
    assert await eventually(
        lambda: pidfile.exists() and len(pidfile.read_text().split()) == 2, 10.0
    )
    child, grandchild = map(int, pidfile.read_text().split())
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await eventually(lambda: not alive(child) and not alive(grandchild), 10.0)


async def test_process_isolation_timeout(python: PythonExecutor, modules: ModuleDir) -> None:
    mod = modules.write("import time\ndef stuck():\n    time.sleep(60)\n")
    config = {"function": f"{mod}:stuck", "isolation": "process", "timeout": 1.5}
    started = time.monotonic()
    with pytest.raises(StepTimeout) as caught:
        await python.execute(make_ctx(), config, None)
    assert time.monotonic() - started < 8
    assert "process was killed" in caught.value.message


async def test_process_that_dies_without_a_result(
    python: PythonExecutor, modules: ModuleDir
) -> None:
    mod = modules.write("import os\ndef crash():\n    os._exit(3)\n")
    with pytest.raises(IsolatedProcessDied) as caught:
        await python.execute(make_ctx(), {"function": f"{mod}:crash", "isolation": "process"}, None)
    assert "exited with code 3" in caught.value.message
    assert caught.value.retryable


async def test_process_isolation_of_a_registered_function(
    python: PythonExecutor, modules: ModuleDir
) -> None:
    mod = modules.write(
        """
        from tideflow.worker.executors.python import register
        @register("tf_test_iso_square")
        def square(x):
            return x * x
        """
    )
    modules.import_(mod)
    try:
        config = {"function": "tf_test_iso_square", "isolation": "process"}
        assert await python.execute(make_ctx(), config, {"x": 7}) == 49
    finally:
        unregister("tf_test_iso_square")


async def test_process_isolation_refuses_functions_of_main(python: PythonExecutor) -> None:
    def script_function() -> int:
        return 1

    script_function.__module__ = "__main__"
    script_function.__qualname__ = "script_function"
    register("tf_test_main_fn")(script_function)
    try:
        config = {"function": "tf_test_main_fn", "isolation": "process"}
        with pytest.raises(FunctionNotFound, match="__main__"):
            await python.execute(make_ctx(), config, None)
    finally:
        unregister("tf_test_main_fn")
