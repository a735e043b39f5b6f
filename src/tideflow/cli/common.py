"""What every `tideflow` command shares: the consoles, exit codes, the ``--store``
option, and the one way a command opens a store (or a runtime on it).

A command never shows a traceback for something the user can fix: a bad store
URL, a store that cannot be opened (``StoreError``), a run that is not in the
store (``NotFound``) — every ``TideflowError`` raised while a command's coroutine
runs ends the command with one line on stderr and exit code 2 (``run_async``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import signal
import sys
from collections.abc import AsyncIterator, Coroutine, Iterable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import orjson
import typer
from rich.console import Console
from rich.markup import escape

from tideflow.errors import (
    DefinitionError,
    Diagnostic,
    EngineAlreadyRunning,
    NotFound,
    StoreError,
    TideflowError,
)
from tideflow.model import storable
from tideflow.model.states import RUN_TERMINAL
from tideflow.store import DEFAULT_URL, open_store

# Every command module imports this one, and `tideflow --help` imports every command
# module: what is heavy (asyncio, the store's model, the engine, httpx, the compiler) is
# imported by the functions that use it (tests/unit/cli/test_cli_imports.py).
if TYPE_CHECKING:
    from tideflow.client import Client
    from tideflow.remote_http import HttpClient
    from tideflow.runtime.runtime import Listener, Runtime
    from tideflow.store import Store
    from tideflow.store.base import RunSummary
    from tideflow.worker.executors.registry import ExecutorRegistry

T = TypeVar("T")
TERMINAL_STATUSES = frozenset(status.value for status in RUN_TERMINAL)

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
STORE_ENV = "TIDEFLOW_STORE"

err = Console(stderr=True, highlight=False, soft_wrap=True)
out = Console(highlight=False, soft_wrap=True)

StoreOption = Annotated[
    str,
    typer.Option(
        "--store",
        envvar=STORE_ENV,
        metavar="URL",
        help=(
            "The store: sqlite:///path.db (relative), sqlite:////abs/path.db, "
            "postgresql://user@host/db, or memory://."
        ),
    ),
]
_json_output: ContextVar[bool] = ContextVar("tideflow_json_output", default=False)


def json_mode(value: bool) -> bool:
    """The callback of every ``--json`` option: errors are then reported as JSON too."""
    _json_output.set(bool(value))
    return value


def format_mode(value: str) -> str:
    """The callback of a ``--format`` option: ``json`` reports errors as JSON too."""
    json_mode(value == "json")
    return value


JsonOption = Annotated[
    bool, typer.Option("--json", help="Print one JSON object.", callback=json_mode)
]
WaitForEngineOption = Annotated[
    float,
    typer.Option(
        "--wait-for-engine",
        metavar="SECONDS",
        min=0,
        help=(
            "When another engine runs on the store, wait up to this long for it to exit "
            "instead of refusing at once."
        ),
    ),
]
RunArgument = Annotated[str, typer.Argument(metavar="RUN", help="The run id.", show_default=False)]
DEFAULT_STORE = DEFAULT_URL


def fail_usage(
    message: str,
    *,
    type: str = "UsageError",
    hint: str | None = None,
    diagnostics: Sequence[Diagnostic] = (),
) -> typer.Exit:
    """Report an error the user can fix; return the exit to raise (code 2).

    Text: one ``error:`` line on stderr (or the diagnostics, one per problem). A command
    run with ``--json`` also prints the error as one object on stdout:
    ``{"error": {"type", "message", "hint"?, "diagnostics"?}}``.
    """
    if diagnostics:
        for diagnostic in diagnostics:
            err.print(diagnostic.format(), markup=False)
    else:
        shown = f"{message} ({hint})" if hint else message
        err.print(f"[bold red]error:[/] {escape(shown)}", markup=True)
    if json_requested():
        error: dict[str, Any] = {"type": type, "message": message}
        if hint:
            error["hint"] = hint
        if diagnostics:
            error["diagnostics"] = [d.to_dict() for d in diagnostics]
        write_json({"error": error})
    return typer.Exit(EXIT_USAGE)


def fail_error(exc: TideflowError) -> typer.Exit:
    """``fail_usage`` for a tideflow error: its class names the type, diagnostics kept."""
    diagnostics = exc.diagnostics if isinstance(exc, DefinitionError) else ()
    message = one_line(exc.message)
    if diagnostics:  # the first problem, not every one run together (they are all listed)
        message = diagnostics[0].format().splitlines()[0]
        if len(diagnostics) > 1:
            message += f" (and {len(diagnostics) - 1} more)"
    return fail_usage(message, type=type(exc).__name__, diagnostics=diagnostics)


def json_requested() -> bool:
    """Whether the running command was asked for JSON output (its ``--json``)."""
    return _json_output.get()


def parse_json_option(raw: str | None, option: str) -> Any:
    """The value of a JSON option (``--input``, ``--payload``): JSON text, or ``@file``."""
    if raw is None:
        return None
    text = raw
    if raw.startswith("@"):
        try:
            text = Path(raw[1:]).read_text(encoding="utf-8")
        except OSError as exc:
            raise fail_usage(
                f"cannot read {option} file {raw[1:]}: {exc.strerror or exc}"
            ) from None
    try:
        value = storable.loads(text)  # integers exact: one out of range is refused, not rounded
    except orjson.JSONDecodeError as exc:
        raise fail_usage(
            f"{option} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
            hint="pass a JSON value, or @path/to/file.json",
        ) from None
    found = storable.integer_problem(value)
    if found is not None:
        where = f" at {storable.format_path(found[0])}" if found[0] else ""
        raise fail_usage(f"{option}{where}: {found[1]}")
    return value


def one_line(text: str) -> str:
    return " ".join(text.split())


def display_url(url: str) -> str:
    """The URL as shown to people: a password is masked."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    if not parts.password:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


