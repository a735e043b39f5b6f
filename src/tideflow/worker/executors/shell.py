"""The ``shell`` executor: run a program with an argv list, no shell involved.

The child runs in its own session (process group) so that a timeout or a
cancellation kills everything it started. Its environment is an allow-list of
the worker's (secrets in the worker's environment never reach it) plus the
step's declared ``env``. Output is captured up to a cap; the rest is read and
discarded so a chatty program can neither block nor exhaust memory.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import orjson

from tideflow.errors import StepTimeout
from tideflow.model.action_schemas import SHELL_CONFIG_SCHEMA
from tideflow.worker.capture import StepOutput, current
from tideflow.worker.executors.base import Executor, StepContext
from tideflow.worker.executors.config import check_config, seconds
from tideflow.worker.executors.errors import (
    InvalidStepConfig,
    InvalidStepInput,
    ShellCommandFailed,
    ShellCommandNotFound,
)
from tideflow.worker.executors.processes import (
    close_transport,
    signal_group,
    spawn_group,
    terminate_group,
)

DEFAULT_ENV_ALLOW = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR")
DEFAULT_MAX_OUTPUT_BYTES = 1024 * 1024
DEFAULT_KILL_GRACE = 2.0
ERROR_TAIL_BYTES = 2048
READ_CHUNK = 64 * 1024


@dataclass(slots=True)
class _Capture:
    """The head of a stream up to a cap, the count of bytes dropped, and a short tail."""

    cap: int
    head: bytearray = field(default_factory=bytearray)
    tail: bytes = b""
    dropped: int = 0

    def add(self, chunk: bytes) -> None:
        room = max(0, self.cap - len(self.head))
        self.head += chunk[:room]
        self.dropped += max(0, len(chunk) - room)
        self.tail = (self.tail + chunk)[-ERROR_TAIL_BYTES:]

    def text(self) -> str:
        text = self.head.decode("utf-8", errors="replace")
        if self.dropped:
            text += f"\n…[truncated {self.dropped} bytes]"
        return text

    def tail_text(self) -> str:
        return self.tail.decode("utf-8", errors="replace")


@dataclass(frozen=True, slots=True)
class _Command:
    argv: list[str]
    program: str
    env: dict[str, str]
    cwd: str | None
    stdin: bytes | None
    timeout: float | None
    max_output: int
    kill_grace: float


class ShellExecutor(Executor):
    """Runs ``shell`` steps."""

    name: ClassVar[str] = "shell"
    config_schema: ClassVar[Mapping[str, Any]] = SHELL_CONFIG_SCHEMA

    def __init__(self, *, environ: Mapping[str, str] | None = None) -> None:
        self._environ = environ

    async def execute(self, ctx: StepContext, config: Mapping[str, Any], input: Any) -> Any:
        command = self._command(ctx, config, input)
        proc = await _spawn(command)
        out, err = _Capture(command.max_output), _Capture(command.max_output)
        code = await _supervise(proc, command, out, err)
        if code != 0:
            raise ShellCommandFailed(
                _failure_message(command.argv, code, err),
                exit_code=code,
                stdout=out.text(),
                stderr=err.text(),
            )
        return {"exit_code": code, "stdout": out.text(), "stderr": err.text()}

    def _command(self, ctx: StepContext, config: Any, input: Any) -> _Command:
        if isinstance(config, Mapping) and isinstance(config.get("command"), str):
            raise InvalidStepConfig(
                "shell 'command' must be a list of arguments, not a string: use a list such "
                "as ['ls', '-l'] (no shell is involved; for shell syntax use ['sh', '-c', '…'])"
            )
        cfg = check_config(self.name, self.config_schema, config)
        argv = [str(arg) for arg in cfg["command"]]
        env = child_env(os.environ if self._environ is None else self._environ, cfg)
        cwd = _checked_cwd(cfg.get("cwd"))
        return _Command(
            argv=argv,
            program=resolve_program(argv[0], env, cwd),
            env=env,
            cwd=cwd,
            stdin=_stdin_bytes(cfg.get("stdin"), input),
            timeout=seconds(cfg.get("timeout")) or ctx.timeout,
            max_output=int(cfg.get("max_output_bytes", DEFAULT_MAX_OUTPUT_BYTES)),
            kill_grace=float(cfg.get("kill_grace", DEFAULT_KILL_GRACE)),
        )


def child_env(parent: Mapping[str, str], cfg: Mapping[str, Any]) -> dict[str, str]:
    """The allow-listed part of ``parent`` plus the step's declared ``env``."""
    allowed: Iterable[str] = (*DEFAULT_ENV_ALLOW, *cfg.get("env_allow", ()))
    env = {name: parent[name] for name in allowed if name in parent}
    for name, value in (cfg.get("env") or {}).items():
        env[name] = ("true" if value else "false") if isinstance(value, bool) else str(value)
    return env


