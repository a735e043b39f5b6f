"""What a step writes while it runs: its stdout, its stderr and its ``logging`` records,
kept per attempt and recorded with the attempt's outcome (``TaskCompleted.logs`` /
``TaskFailed.logs``), for ``tideflow runs logs``, ``GET /runs/{id}/logs`` and the UI.

Each attempt of a worker pool has a `Slot` in the context variable ``CURRENT`` (`begin`:
the pool sets it in the attempt's asyncio task; a sync python function's pool thread
runs in a copy of that context, an async one on the task itself). The slot gets the
attempt's `StepOutput` with the first write (`current`), so an attempt that writes nothing
-- most of them -- costs an empty list and no lock; `end` closes the slot and returns what
was written. While a pool runs,
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

__all__ = [
    "CURRENT",
    "LIMIT",
    "STREAMS",
    "Slot",
    "StepOutput",
    "begin",
    "current",
    "end",
    "install",
    "uninstall",
]

LIMIT = 64 * 1024
"""Bytes kept per stream per attempt: the last ones."""
STREAMS = ("stdout", "stderr", "log")
LOG_FORMAT = "%(levelname)s %(name)s: %(message)s"

Slot = list["StepOutput"]
"""An attempt's place for its `StepOutput`: empty until the attempt first writes (or its
output is asked for), then ``[output]``; `end` appends a closed one, so that whichever
came first stays at index 0 (``list.append`` is atomic: no lock for a quiet attempt)."""

CURRENT: ContextVar[Slot | None] = ContextVar("tideflow_step_output", default=None)
_LOCK = threading.Lock()
"""Guards every `StepOutput` and the filling of every `Slot` (writes are rare; one lock,
not one per attempt)."""


def begin() -> Slot:
    """The current context's attempt starts: what it writes from now on is its own (the
    pool calls this in each attempt's asyncio task)."""
    slot: Slot = []
    CURRENT.set(slot)
    return slot


def current() -> StepOutput | None:
    """The `StepOutput` of the attempt of the current context (made by the first call),
    or None outside an attempt. After the attempt's `end`, a closed one: writes to it are
    dropped."""
    slot = CURRENT.get()
    if slot is None:
        return None
    if not slot:
        with _LOCK:
            if not slot:
                slot.append(StepOutput())
    return slot[0]


def end(slot: Slot) -> dict[str, Any] | None:
    """Close the attempt's slot: `StepOutput.result` of what it wrote, None when it wrote
    nothing (then without a lock)."""
    slot.append(_CLOSED)
    first = slot[0]
    return None if first is _CLOSED else first.result()


class StepOutput:
    """The output of one attempt: the tail of each stream, and how much was dropped."""

    __slots__ = ("_closed", "_dropped", "_redactors", "_tails", "limit")

    def __init__(self, limit: int = LIMIT) -> None:
        # Every attempt makes one and most write nothing: nothing is allocated here but
        # the object (the containers come with the first write or redactor).
        self.limit = limit
        self._tails: dict[str, bytearray] | None = None
        self._dropped: dict[str, int] | None = None
        self._redactors: list[Callable[[str], str]] | None = None
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
                self._count_dropped(stream, dropped)
            if len(tail) > 2 * self.limit:  # cut now and then, not on every write
                self._cut(stream, tail)

    def _cut(self, stream: str, tail: bytearray) -> None:
        extra = len(tail) - self.limit
        if extra > 0:
            del tail[:extra]
            self._count_dropped(stream, extra)

    def _count_dropped(self, stream: str, count: int) -> None:
        if self._dropped is None:
            self._dropped = {}
        self._dropped[stream] = self._dropped.get(stream, 0) + count

    def redact_with(self, redact: Callable[[str], str]) -> None:
        """Mask with ``redact`` too when the attempt ends (an attempt's secrets)."""
        with _LOCK:
            if self._closed:  # too late (and never the shared closed one's)
                return
            if self._redactors is None:
                self._redactors = []
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
                dropped = self._dropped.get(stream, 0) if self._dropped is not None else 0
                text = bytes(tail).decode("utf-8", "ignore" if dropped else "replace")
                for redact in self._redactors or ():
                    text = redact(text)
                logs[stream] = {"text": text, "truncated": dropped}
            return logs or None


_CLOSED = StepOutput()
_CLOSED._closed = True
"""What `end` puts in a slot: a write after the attempt ended (an abandoned thread) or
before none was made finds it and is dropped."""


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
        if CURRENT.get() is not None:
            out = current()
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
        if CURRENT.get() is None or record.name.startswith("tideflow"):
            return False  # no lock taken for the records of no attempt
        return super().handle(record)

    def emit(self, record: logging.LogRecord) -> None:
        out = current()
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
