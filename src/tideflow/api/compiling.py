"""Compiling the definitions that requests carry, off the event loop (docs/security.md).

Compiling a definition is CPU work in Python: a 1 MB one takes seconds, and on the
server's event loop (or in a thread, under the GIL) every other request would wait for
it, ``/health`` included. So ``POST /definitions`` and ``POST /definitions/validate``
compile in a `CompilerPool`: ``workers`` processes started with the server and kept warm
(api/compile_worker.py), each compiling one definition at a time. The bounds:

- size: the request body limit (``--max-body``, 1 MiB by default) is the largest
  definition a request can carry;
- time: a compile that takes longer than ``timeout`` seconds is stopped (its process
  killed, a fresh one started in its place) and answered with a 422 naming the limit;
  a request that finds no free process within ``timeout`` seconds is a 503
  (`CompilerUnavailable`), as is one whose process died under it.

Set with ``TIDEFLOW_COMPILE_WORKERS`` (2) and ``TIDEFLOW_COMPILE_TIMEOUT`` (30 s).

A plan comes back pickled: from a process of this server running tideflow's own
compiler, never from the request. Its expressions are rebuilt from their source on first
use (dsl/expr.py), so taking it in costs little; the unpickling runs in a thread with
the garbage collector paused, so that a full collection over a large plan's objects does
not hold the loop either.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import math
import pickle
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from tideflow.api.compile_worker import HEADER, summary_of
from tideflow.client import Client
from tideflow.errors import CompilerUnavailable, DefinitionError, Diagnostic, TideflowError
from tideflow.model.plan import Plan

__all__ = [
    "DEFAULT_TIMEOUT",
    "DEFAULT_WORKERS",
    "CompilerPool",
    "DefinitionCompiler",
    "InProcess",
    "compile_limits",
]

log = logging.getLogger("tideflow.api")

DEFAULT_WORKERS = 2
DEFAULT_TIMEOUT = 30.0


class DefinitionCompiler(Protocol):
    """How the API compiles a definition a request carries (a mapping or YAML text)."""

    async def compile(self, definition: Any) -> Plan:
        """The plan; ``DefinitionError`` lists every problem."""
        ...

    async def summary(self, definition: Any) -> dict[str, Any]:
        """Name, version, hash and step ids (`summary_of`), for validating only."""
        ...


class InProcess:
    """Compiles on the caller's loop, through the client (an app embedded in a program
    that chose so, and the tests of the API); the served API uses a `CompilerPool`."""

    def __init__(self, client: Client) -> None:
        self._client = client

    async def compile(self, definition: Any) -> Plan:
        return self._client.compile(definition)

    async def summary(self, definition: Any) -> dict[str, Any]:
        return summary_of(self._client.compile(definition))


class _Worker:
    """One compiler process and its pipes."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    async def ready(self) -> None:
        """Wait for the process to say it is ready (it has compiled a first definition)."""
        assert self.process.stdout is not None
        size = int.from_bytes(await self.process.stdout.readexactly(HEADER), "big")
        status, _ = pickle.loads(await self.process.stdout.readexactly(size))
        if status != "ready":
            raise TideflowError(f"a definition compiler process said {status!r}, not ready")

    async def ask(self, request: bytes) -> bytes:
        stdin, stdout = self.process.stdin, self.process.stdout
        assert stdin is not None and stdout is not None
        stdin.write(len(request).to_bytes(HEADER, "big") + request)
        await stdin.drain()
        size = int.from_bytes(await stdout.readexactly(HEADER), "big")
        return await stdout.readexactly(size)

    async def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        await self.process.wait()


