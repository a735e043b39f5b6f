"""``isolation: process``: run a python step's function in a killable child process.

One fresh interpreter per call (``sys.executable``, never a fork: the worker's
event loop, threads and connections must not be copied, and unlike
multiprocessing's spawn the caller's ``__main__`` is not re-imported). The child
runs in its own session, so a timeout or a cancellation kills it together with
anything it started.

Protocol: the request is JSON on the child's stdin; the reply is JSON on its
stdout, ``["ok", output]`` or ``["error", {type, message, retryable, classes,
details}]``. A child that exits without a complete reply is reported as
``IsolatedProcessDied``.

The function's own output: for an attempt of a worker pool (worker/capture.py), its
stdout, stderr and ``logging`` records go to three temporary files, whose tails are the
attempt's output once the child ended (killed at a timeout included); otherwise its
prints go to stderr, which the child shares with the worker.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sys
import tempfile
from typing import Any

import orjson

from tideflow.worker.capture import STREAMS, StepOutput, current
from tideflow.worker.executors.base import StepContext
from tideflow.worker.executors.errors import (
    FunctionRaised,
    InvalidStepInput,
    IsolatedProcessDied,
)
from tideflow.worker.executors.processes import close_transport, spawn_group, terminate_group

DEFAULT_KILL_GRACE = 2.0

# Runs in the child before anything of tideflow is importable: adopt the worker's
# sys.path, then hand over to isolated_child.
BOOTSTRAP = (
    "import json, sys\n"
    "request = json.loads(sys.stdin.buffer.read())\n"
    "sys.path[:] = request['sys_path']\n"
    "from tideflow.worker.executors.isolated_child import main\n"
    "main(request)\n"
)


async def run_isolated(
    spec: str,
    kwargs: dict[str, Any],
    ctx: StepContext,
    kill_grace: float = DEFAULT_KILL_GRACE,
) -> Any:
    """Call ``spec(**kwargs)`` in a child process and return its JSON output.

    Cancelling the call (e.g. by an ``asyncio.timeout`` around it) kills the child
    and everything it started.
    """
    written = current()
    files = None if written is None else _Files()
    request = _request(spec, kwargs, ctx, files)
    try:
        proc = await spawn_group(
            sys.executable,
            "-c",
            BOOTSTRAP,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            **({} if files is None else files.spawn_options()),
        )
        finished = False
        try:
            reply, _ = await proc.communicate(request)
            finished = True
        finally:
            if not finished:
                await asyncio.shield(terminate_group(proc, kill_grace))
            close_transport(proc)
    finally:
        if files is not None and written is not None:
            files.close(written)
    return _result(reply, spec, proc.returncode)


class _Files:
    """The temporary files an isolated function writes to: stdout, stderr, log records."""

    def __init__(self) -> None:
        self.streams = {name: tempfile.TemporaryFile() for name in STREAMS}  # noqa: SIM115 (closed by close)

    def spawn_options(self) -> dict[str, Any]:
        return {
            "stderr": self.streams["stderr"],
            "pass_fds": (self.streams["stdout"].fileno(), self.streams["log"].fileno()),
        }

    def fds(self) -> dict[str, int]:
        return {"out_fd": self.streams["stdout"].fileno(), "log_fd": self.streams["log"].fileno()}

    def close(self, written: StepOutput) -> None:
        """Add the tail of each file to ``written`` (the rest counted as dropped); close."""
        for name, file in self.streams.items():
            with file:
                size = file.seek(0, os.SEEK_END)
                start = max(0, size - written.limit)
                file.seek(start)
                written.add(name, file.read(), dropped=start)


def _request(
    spec: str, kwargs: dict[str, Any], ctx: StepContext, files: _Files | None = None
) -> bytes:
    fields = dataclasses.asdict(ctx)
    fields["extra"] = dict(ctx.extra)
    message: dict[str, Any] = {
        "spec": spec,
        "kwargs": kwargs,
        "ctx": fields,
        "sys_path": [os.getcwd(), *sys.path],
    }
    if files is not None:
        message.update(files.fds())
    try:
        return orjson.dumps(message, default=repr)
    except TypeError as exc:
        raise InvalidStepInput(f"step input cannot be sent to an isolated process: {exc}") from exc


def _result(reply: bytes, spec: str, returncode: int | None) -> Any:
    try:
        kind, payload = orjson.loads(reply)
    except (orjson.JSONDecodeError, ValueError, TypeError):
        # Nothing or half a reply: the child died before or while replying.
        raise IsolatedProcessDied(
            f"the process running python function {spec!r} exited with code {returncode} "
            "without a result"
        ) from None
    if kind == "ok":
        return payload
    raise FunctionRaised(
        payload["message"],
        type_name=payload["type"],
        retryable=payload["retryable"],
        classes=tuple(payload["classes"]),
        details=payload["details"],
    )