def resolve_program(name: str, env: Mapping[str, str], cwd: str | None) -> str:
    """The path of the program to execute, or ``ShellCommandNotFound`` naming where it looked."""
    if os.sep in name:
        path = os.path.normpath(os.path.join(cwd or os.getcwd(), name))
        if not os.path.isfile(path):
            raise ShellCommandNotFound(f"program {name!r} not found: no file at {path}")
        if not os.access(path, os.X_OK):
            raise ShellCommandNotFound(f"program {name!r} at {path} is not executable")
        return path
    search = env.get("PATH", os.defpath)
    found = shutil.which(name, path=search)
    if found is None:
        raise ShellCommandNotFound(f"program {name!r} not found in PATH={search}")
    return found


def _checked_cwd(cwd: str | None) -> str | None:
    if cwd is not None and not os.path.isdir(cwd):
        raise InvalidStepConfig(f"shell 'cwd' {cwd!r} is not a directory")
    return cwd


def _stdin_bytes(mode: str | None, input: Any) -> bytes | None:
    if mode != "json":
        return None
    try:
        return orjson.dumps(input)
    except TypeError as exc:
        raise InvalidStepInput(f"step input cannot be sent as JSON on stdin: {exc}") from exc


async def _spawn(command: _Command) -> asyncio.subprocess.Process:
    try:
        return await spawn_group(  # its own process group: killpg reaches grandchildren
            *command.argv,
            executable=command.program,
            stdin=asyncio.subprocess.DEVNULL if command.stdin is None else asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=command.env,
            cwd=command.cwd,
        )
    except (FileNotFoundError, PermissionError, NotADirectoryError) as exc:
        raise ShellCommandNotFound(f"cannot execute {command.program!r}: {exc}") from exc


async def _supervise(
    proc: asyncio.subprocess.Process, command: _Command, out: _Capture, err: _Capture
) -> int:
    """Wait for the command and its output; kill its process group on timeout or cancel."""
    assert proc.stdout is not None
    assert proc.stderr is not None
    written = current()  # the attempt's output (worker/capture.py): the streams too
    readers = [
        asyncio.create_task(_drain(proc.stdout, out, written, "stdout")),
        asyncio.create_task(_drain(proc.stderr, err, written, "stderr")),
    ]
    finished = False
    try:
        async with asyncio.timeout(command.timeout):
            await _feed(proc, command.stdin)
            code = await proc.wait()
            await asyncio.gather(*readers)
        finished = True
        return code
    except TimeoutError:
        await terminate_group(proc, command.kill_grace)
        await _settle(readers, grace=1.0)
        raise StepTimeout(_timeout_message(command, err)) from None
    finally:
        if not finished:  # cancelled, or failed: no grace, but reap what was killed
            signal_group(proc.pid, signal.SIGKILL)
            await asyncio.shield(terminate_group(proc, 0))
            await _settle(readers, grace=0)
        close_transport(proc)


async def _drain(
    stream: asyncio.StreamReader, capture: _Capture, written: StepOutput | None, name: str
) -> None:
    while chunk := await stream.read(READ_CHUNK):
        capture.add(chunk)
        if written is not None:
            written.add(name, chunk)


async def _feed(proc: asyncio.subprocess.Process, data: bytes | None) -> None:
    if data is None or proc.stdin is None:
        return
    try:
        proc.stdin.write(data)
        await proc.stdin.drain()
    except (BrokenPipeError, ConnectionResetError):
        pass  # the program exited or closed stdin without reading it all: its exit code tells
    finally:
        proc.stdin.close()


async def _settle(tasks: list[asyncio.Task[None]], grace: float) -> None:
    """Let readers finish (their pipes close once the group is dead), then cancel the rest."""
    if grace > 0:
        await asyncio.wait(tasks, timeout=grace)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _failure_message(argv: list[str], code: int, err: _Capture) -> str:
    if code < 0:
        try:
            what = f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            what = f"was killed by signal {-code}"
    else:
        what = f"exited with code {code}"
    tail = err.tail_text().strip()
    text = f"command {argv[0]!r} {what}"
    return f"{text}; stderr (tail):\n{tail}" if tail else f"{text} (no stderr)"


def _timeout_message(command: _Command, err: _Capture) -> str:
    text = (
        f"command {command.argv[0]!r} did not finish within {command.timeout:g}s; "
        "its process group was killed"
    )
    tail = err.tail_text().strip()
    return f"{text}; stderr (tail):\n{tail}" if tail else text
