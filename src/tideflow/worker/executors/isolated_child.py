"""The child side of ``isolation: process`` (see ``isolated``): call, reply, exit.

Kept light: the child pays for importing this module on every call.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import sys
from typing import Any

import orjson

from tideflow.worker.capture import LOG_FORMAT
from tideflow.worker.executors.base import StepContext
from tideflow.worker.executors.errorinfo import error_info_from_exception
from tideflow.worker.executors.functions import bind_arguments, dump_output, resolve_function


def main(request: dict[str, Any]) -> None:
    """Run the requested call and write the reply to the original stdout."""
    reply = os.fdopen(os.dup(1), "wb")
    out_fd = request.get("out_fd")  # an attempt's output file (isolated.py), or stderr
    os.dup2(2 if out_fd is None else out_fd, 1)  # prints must not corrupt the reply
    log_fd = request.get("log_fd")
    if log_fd is not None:
        handler = logging.StreamHandler(os.fdopen(log_fd, "w", encoding="utf-8"))
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        logging.getLogger().addHandler(handler)
    try:
        message = b'["ok",' + _call(request) + b"]"
    except BaseException as exc:
        message = _error_reply(exc)
    sys.stdout.flush()
    sys.stderr.flush()
    with reply:
        reply.write(message)


def _call(request: dict[str, Any]) -> bytes:
    spec: str = request["spec"]
    ctx = StepContext(**request["ctx"])
    fn = resolve_function(spec)
    result = fn(**bind_arguments(fn, request["kwargs"], ctx, spec))
    if inspect.isawaitable(result):
        result = asyncio.run(_await(result))
    return dump_output(result, spec)


async def _await(awaitable: Any) -> Any:
    return await awaitable


def _error_reply(exc: BaseException) -> bytes:
    info = error_info_from_exception(exc)
    payload = {
        "type": info.type,
        "message": info.message,
        "retryable": info.retryable,
        "classes": list(info.classes),
        "details": info.details,
    }
    return orjson.dumps(["error", payload])
