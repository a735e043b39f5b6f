"""A process of the API's compiler pool (api/compiling.py): compiles the definitions that
requests carry, one at a time, so that compiling never holds the server's event loop.

Run as ``python -m tideflow.api.compile_worker``. It reads requests on stdin and writes
answers to what was stdout, each a frame: 8 bytes of length (big-endian), then a pickle.
Once it has compiled a first definition (so that the imports and caches the first compile
needs are paid before any request), it says ``("ready", pid)``. A request is
``(mode, definition, action_types)``: the definition as the API parsed it
(a mapping, or YAML text), never a path; ``mode`` is ``"compile"`` (answer the `Plan`)
or ``"summary"`` (answer `summary_of` it: what ``POST /definitions/validate`` shows). An
answer is ``("ok", value)``, ``("invalid", DefinitionError)`` or ``("failed", text)``
(a fault of the compiler, logged by the server). It exits at the end of its stdin.
Anything a library prints goes to stderr: stdout carries frames only. It ignores SIGINT
(a Ctrl-C meant for the server): the server kills it when it stops.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
from collections.abc import Mapping
from typing import Any, BinaryIO

from tideflow.dsl.compiler import compile_definition
from tideflow.errors import DefinitionError
from tideflow.model.plan import Plan

__all__ = ["HEADER", "main", "summary_of"]

HEADER = 8
"""Bytes of a frame's length."""


def summary_of(plan: Plan) -> dict[str, Any]:
    """What validating a definition answers: name, version, hash and step ids."""
    return {
        "name": plan.name,
        "version": plan.version,
        "hash": plan.hash,
        "steps": list(plan.specs),
    }


def _answer(request: tuple[str, Any, Any]) -> tuple[str, Any]:
    mode, definition, action_types = request
    if not isinstance(definition, Mapping) and not (
        isinstance(definition, str) and "\n" in definition  # text, never a file's name
    ):
        return "failed", f"not a definition the API parses: {type(definition).__name__}"
    try:
        plan = compile_definition(definition, action_types=action_types)
    except DefinitionError as exc:
        return "invalid", exc
    except Exception as exc:  # a fault of the compiler: the server logs it (a 500)
        return "failed", f"{type(exc).__name__}: {exc}"
    return "ok", plan if mode == "compile" else summary_of(plan)


def _read(source: BinaryIO, size: int) -> bytes | None:
    data = source.read(size)
    return data if len(data) == size else None


def serve(source: BinaryIO, sink: BinaryIO) -> None:
    """Answer requests from ``source`` on ``sink`` until ``source`` ends."""
    while (header := _read(source, HEADER)) is not None:
        body = _read(source, int.from_bytes(header, "big"))
        if body is None:
            return
        _send(sink, _answer(pickle.loads(body)))


def _send(sink: BinaryIO, answer: tuple[str, Any]) -> None:
    try:
        data = pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # the answer does not pickle: a fault of the compiler
        data = pickle.dumps(("failed", f"the answer does not pickle: {exc}"))
    sink.write(len(data).to_bytes(HEADER, "big") + data)
    sink.flush()


WARM_UP = "name: warm-up\nversion: '1'\ninput: {type: object}\nsteps: [{id: a, type: noop}]\n"


def main() -> None:
    # Ctrl-C reaches the whole process group: the server stops its compilers itself
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sink = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # print() from anywhere lands on stderr, not in a frame
    compile_definition(WARM_UP)  # what the first compile imports and caches, paid now
    _send(sink, ("ready", os.getpid()))
    serve(sys.stdin.buffer, sink)


if __name__ == "__main__":
    main()