class _Terminated(Exception):
    """SIGTERM stopped the command (handled like Ctrl-C)."""


def run_async(coro: Coroutine[Any, Any, T], *, interrupted: str = "interrupted") -> T:
    """Run a command's coroutine; a TideflowError becomes one clean line and exit 2,
    Ctrl-C or SIGTERM prints ``interrupted`` and exits 130.

    Both stop the same way: the coroutine is cancelled, so the runtime it opened
    closes cleanly (what is committed stays committed; the rest resumes later). The loop
    is `tideflow.loop`'s: uvloop unless ``TIDEFLOW_LOOP`` says otherwise."""
    import tideflow.loop

    try:
        tideflow.loop.loop_name()  # a bad TIDEFLOW_LOOP stops here, before coro is wrapped
    except TideflowError as exc:
        coro.close()
        raise fail_error(exc) from None
    try:
        return tideflow.loop.run(_stopped_by_sigterm(coro))
    except TideflowError as exc:
        raise fail_error(exc) from None
    except (KeyboardInterrupt, _Terminated):
        err.print(interrupted, markup=False)
        raise typer.Exit(EXIT_INTERRUPTED) from None


STOP_REPORT = 10.0
"""Seconds after SIGTERM after which a command still stopping logs what each of its
tasks is waiting for (a stop that hangs says where)."""


def report_stopping(seconds: float) -> None:
    """Log, as a warning, the stack of every task of the running loop: what a command that
    is still stopping ``seconds`` after SIGTERM waits for."""
    import asyncio

    lines = [f"still stopping {seconds:g}s after SIGTERM; the tasks left:"]
    for pending in asyncio.all_tasks():
        lines.append(f"task {pending.get_name()}:")
        lines += [f"  {where}" for where in _awaiting(pending.get_coro())] or ["  (at its end)"]
    logging.getLogger("tideflow").warning("%s", "\n".join(lines))


def _awaiting(awaitable: object) -> list[str]:
    """Where a suspended coroutine waits, outermost first, down its chain of awaits
    (``Task.get_stack`` gives only the outermost frame); the future it waits on last."""
    out: list[str] = []
    for _ in range(100):  # a chain is never that deep; a cycle must not hang the report
        frame = next(
            (
                getattr(awaitable, a)
                for a in ("cr_frame", "ag_frame", "gi_frame")
                if hasattr(awaitable, a)
            ),
            None,
        )
        if frame is None:
            if awaitable is not None:
                out.append(f"waits on {awaitable!r:.200}")
            break
        out.append(f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}")
        awaitable = next(
            (
                getattr(awaitable, a)
                for a in ("cr_await", "ag_await", "gi_yieldfrom")
                if hasattr(awaitable, a)
            ),
            None,
        )
    return out


async def _stopped_by_sigterm(coro: Coroutine[Any, Any, T]) -> T:
    """``coro``, cancelled on SIGTERM as asyncio cancels the main task on Ctrl-C; a stop
    still going on ``STOP_REPORT`` seconds later logs where each task waits."""
    import asyncio

    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    terminated = asyncio.Event()

    def terminate() -> None:
        if not terminated.is_set():
            loop.call_later(STOP_REPORT, report_stopping, STOP_REPORT)
        terminated.set()
        if task is not None:
            task.cancel()

    try:
        loop.add_signal_handler(signal.SIGTERM, terminate)
    except (NotImplementedError, RuntimeError, ValueError):  # no signals here (a thread)
        return await coro
    try:
        return await coro
    except asyncio.CancelledError:
        if terminated.is_set():
            raise _Terminated from None
        raise
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