class CompilerPool:
    """``workers`` compiler processes kept warm; ``timeout`` seconds per compile, ``wait``
    seconds to wait for a free process (default: ``timeout``). Use as ``async with
    CompilerPool(client.action_types):``, or `start` and `close`. ``action_types`` gives
    the executors' config schemas that action steps are checked against
    (`Client.action_types`). A process that dies is replaced when a request finds it so
    (that request is a 503)."""

    def __init__(
        self,
        action_types: Callable[[], Mapping[str, Any]],
        *,
        workers: int = DEFAULT_WORKERS,
        timeout: float = DEFAULT_TIMEOUT,
        wait: float | None = None,
    ) -> None:
        if workers < 1:
            raise ValueError(f"a compiler pool needs at least 1 process, got {workers}")
        if not timeout > 0 or math.isinf(timeout):
            raise ValueError(f"the compile timeout must be a positive number, got {timeout}")
        self._action_types = action_types
        self.workers = workers
        self.timeout = timeout
        self.wait = timeout if wait is None else wait
        self._idle: asyncio.Queue[_Worker] = asyncio.Queue()
        self._all: set[_Worker] = set()
        self._starting: set[asyncio.Task[None]] = set()
        self._closed = False
        self._started_once = False

    @classmethod
    def from_environment(
        cls, action_types: Callable[[], Mapping[str, Any]], env: Mapping[str, str]
    ) -> CompilerPool:
        """Sized by the environment (`compile_limits`)."""
        workers, timeout = compile_limits(env)
        return cls(action_types, workers=workers, timeout=timeout)

    async def __aenter__(self) -> CompilerPool:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Start the processes (each is ready once it has imported the compiler); a pool
        started already is left as it is."""
        if not self._started_once:
            self._started_once = True
            for _ in range(self.workers):
                self._spawn()

    def _spawn(self) -> None:
        if not self._closed:
            task = asyncio.create_task(self._start_one(), name="tideflow-compiler-start")
            self._starting.add(task)
            task.add_done_callback(self._started)

    def _started(self, task: asyncio.Task[None]) -> None:
        self._starting.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("a definition compiler process did not start: %s", task.exception())

    async def _start_one(self) -> None:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tideflow.api.compile_worker",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        worker = _Worker(process)
        self._all.add(worker)
        try:
            await worker.ready()
        except BaseException:
            await self._retire(worker)
            raise
        if self._closed:
            await self._retire(worker)
        else:
            self._idle.put_nowait(worker)

    async def ready(self) -> None:
        """Wait for the processes being started (a request would wait for one anyway)."""
        await asyncio.gather(*self._starting, return_exceptions=True)

    def pids(self) -> list[int]:
        """The process ids of the pool's live processes."""
        return sorted(w.process.pid for w in self._all)

    async def close(self) -> None:
        """Stop every process (a compile in progress is answered 503)."""
        self._closed = True
        for task in list(self._starting):
            task.cancel()
        await asyncio.gather(*self._starting, return_exceptions=True)
        await asyncio.gather(*(self._retire(w) for w in list(self._all)))

    async def _retire(self, worker: _Worker) -> None:
        self._all.discard(worker)
        await worker.stop()

    async def compile(self, definition: Any) -> Plan:
        plan = await self._ask("compile", definition)
        assert isinstance(plan, Plan)
        return plan

    async def summary(self, definition: Any) -> dict[str, Any]:
        fields = await self._ask("summary", definition)
        assert isinstance(fields, dict)
        return fields

    async def _ask(self, mode: str, definition: Any) -> Any:
        request = pickle.dumps((mode, definition, dict(self._action_types())), protocol=5)
        worker = await self._free_worker()
        try:
            async with asyncio.timeout(self.timeout):
                answer = await worker.ask(request)
        except TimeoutError:
            await self._replace(worker)
            raise _too_slow(self.timeout) from None
        except (OSError, asyncio.IncompleteReadError) as exc:
            log.error("a definition compiler process died while compiling: %s", exc)
            await self._replace(worker)
            raise CompilerUnavailable() from None
        except BaseException:  # cancelled mid-exchange: the pipes are out of step
            await self._replace(worker)
            raise
        self._idle.put_nowait(worker)
        return _outcome(await _unpickled(answer))

    async def _free_worker(self) -> _Worker:
        if self._closed:
            raise CompilerUnavailable()
        try:
            async with asyncio.timeout(self.wait):
                return await self._idle.get()
        except TimeoutError:
            raise CompilerUnavailable() from None

    async def _replace(self, worker: _Worker) -> None:
        await self._retire(worker)
        self._spawn()


def compile_limits(env: Mapping[str, str]) -> tuple[int, float]:
    """``(workers, timeout)`` from ``TIDEFLOW_COMPILE_WORKERS`` and
    ``TIDEFLOW_COMPILE_TIMEOUT`` (seconds), or the defaults; ``ValueError`` saying which
    is wrong."""
    workers = _number(env, "TIDEFLOW_COMPILE_WORKERS", DEFAULT_WORKERS, int)
    timeout = _number(env, "TIDEFLOW_COMPILE_TIMEOUT", DEFAULT_TIMEOUT, float)
    return int(workers), timeout


def _too_slow(timeout: float) -> DefinitionError:
    return DefinitionError(
        [
            Diagnostic(
                message=f"compiling the definition took longer than {timeout:g} s, the "
                "server's limit",
                hint="make it smaller (move parts into subflows), or raise "
                "TIDEFLOW_COMPILE_TIMEOUT on the server",
            )
        ]
    )


def _outcome(answer: tuple[str, Any]) -> Any:
    status, value = answer
    if status == "ok":
        return value
    if status == "invalid" and isinstance(value, DefinitionError):
        raise value
    raise TideflowError(f"the definition compiler failed: {value}")


_paused = 0
_collecting = True
"""Whether the collector ran before the first of the unpicklings in progress paused it."""
_pause_lock = threading.Lock()


async def _unpickled(data: bytes) -> Any:
    """``pickle.loads`` in a thread, with the garbage collector paused meanwhile: a large
    plan is hundreds of thousands of objects, and collections over them while they are
    made would hold the loop for seconds."""
    global _paused, _collecting
    with _pause_lock:
        if _paused == 0:
            _collecting = gc.isenabled()
        _paused += 1
        gc.disable()
    try:
        return await asyncio.to_thread(pickle.loads, data)
    finally:
        with _pause_lock:
            _paused -= 1
            if _paused == 0 and _collecting:
                gc.enable()


def _number(env: Mapping[str, str], name: str, default: float, kind: type) -> float:
    text = env.get(name, "").strip()
    if not text:
        return default
    try:
        value = kind(text)
    except ValueError:
        value = None
    if value is None or not value > 0 or (kind is float and math.isinf(value)):
        raise ValueError(
            f"{name}={text!r}: give a positive {'whole ' if kind is int else ''}number"
        )
    return float(value)
