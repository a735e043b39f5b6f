"""What a step writes while it runs: its stdout, its stderr and its ``logging`` records,
kept per attempt and recorded with the attempt's outcome (``TaskCompleted.logs`` /
``TaskFailed.logs``), for ``tideflow runs logs``, ``GET /runs/{id}/logs`` and the UI.

Each attempt of a worker pool has a `StepOutput` in the context variable ``CURRENT``
(the pool sets it in the attempt's asyncio task; a sync python function's pool thread
runs in a copy of that context, an async one on the task itself). While a pool runs,
``sys.stdout`` and ``sys.stderr`` are `_Routed` proxies (`install`): a write made in an
attempt's context is added to that attempt's `StepOutput`, and every write goes on to the
stream the proxy replaced, as before (the CLI points ``sys.stdout`` at stderr while steps
run: never onto a command's own stdout). A handler on the root logger adds the ``logging`` records (those
the logger lets through: WARNING and up unless a level is configured lower), leaving the
engine's own loggers (``tideflow.*``) out. An ``isolation: process`` child and a shell
step write to the descriptors the executor gives them; the executor adds what they wrote
(`StepOutput.add`).

Each stream keeps its last `LIMIT` bytes per attempt; what was dropped before is counted
(``truncated``: bytes). The text is redacted when the attempt ends, with the redactors of
the secrets the attempt resolved (worker/secrets.py's `Redactor`, added by the secrets
link). An attempt that wrote nothing records nothing (``logs`` is None, and not stored).
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from typing import Any, TextIO

__all__ = ["CURRENT", "LIMIT", "STREAMS", "StepOutput", "install", "uninstall"]

LIMIT = 64 * 1024
"""Bytes kept per stream per attempt: the last ones."""
STREAMS = ("stdout", "stderr", "log")
LOG_FORMAT = "%(levelname)s %(name)s: %(message)s"

CURRENT: ContextVar[StepOutput | None] = ContextVar("tideflow_step_output", default=None)
_LOCK = threading.Lock()
"""Guards every `StepOutput` (writes are rare; one lock, not one per attempt)."""


class StepOutput:
    """The output of one attempt: the tail of each stream, and how much was dropped."""

    __slots__ = ("_closed", "_dropped", "_redactors", "_tails", "limit")

    def __init__(self, limit: int = LIMIT) -> None:
        self.limit = limit
        self._tails: dict[str, bytearray] | None = None
        self._dropped: dict[str, int] = {}
        self._redactors: list[Callable[[str], str]] = []
        self._closed = False

    def write(self, stream: str, text: str) -> None:
        """Add text written to ``stream`` (``stdout``, ``stderr`` or ``log``)."""
        self.add(stream, text.encode("utf-8", "replace"))

    def add(self, stream: str, data: bytes, dropped: int = 0) -> None:
        """Add bytes written to ``stream``; ``dropped``: bytes written before them that
        were not kept (an executor that read only a file's tail)."""
        if not data and not dropped:
            return
        with _LOCK:
            if self._closed:  # an abandoned thread writing after its attempt ended
                return
            if self._tails is None:
                self._tails = {}
            tail = self._tails.setdefault(stream, bytearray())
            tail += data
            if dropped:
                self._dropped[stream] = self._dropped.get(stream, 0) + dropped
            if len(tail) > 2 * self.limit:  # cut now and then, not on every write
                self._cut(stream, tail)

    def _cut(self, stream: str, tail: bytearray) -> None:
        extra = len(tail) - self.limit
        if extra > 0:
            del tail[:extra]
            self._dropped[stream] = self._dropped.get(stream, 0) + extra

    def redact_with(self, redact: Callable[[str], str]) -> None:
        """Mask with ``redact`` too when the attempt ends (an attempt's secrets)."""
        self._redactors.append(redact)

    def result(self) -> dict[str, Any] | None:
        """What the attempt wrote, redacted: ``{stream: {"text", "truncated"}}`` for each
        stream written to, or None when it wrote nothing. Later writes are ignored."""
        if self._tails is None:  # most attempts: no lock taken (a later write is not read)
            self._closed = True
            return None
        with _LOCK:
            self._closed = True
            tails = self._tails
            if tails is None:
                return None
            logs: dict[str, Any] = {}
            for stream in STREAMS:
                tail = tails.get(stream)
                if tail is None:
                    continue
                self._cut(stream, tail)
                dropped = self._dropped.get(stream, 0)
                text = bytes(tail).decode("utf-8", "ignore" if dropped else "replace")
                for redact in self._redactors:
                    text = redact(text)
                logs[stream] = {"text": text, "truncated": dropped}
            return logs or None


class _Routed:
    """``sys.stdout`` / ``sys.stderr`` while a pool runs: a write made in an attempt's
    context goes to the attempt's `StepOutput`, any other to ``stream``."""

    def __init__(self, name: str, stream: TextIO) -> None:
        self._name = name
        self._stream = stream

    @property
    def tideflow_unrouted(self) -> TextIO:
        """The stream this one routes (the engine's own log lines go there)."""
        return self._stream

    def write(self, text: str) -> int:
        out = CURRENT.get()
        if out is not None:
            out.write(self._name, text)
        return self._stream.write(text)  # shown live as before (the CLI: on stderr)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class _Records(logging.Handler):
    """Adds the records logged in an attempt's context to its `StepOutput`."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter(LOG_FORMAT))

    def handle(self, record: logging.LogRecord) -> bool:
        out = CURRENT.get()
        if out is None or record.name.startswith("tideflow"):
            return False  # no lock taken for the records of no attempt
        return super().handle(record)

    def emit(self, record: logging.LogRecord) -> None:
        out = CURRENT.get()
        if out is None:
            return
        try:
            out.write("log", self.format(record) + "\n")
        except Exception:
            self.handleError(record)


_installed = 0
_saved: tuple[Any, Any] | None = None
_handler: _Records | None = None
_INSTALL = threading.Lock()


def install() -> None:
    """Route the streams and the records of attempts (a pool starts); counted, so that
    pools of one process share one set of proxies."""
    global _installed, _saved, _handler
    with _INSTALL:
        _installed += 1
        if _installed > 1:
            return
        _saved = (sys.stdout, sys.stderr)
        sys.stdout = _Routed("stdout", sys.stdout)
        sys.stderr = _Routed("stderr", sys.stderr)
        _handler = _Records()
        logging.getLogger().addHandler(_handler)


def uninstall() -> None:
    """Undo `install` (a pool closed); the streams go back unless replaced since."""
    global _installed, _saved, _handler
    with _INSTALL:
        if _installed == 0:
            return
        _installed -= 1
        if _installed:
            return
        if _saved is not None:
            if isinstance(sys.stdout, _Routed):
                sys.stdout = _saved[0]
            if isinstance(sys.stderr, _Routed):
                sys.stderr = _saved[1]
        if _handler is not None:
            logging.getLogger().removeHandler(_handler)
        _saved = _handler = None