def resume_command(url: str, run_id: str | None = None) -> str:
    """The command that continues a store's unfinished runs (or one of them)."""
    store = "" if url == DEFAULT_STORE else f" --store {display_url(url)}"
    if run_id is not None:
        return f"`tideflow runs resume {run_id}{store}`"
    return f"`tideflow resume{store}`"


def interrupted_message(url: str, run_id: str | None = None) -> str:
    """What Ctrl-C or SIGTERM prints: where the unfinished work is and how to go on."""
    if url.startswith("memory:"):
        return f"interrupted: {url} keeps nothing, unfinished runs are gone"
    what = f"run {run_id} stays" if run_id is not None else "unfinished runs stay"
    return f"interrupted: {what} in {display_url(url)}; continue with {resume_command(url, run_id)}"


def registry() -> ExecutorRegistry:
    from tideflow.worker.executors.registry import ExecutorRegistry

    return ExecutorRegistry()


def use_working_directory_modules() -> None:
    """Let `python` steps import modules next to where the command runs, as `run` always has."""
    cwd = str(Path.cwd())
    if cwd not in sys.path:
        sys.path.insert(0, cwd)


# -- opening stores and runtimes ------------------------------------------------------


def sqlite_file(store: Store) -> Path | None:
    """The database file of a SQLite store (None for other stores and ``:memory:``)."""
    path = getattr(store, "path", None)
    if isinstance(path, str) and path != ":memory:":
        return Path(path)
    return None


def build_store(url: str, *, create: bool, upgrade: bool) -> Store:
    """The store for ``url``, not yet open.

    ``create``: a missing SQLite file may be created (else StoreError "no store at …").
    ``upgrade``: opening applies missing schema migrations (else an old schema is refused
    with a message to run ``tideflow db upgrade``). A newer schema is always refused.
    """
    store = open_store(url, auto_upgrade=upgrade)
    path = sqlite_file(store)
    if path is not None and not create and not path.exists():
        raise StoreError(f"no store at {path} (from --store {display_url(url)})")
    return store


def store_exists(url: str) -> bool:
    """False only for a SQLite store whose file does not exist yet."""
    path = sqlite_file(build_store(url, create=True, upgrade=False))
    return path is None or path.exists()


def store_unavailable(url: str, exc: BaseException) -> StoreError:
    """The error for a store that did not open; a driver's error gets its type named."""
    text = exc.message if isinstance(exc, TideflowError) else f"{type(exc).__name__}: {exc}"
    return StoreError(one_line(f"cannot open store {display_url(url)}: {text}"))


@contextlib.asynccontextmanager
async def opened_store(
    url: str, *, create: bool = False, upgrade: bool = False
) -> AsyncIterator[Store]:
    """An open store, closed on exit; StoreError when it cannot be opened."""
    store = build_store(url, create=create, upgrade=upgrade)
    try:
        await store.open()
    except Exception as exc:
        with contextlib.suppress(Exception):
            await store.close()
        raise store_unavailable(url, exc) from None
    try:
        yield store
    finally:
        await store.close()


