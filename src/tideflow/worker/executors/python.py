"""The ``python`` executor: call a function with the step's input as keyword arguments.

Async functions run on the worker's event loop; sync functions run in a bounded
pool of daemon threads owned by the executor (``threads``). ``isolation: process``
runs the function in a spawned child process instead, which is killed at the
timeout (a thread cannot be: a timed-out sync function keeps its thread until it
returns, but it is abandoned, named in a warning, and does not keep the process
alive). Whatever the function raises fails the step, ``SystemExit`` included.

An exception raised by the function propagates unchanged; the worker records it
with :func:`~tideflow.worker.executors.errorinfo.error_info_from_exception`
(type = class name, ``classes`` = its bases, ``details`` = trimmed traceback).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import logging
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, ClassVar

from tideflow.errors import StepTimeout
from tideflow.model.action_schemas import PYTHON_CONFIG_SCHEMA
from tideflow.worker.executors.base import Executor, StepContext
from tideflow.worker.executors.config import check_config, seconds
from tideflow.worker.executors.errorinfo import error_info_from_exception
from tideflow.worker.executors.errors import FunctionNotFound, FunctionRaised
from tideflow.worker.executors.functions import (
    bind_arguments,
    import_path,
    is_async,
    json_output,
    keyword_arguments,
    register,
    registered,
    registered_function,
    resolve_function,
    unregister,
)
from tideflow.worker.executors.isolated import DEFAULT_KILL_GRACE, run_isolated
from tideflow.worker.executors.threads import DaemonThreadPool, LoopCall

__all__ = ["PythonExecutor", "register", "registered", "unregister"]

DEFAULT_MAX_WORKERS = 16

log = logging.getLogger("tideflow.worker")
_NO_DEADLINE = contextlib.nullcontext()
_PLAIN = frozenset({type(None), dict, list, str, int, float, bool})
"""Result types that are never awaitable."""


class PythonExecutor(Executor):
    """Runs ``python`` steps."""

    name: ClassVar[str] = "python"
    config_schema: ClassVar[Mapping[str, Any]] = PYTHON_CONFIG_SCHEMA

    def __init__(self, *, max_workers: int = DEFAULT_MAX_WORKERS) -> None:
        self._max_workers = max_workers
        self._pool: DaemonThreadPool | None = None
        self._imported: dict[str, Callable[..., Any]] = {}

    def execute(
        self, ctx: StepContext, config: Mapping[str, Any], input: Any
    ) -> Coroutine[Any, Any, Any]:
        """The coroutine that runs the attempt. A plain function, not a coroutine of its
        own: a step without a timeout (most of them) then costs no coroutine between the
        attempt's and the one that calls the function, resumed twice on every attempt. A
        config the schema refuses raises here, at the call."""
        cfg = check_config(self.name, self.config_schema, config)
        spec: str = cfg["function"]
        kwargs = keyword_arguments(input)
        timeout = seconds(cfg.get("timeout")) or ctx.timeout
        if timeout is None and cfg.get("isolation") != "process":
            return self._run_here(spec, kwargs, ctx)
        return self._bounded(spec, kwargs, ctx, cfg, timeout)

    async def _bounded(
        self,
        spec: str,
        kwargs: dict[str, Any],
        ctx: StepContext,
        cfg: Mapping[str, Any],
        timeout: float | None,
    ) -> Any:
        """An attempt with a timeout, or in a process of its own (``isolation: process``)."""
        isolation = cfg.get("isolation")
        deadline = None if timeout is None else asyncio.timeout(timeout)
        try:
            async with deadline or _NO_DEADLINE:
                if isolation == "process":
                    grace = float(cfg.get("kill_grace", DEFAULT_KILL_GRACE))
                    return await run_isolated(_child_spec(spec), kwargs, ctx, grace)
                return await self._run_here(spec, kwargs, ctx)
        except TimeoutError:
            if deadline is None or not deadline.expired():
                raise  # the function's own TimeoutError
            raise StepTimeout(_timeout_message(spec, timeout, isolation)) from None

    async def aclose(self) -> None:
        if self._pool is not None:
            pool, self._pool = self._pool, None
            # Not waiting: an abandoned sync function may hold its thread for a long time.
            pool.shutdown(wait=False, cancel_futures=True)
            for thread in pool.abandoned():
                log.warning("python thread %s is still running an abandoned function", thread)

    @property
    def pool(self) -> DaemonThreadPool:
        """The thread pool of sync functions, created on first use."""
        if self._pool is None:
            self._pool = DaemonThreadPool(self._max_workers, thread_name_prefix="tideflow-python")
        return self._pool

    async def _import(self, spec: str) -> Callable[..., Any]:
        # Importing runs module code of unknown cost: keep it off the event loop.
        fn = await asyncio.get_running_loop().run_in_executor(self.pool, resolve_function, spec)
        self._imported[spec] = fn
        return fn

    async def _run_here(self, spec: str, kwargs: dict[str, Any], ctx: StepContext) -> Any:
        """Call the function on this loop (async) or in a pool thread (sync); its output
        as JSON."""
        fn = registered_function(spec) or self._imported.get(spec) or await self._import(spec)
        kwargs = bind_arguments(fn, kwargs, ctx, spec)
        try:
            if is_async(fn):
                return json_output(await fn(**kwargs), spec)
            # In a pool thread, in a copy of this context (awaited here, not in a coroutine
            # of its own: this is every sync step's path).
            pool = self.pool
            context = contextvars.copy_context()
            call = pool.call(functools.partial(context.run, _contained, fn, kwargs))
            try:
                result = await call.future
            except asyncio.CancelledError:
                _abandon(pool, call, ctx, spec)
                raise
            # a sync callable that returned a coroutine (plain data, the usual result, is
            # told apart by its type: isawaitable is a Python call of several checks)
            if type(result) not in _PLAIN and inspect.isawaitable(result):
                result = await result
        except (Exception, asyncio.CancelledError):
            raise
        except BaseException as exc:  # SystemExit, KeyboardInterrupt, ... from an async function
            raise escaped(exc) from None
        return json_output(result, spec)


def _abandon(pool: DaemonThreadPool, call: LoopCall[Any], ctx: StepContext, spec: str) -> None:
    """The attempt ended while its function runs: give up on the call (its thread, if it
    had started, leaves the pool)."""
    thread = pool.abandon(call)
    if thread is not None:
        log.warning(
            "run %s step %s: python function %r is still running in thread %s after "
            "its attempt ended; the thread is abandoned (it does not keep the process "
            "alive; use isolation: process to have such a function killed)",
            ctx.run_id,
            ctx.step_id,
            spec,
            thread,
        )


def _contained(fn: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
    """Call ``fn`` in a pool thread; what is not an Exception (``sys.exit(3)``) must not
    reach the event loop, where it would stop the whole engine: it fails the step."""
    try:
        return fn(**kwargs)
    except Exception:
        raise
    except BaseException as exc:
        raise escaped(exc) from None


def escaped(exc: BaseException) -> FunctionRaised:
    """A ``BaseException`` raised by user code as a step error of the same type name,
    as ``isolation: process`` reports it (``SystemExit`` with message ``3``)."""
    info = error_info_from_exception(exc)
    return FunctionRaised(
        info.message,
        type_name=info.type,
        retryable=True,
        classes=info.classes,
        details=info.details,
    )


def _timeout_message(spec: str, timeout: float | None, isolation: str | None) -> str:
    text = f"python function {spec!r} did not return within {timeout:g}s"
    if isolation == "process":
        return text + "; its process was killed"
    return text + " (its thread runs on until it returns; use isolation: process to kill it)"


def _child_spec(spec: str) -> str:
    """What the child process resolves: it imports the module itself (and has no registry)."""
    fn = None if ":" in spec else registered_function(spec)
    if fn is None:
        return spec
    path = import_path(fn)
    if path.startswith("__main__:"):
        raise FunctionNotFound(
            f"function {spec!r} is defined in the __main__ script, which an isolated process "
            "cannot import; move it into a module"
        )
    return path
