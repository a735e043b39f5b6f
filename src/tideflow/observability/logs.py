"""Structured logs: JSON lines, or a readable console format on a TTY, redacted.

Built on the standard library's ``logging`` rather than structlog: every module of
tideflow already logs through ``logging.getLogger("tideflow.…")`` (and so do the
libraries beside it: uvicorn, asyncpg), so a formatter and a filter on the root handler
give every one of those lines the same shape with no call site changed and no new
dependency in the base install. What structlog would add (bound loggers, processor
chains) is covered here by context variables (tideflow.logcontext) and one redaction
pass.

Each line carries ``run_id``, ``step_id``, ``attempt`` and ``trace_id`` (null when the
line is about none: the scheduler sets the run while it applies an event, the relay
while it carries out an effect, a worker for the whole of an attempt; tracing sets the
trace). Anything given as ``extra={...}`` is a field of its own.

Redaction (``redact_text``, ``redact_value``), on the message, the traceback and every
field: values of keys that name a credential or that a definition declares sensitive
(the rules of ``tideflow.model.masking``, which every view of run data uses: password,
token, secret, authorization, api key, cookie, credential, private key ...), and in
free text ``key=value`` credentials, ``Bearer …`` credentials, API tokens
(``tf_…``), the values of ``TIDEFLOW_SECRET_*`` environment variables (the env secret
provider's) and the secret values the attempt being logged resolved.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import traceback
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, Literal, TextIO

import orjson

from tideflow import logcontext
from tideflow.model.masking import is_credential_key, mask
from tideflow.worker.secrets import ENV_PREFIX, Redactor

LogFormat = Literal["json", "console", "auto"]
FORMATS: tuple[str, ...] = ("json", "console", "auto")
LEVELS: tuple[str, ...] = ("debug", "info", "warning", "error", "critical")
REDACTED = "[redacted]"
CONSOLE_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_KEY_VALUE = re.compile(
    r"""(?ix)
    (?P<key>["']?[\w-]*(?:pass(?:word|wd)?|pwd|secret|token|authori[sz]ation|api[_-]?key|cookie
        |credentials?|private[_-]?key|access[_-]?key)[\w-]*["']?)
    (?P<sep>\s*[=:]\s*)
    (?P<value>"[^"]*"|'[^']*'|(?:bearer|basic)\s+\S+|[^\s,;&}\]]+)
    """
)
_BEARER = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}")
_API_TOKEN = re.compile(r"\btf_[A-Za-z0-9_-]{8,}")

_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message",
    "asctime",
    "run_id",
    "step_id",
    "attempt",
    "trace_id",
    "taskName",
}
_CONTEXT = ("run_id", "step_id", "attempt", "trace_id")


def env_secrets(environ: Mapping[str, str] = os.environ) -> list[str]:
    """The values of the env secret provider's variables (``TIDEFLOW_SECRET_*``)."""
    return [v for k, v in environ.items() if k.startswith(ENV_PREFIX) and v]


class Redaction:
    """Masks credentials in text and in nested values (see the module docstring)."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._secrets = Redactor(secrets, REDACTED)

    def text(self, text: str) -> str:
        text = _KEY_VALUE.sub(_mask_value, text)
        text = _BEARER.sub(lambda m: f"{m.group(1)} {REDACTED}", text)
        text = _API_TOKEN.sub(f"tf_{REDACTED}", text)
        text = self._secrets.redact_text(text)
        attempt_secrets = logcontext.secret_values.get()
        if attempt_secrets:
            text = Redactor(attempt_secrets, REDACTED).redact_text(text)
        return text

    def value(self, value: Any, key: str | None = None) -> Any:
        """A field's value as the line shows it: the masking rules every view of run
        data uses (``tideflow.model.masking``), and credentials in its text masked."""
        if key is not None and is_credential_key(key):
            return REDACTED
        return mask(value, placeholder=REDACTED, text=self.text)


def _mask_value(match: re.Match[str]) -> str:
    return f"{match.group('key')}{match.group('sep')}{REDACTED}"


class ContextFilter(logging.Filter):
    """Puts the run, step, attempt and trace of the current task on each record (unless
    the call gave them in ``extra``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        fields = record.__dict__
        if fields.get("run_id") is None:
            record.run_id = logcontext.run_id.get()
        if fields.get("step_id") is None:
            record.step_id = logcontext.step_id.get()
        if fields.get("attempt") is None:
            record.attempt = logcontext.attempt.get()
        if fields.get("trace_id") is None:
            record.trace_id = logcontext.trace_id.get()
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ISO 8601), level, logger, message, the four
    context fields, every ``extra`` field, and ``exception`` with its traceback."""

    def __init__(self, redaction: Redaction) -> None:
        super().__init__()
        self._redact = redaction

    def format(self, record: logging.LogRecord) -> str:
        fields = record.__dict__
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": self._redact.text(record.getMessage()),
        }
        for name in _CONTEXT:
            line[name] = self._redact.value(fields.get(name))
        for key, value in fields.items():
            if key not in _STANDARD and not key.startswith("_"):
                line[key] = self._redact.value(value, key)
        if record.exc_info:
            line["exception"] = self._redact.text(
                "".join(traceback.format_exception(*record.exc_info)).rstrip()
            )
        elif record.stack_info:
            line["stack"] = self._redact.text(record.stack_info)
        return orjson.dumps(line, default=str).decode()


class ConsoleFormatter(logging.Formatter):
    """``time LEVEL logger: message [run=… step=… attempt=… trace=…]``, redacted."""

    def __init__(self, redaction: Redaction) -> None:
        super().__init__(CONSOLE_FORMAT)
        self._redact = redaction

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        fields = record.__dict__
        context = " ".join(
            f"{label}={fields[name]}"
            for label, name in (
                ("run", "run_id"),
                ("step", "step_id"),
                ("attempt", "attempt"),
                ("trace", "trace_id"),
            )
            if fields.get(name) is not None
        )
        first, newline, rest = text.partition("\n")  # the context goes on the message line
        if context:
            first = f"{first} [{context}]"
        return self._redact.text(first + newline + rest)


def formatter(format: str, stream: TextIO, redaction: Redaction) -> logging.Formatter:
    """The formatter for ``format`` (``auto``: console on a TTY, else JSON)."""
    if format == "auto":
        format = "console" if _isatty(stream) else "json"
    if format == "json":
        return JsonFormatter(redaction)
    if format == "console":
        return ConsoleFormatter(redaction)
    raise ValueError(f"--log-format {format}: choose json, console or auto")


def level_of(name: str) -> int:
    """A level name (any case) as a number; ValueError naming the choices otherwise."""
    if name.lower() not in LEVELS:
        raise ValueError(f"--log-level {name}: choose one of {', '.join(LEVELS)}")
    return logging.getLevelNamesMapping()[name.upper()]


def configure(
    level: int | str = logging.INFO,
    format: str = "auto",
    stream: TextIO | None = None,
    *,
    secrets: Iterable[str] | None = None,
) -> logging.Handler:
    """Send every log record to ``stream`` (stderr) in ``format`` at ``level`` and above;
    replaces what an earlier call (or ``log_to_stderr``) installed. ``secrets``: values
    to mask besides the ``TIDEFLOW_SECRET_*`` environment's (the default)."""
    redaction = Redaction(env_secrets() if secrets is None else secrets)
    handler: logging.StreamHandler[TextIO] = (
        logging.StreamHandler(stream) if stream is not None else _Stderr()
    )
    handler.setFormatter(formatter(format, stream or sys.stderr, redaction))
    handler.addFilter(ContextFilter())
    handler.tideflow = True  # type: ignore[attr-defined]
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "tideflow", False)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level_of(level) if isinstance(level, str) else level)
    return handler


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to ``sys.stderr`` as it is when the record comes (like logging's last
    resort), not as it was when the handler was made: a CLI command run in-process (a
    test's CliRunner) swaps it for a buffer it closes afterwards. While a worker pool
    routes ``sys.stderr`` to the attempts that write (worker/capture.py), the stream it
    routes: the engine's log lines are not a step's output."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> TextIO:
        stream = sys.stderr
        unrouted: TextIO = getattr(stream, "tideflow_unrouted", stream)
        return unrouted

    @stream.setter
    def stream(self, value: TextIO) -> None:
        pass  # always the current sys.stderr


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


__all__ = [
    "FORMATS",
    "LEVELS",
    "REDACTED",
    "ConsoleFormatter",
    "ContextFilter",
    "JsonFormatter",
    "Redaction",
    "configure",
    "env_secrets",
    "formatter",
    "level_of",
]