@contextlib.asynccontextmanager
async def opened_runtime(
    url: str,
    *,
    recover: bool,
    workers: int,
    create: bool = False,
    upgrade: bool = False,
    executors: ExecutorRegistry | None = None,
    definitions_dir: Path | None = None,
    listeners: Iterable[Listener] = (),
    limits: Limits | None = None,
    wait_for_engine: float = 0.0,
) -> AsyncIterator[Runtime]:
    """A started runtime on the store at ``url`` (the runtime opens and closes the store).

    ``recover=True`` resumes every unfinished run of the store on start; ``workers=0``
    executes no task (what a command dispatches then runs on the next resume).
    ``limits`` default to ``TIDEFLOW_MAX_STEP_OUTPUT`` / ``TIDEFLOW_MAX_RUN_INPUT``.
    A runtime that recovers is the store's engine: it sweeps every
    ``TIDEFLOW_SWEEP_INTERVAL`` seconds (default 30, runtime/sweep.py), takes the engine
    lease (``TIDEFLOW_ENGINE_LEASE_TTL`` seconds, default 10), and is refused with
    EngineAlreadyRunning while another engine holds it, after waiting up to
    ``wait_for_engine`` seconds for it to go.
    """
    from tideflow.observability.tracing import provider_from_environment
    from tideflow.runtime.admission import bound_from_environment, task_bound_from_environment
    from tideflow.runtime.clock import clock_from_environment
    from tideflow.runtime.lease import ttl_from_environment
    from tideflow.runtime.runtime import Runtime
    from tideflow.runtime.sweep import interval_from_environment

    try:
        clock = clock_from_environment(os.environ)
        lease_ttl = ttl_from_environment(os.environ)
        sweep_interval = interval_from_environment(os.environ)
        max_active_runs = bound_from_environment(os.environ)
        max_tasks_in_flight = task_bound_from_environment(os.environ)
    except ValueError as exc:
        raise fail_usage(str(exc)) from None
    limits = limits or Limits.from_env(os.environ)
    tracer_provider = provider_from_environment(os.environ, "tideflow")  # before any write
    store = build_store(url, create=create, upgrade=upgrade)
    rt = Runtime(
        store=store,
        executors=executors,
        workers=workers,
        recover=recover,
        definitions_dir=definitions_dir,
        clock=clock,
        max_step_output=limits.step_output,
        max_run_input=limits.run_input,
        lease_ttl=lease_ttl,
        wait_for_engine=wait_for_engine,
        sweep_interval=sweep_interval,
        max_active_runs=max_active_runs,
        max_tasks_in_flight=max_tasks_in_flight,
        tracer_provider=tracer_provider,
    )
    for listener in listeners:
        rt.add_listener(listener)
    for sink in configured_event_sinks(os.environ):
        rt.add_event_sink(sink)
    with steps_write_to_stderr() if workers else contextlib.nullcontext():
        try:
            await rt.start()
        except Exception as exc:
            with contextlib.suppress(Exception):
                await rt.close()
            if isinstance(exc, EngineAlreadyRunning):
                raise EngineAlreadyRunning(f"{display_url(url)}: {exc.message}") from None
            raise store_unavailable(url, exc) from None
        try:
            yield rt
        finally:
            await rt.close()


@contextlib.contextmanager
def steps_write_to_stderr() -> Iterator[None]:
    """While steps run in this process, what they write to stdout goes to stderr: a
    ``print()`` (``sys.stdout``), and a C library or an ``isolation: process`` child
    writing to file descriptor 1. The command's own output (``--json``) is written after,
    so stdout carries it alone."""
    sys.stdout.flush()
    stream = sys.stdout
    saved = _point_fd(1, 2)
    sys.stdout = sys.stderr
    try:
        yield
    finally:
        sys.stdout = stream
        if saved is not None:
            sys.stderr.flush()
            os.dup2(saved, 1)
            os.close(saved)


def _point_fd(fd: int, to: int) -> int | None:
    """Point ``fd`` where ``to`` points; a copy of where it pointed (None: it could not be
    done, such as without a file descriptor ``to``)."""
    try:
        saved = os.dup(fd)
    except OSError:
        return None
    try:
        os.dup2(to, fd)
    except OSError:
        os.close(saved)
        return None
    return saved


@contextlib.asynccontextmanager
async def opened_client(url: str, **options: Any) -> AsyncIterator[Client]:
    """A client for the store at ``url`` when no engine runs on it here: what it is asked
    to do is recorded (committed) before it returns, and carried out by the next engine
    (`tideflow resume`). Options pass on to ``opened_runtime``."""
    async with opened_runtime(url, recover=False, workers=0, **options) as rt:
        yield rt.client.recording(via=rt.deliver)


MAX_STEP_OUTPUT_ENV = "TIDEFLOW_MAX_STEP_OUTPUT"
MAX_RUN_INPUT_ENV = "TIDEFLOW_MAX_RUN_INPUT"
_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kib": 1024,
    "kb": 1000,
    "mib": 1024**2,
    "mb": 1000**2,
    "gib": 1024**3,
}


@dataclass(frozen=True, slots=True)
class Limits:
    """The size limits of a runtime (JSON bytes): a step's output, a run's input."""

    step_output: int = storable.MAX_STEP_OUTPUT
    run_input: int = storable.MAX_RUN_INPUT

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Limits:
        return cls(
            step_output=parse_size(environ.get(MAX_STEP_OUTPUT_ENV), storable.MAX_STEP_OUTPUT),
            run_input=parse_size(environ.get(MAX_RUN_INPUT_ENV), storable.MAX_RUN_INPUT),
        )


def parse_size(text: str | None, default: int) -> int:
    """``"1MiB"``, ``"512KiB"``, ``"2000000"`` (bytes); the default when unset or empty."""
    if text is None or not text.strip():
        return default
    match = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", text)
    unit = match and _SIZE_UNITS.get(match.group(2).lower())
    if match is None or unit is None:
        raise TideflowError(
            f"{text!r} is not a size: write bytes (2000000) or a number with KiB, MiB, GiB, KB "
            "or MB (e.g. 4MiB)"
        )
    return int(match.group(1)) * unit


