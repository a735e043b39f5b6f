"""Turn any exception raised by a step into the ``ErrorInfo`` recorded in history.

``StepError`` keeps its ``type_name``, ``retryable`` and, when it has them,
``classes``, ``details`` and ``retry_after``; any other exception is
named by its class and is retryable (the retry policy's ``retry_on`` decides).
``classes`` holds the names of the exception's classes (its MRO, minus
``object``/``BaseException``/``Exception``) so ``retry_on: [ConnectionError]``
matches ``ConnectionRefusedError`` too.
"""

from __future__ import annotations

import os
import sysconfig
import traceback
from pathlib import Path
from types import TracebackType

from tideflow.errors import StepError
from tideflow.model.events import ErrorInfo

MAX_FRAMES = 20
MAX_DETAILS_CHARS = 8 * 1024
MAX_MESSAGE_CHARS = 4 * 1024
_TRIVIAL_BASES = (object, BaseException, Exception)


def error_info_from_exception(exc: BaseException) -> ErrorInfo:
    """The history record of ``exc``: type, message, retryable, classes, details."""
    if isinstance(exc, StepError):
        return ErrorInfo(
            type=exc.type_name,
            message=_trim(exc.message or exc.type_name, MAX_MESSAGE_CHARS),
            retryable=exc.retryable,
            classes=_declared_classes(exc),
            details=getattr(exc, "details", None),
            retry_after=_retry_after(exc),
        )
    name = type(exc).__name__
    return ErrorInfo(
        type=name,
        message=_trim(str(exc) or name, MAX_MESSAGE_CHARS),
        retryable=True,
        classes=class_names(type(exc)),
        details=trimmed_traceback(exc),
    )


def class_names(cls: type[BaseException]) -> tuple[str, ...]:
    """Names of ``cls`` and its bases, most specific first."""
    return tuple(c.__name__ for c in cls.__mro__ if c not in _TRIVIAL_BASES)


def trimmed_traceback(exc: BaseException) -> str | None:
    """The traceback from the user's first frame on (the engine's frames that called the
    step's function are left out), at most the last ``MAX_FRAMES`` frames and
    ``MAX_DETAILS_CHARS``. Chained exceptions are trimmed the same way."""
    if exc.__traceback__ is None and exc.__cause__ is None and exc.__context__ is None:
        return None
    tb = traceback.TracebackException.from_exception(exc, limit=-MAX_FRAMES, lookup_lines=False)
    _from_user_frames(tb, exc, set())
    text = "".join(tb.format())
    if len(text) > MAX_DETAILS_CHARS:
        text = "…" + text[-MAX_DETAILS_CHARS:]
    return text


def _from_user_frames(tb: traceback.TracebackException, exc: BaseException, seen: set[int]) -> None:
    if id(exc) in seen:
        return
    seen.add(id(exc))
    tb.stack = _user_stack(exc.__traceback__)
    for tb_next, exc_next in ((tb.__cause__, exc.__cause__), (tb.__context__, exc.__context__)):
        if tb_next is not None and exc_next is not None:
            _from_user_frames(tb_next, exc_next, seen)
    for tb_sub, exc_sub in zip(tb.exceptions or (), getattr(exc, "exceptions", ()), strict=False):
        _from_user_frames(tb_sub, exc_sub, seen)


def _user_stack(tb: TracebackType | None) -> traceback.StackSummary:
    """The frames of ``tb`` from the first one outside the engine (all of them if every
    frame is the engine's: then the error is the engine's own)."""
    frames = list(traceback.walk_tb(tb))
    first = next(
        (i for i, (f, _) in enumerate(frames) if not _engine_file(f.f_code.co_filename)), 0
    )
    return traceback.StackSummary.extract(iter(frames[first:][-MAX_FRAMES:]))


_TIDEFLOW_DIR = str(Path(__file__).resolve().parents[2]) + os.sep
_STDLIB_DIRS = tuple({sysconfig.get_path(name) + os.sep for name in ("stdlib", "platstdlib")})


def _engine_file(filename: str) -> bool:
    """tideflow itself, the standard library (thread pools, asyncio) or generated code
    (``<string>``, the bootstrap of an isolated process)."""
    if filename.startswith(("<", _TIDEFLOW_DIR)):
        return True
    installed = "site-packages" in filename or "dist-packages" in filename
    return filename.startswith(_STDLIB_DIRS) and not installed


def _declared_classes(exc: StepError) -> tuple[str, ...]:
    # An error transported from another process (FunctionRaised) declares the
    # classes of the original exception; the local wrapper's classes would mislead.
    declared = getattr(exc, "classes", None)
    if isinstance(declared, tuple):
        return tuple(name for name in declared if isinstance(name, str))
    return class_names(type(exc))


def _retry_after(exc: StepError) -> float | None:
    value = getattr(exc, "retry_after", None)  # HttpRateLimited: the server's Retry-After
    return float(value) if isinstance(value, int | float) and value >= 0 else None


def _trim(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "…"