EVENT_SINKS_VARIABLE = "TIDEFLOW_EVENT_SINKS"
EVENT_SINK_SECRET_VARIABLE = "TIDEFLOW_EVENT_SINK_SECRET"


def configured_event_sinks(environ: Mapping[str, str]) -> list[Any]:
    """Webhook sinks named by ``TIDEFLOW_EVENT_SINKS`` (URLs separated by spaces or commas),
    each signed with ``TIDEFLOW_EVENT_SINK_SECRET``."""
    from tideflow.worker.executors.emit_sink import WebhookSink

    urls = [u for u in environ.get(EVENT_SINKS_VARIABLE, "").replace(",", " ").split() if u]
    if not urls:
        return []
    secret = environ.get(EVENT_SINK_SECRET_VARIABLE)
    if not secret:
        raise fail_usage(
            f"{EVENT_SINKS_VARIABLE} is set but {EVENT_SINK_SECRET_VARIABLE} is not: "
            "webhook deliveries are always signed, set the shared secret"
        )
    bad = [u for u in urls if not u.startswith(("http://", "https://"))]
    if bad:
        raise fail_usage(f"{EVENT_SINKS_VARIABLE}: not an http(s) URL: {', '.join(bad)}")
    return [WebhookSink(url, secret) for url in urls]


async def known_run(client: Client | HttpClient, run_id: str, url: str) -> RunSummary:
    """The run's summary; NotFound naming the store for a run that is not in it."""
    try:
        return await client.summary(run_id)
    except NotFound:
        raise NotFound(f"no run {run_id!r} in {display_url(url)}") from None


# -- output ---------------------------------------------------------------------------


def write_json(value: Any) -> None:
    sys.stdout.flush()
    sys.stdout.buffer.write(json_bytes(value) + b"\n")
    sys.stdout.buffer.flush()


def json_bytes(value: Any) -> bytes:
    """``value`` as JSON, whatever it holds: what orjson refuses (an integer beyond 64 bits,
    a key that is not a string) goes through the slower stdlib encoder. NaN and infinities
    come out as null (orjson) or as strings, never as invalid JSON."""
    try:
        return orjson.dumps(value, default=str)
    except TypeError:
        return json.dumps(_plain(value), default=str, ensure_ascii=False).encode()


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return _finite(value)


def iso(timestamp: float | None) -> str | None:
    """Epoch seconds as ISO-8601 in UTC (``2025-01-31T12:00:00.000Z``)."""
    if timestamp is None:
        return None
    text = datetime.fromtimestamp(timestamp, UTC).isoformat(timespec="milliseconds")
    return text.replace("+00:00", "Z")


def parse_since(text: str, now: float) -> float:
    """``--since``: a duration back from now (``2h``, ``7d``) or an ISO-8601 time (UTC if
    it names no zone) -> epoch seconds."""
    from tideflow.dsl import parse_duration

    try:
        seconds = parse_duration(text)
    except ValueError:
        pass
    else:
        if seconds < 0:
            raise fail_usage(f"--since {text!r}: a duration must not be negative")
        return now - seconds
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise fail_usage(
            f"--since {text!r} is neither a duration (30m, 2h, 7d) nor an ISO-8601 time "
            "(2025-01-31 or 2025-01-31T12:00:00Z)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def table_console() -> Console:
    """Where tables go: stdout, wide enough not to fold run ids when piped."""
    if out.is_terminal:
        return out
    width = int(os.environ.get("COLUMNS", "0") or 0) or 200
    return Console(highlight=False, width=width)


__all__ = [
    "DEFAULT_STORE",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_USAGE",
    "MAX_RUN_INPUT_ENV",
    "MAX_STEP_OUTPUT_ENV",
    "TERMINAL_STATUSES",
    "JsonOption",
    "Limits",
    "RunArgument",
    "StoreOption",
    "WaitForEngineOption",
    "build_store",
    "display_url",
    "err",
    "fail_error",
    "fail_usage",
    "format_mode",
    "interrupted_message",
    "iso",
    "json_mode",
    "json_requested",
    "known_run",
    "one_line",
    "opened_client",
    "opened_runtime",
    "opened_store",
    "out",
    "parse_json_option",
    "parse_since",
    "parse_size",
    "registry",
    "resume_command",
    "run_async",
    "sqlite_file",
    "store_exists",
    "table_console",
    "use_working_directory_modules",
    "write_json",
]
