"""`tideflow server` and `tideflow worker`, and the ``--bus`` option that makes every
`tideflow runs …` command a cluster client (runtime/server.py, worker/process.py,
runtime/remote.py hold the logic; this module only parses options)."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import socket
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from tideflow.cli.common import (
    DEFAULT_STORE,
    EXIT_USAGE,
    Limits,
    StoreOption,
    WaitForEngineOption,
    display_url,
    fail_usage,
    opened_client,
    parse_size,
    registry,
    run_async,
    store_unavailable,
)
from tideflow.errors import BusError, EngineAlreadyRunning, TideflowError

if TYPE_CHECKING:
    from tideflow.client import Client
    from tideflow.observability.metrics import EngineMetrics
    from tideflow.remote_http import HttpClient
    from tideflow.runtime.server import Listener, Service

BUS_ENV = "TIDEFLOW_BUS"

BusOption = Annotated[
    str | None,
    typer.Option(
        "--bus",
        envvar=BUS_ENV,
        metavar="URL",
        help=(
            "The cluster's bus (redis://host:6379/0): the command then talks to the "
            "`tideflow server` through it instead of running an engine here."
        ),
    ),
]
ClusterBusOption = Annotated[
    str,
    typer.Option(
        "--bus",
        envvar=BUS_ENV,
        metavar="URL",
        help="The cluster's bus: redis://host:6379/0?prefix=tideflow (TIDEFLOW_BUS).",
    ),
]


@contextlib.asynccontextmanager
async def connected(store: str, bus: str | None) -> AsyncIterator[Client]:
    """The client a `runs …` command uses: on the cluster's store and bus when a bus is
    given (no engine here), else the store's recording client (cli/common.py). A command
    that takes ``--server`` asks `reached` instead."""
    if not bus:
        async with opened_client(store) as client:
            yield client
        return
    from tideflow.client import Client
    from tideflow.worker.executors.registry import ExecutorRegistry

    limits = Limits.from_env(os.environ)
    try:
        opened = Client.connect(
            store,
            bus,
            executors=ExecutorRegistry(),
            max_step_output=limits.step_output,
            max_run_input=limits.run_input,
        )
        client = await opened.__aenter__()
    except BusError:
        raise
    except Exception as exc:
        raise store_unavailable(store, exc) from None
    try:
        yield client
    finally:
        await opened.__aexit__(None, None, None)


@contextlib.asynccontextmanager
async def reached(
    store: str, bus: str | None, server: str | None, token: str | None
) -> AsyncIterator[Client | HttpClient]:
    """``connected``, or with ``server`` the server's HTTP API (cli/remote.py)."""
    if server:
        from tideflow.cli.remote import http_client

        async with http_client(server, token) as remote:
            yield remote
        return
    async with connected(store, bus) as client:
        yield client


def setup_logging(verbose: bool, level: str | None, format: str, default: str = "info") -> None:
    """Log lines on stderr in ``format`` at ``level`` (``--verbose``: debug); exit 2 for a
    level or format that does not exist (docs/observability.md)."""
    from tideflow.observability.logs import configure

    try:
        configure(level or ("debug" if verbose else default), format)
    except ValueError as exc:
        raise fail_usage(str(exc)) from None


VerboseOption = Annotated[
    bool, typer.Option("--verbose", "-v", help="Log at DEBUG level (as --log-level debug).")
]
LogFormatOption = Annotated[
    str,
    typer.Option(
        "--log-format",
        envvar="TIDEFLOW_LOG_FORMAT",
        metavar="json|console|auto",
        help="Log lines as JSON objects (run_id, step_id, attempt, trace_id on each), as readable text, or auto: text on a terminal, JSON otherwise.",
    ),
]
LogLevelOption = Annotated[
    str | None,
    typer.Option(
        "--log-level",
        envvar="TIDEFLOW_LOG_LEVEL",
        metavar="LEVEL",
        help="debug, info, warning, error or critical.",
    ),
]


AllowedHostOption = Annotated[
    list[str] | None,
    typer.Option(
        "--allowed-host",
        metavar="NAME",
        help="A Host name the HTTP API answers to (repeat for more; any port): the bound address and localhost, 127.0.0.1, ::1 always are, any other Host header is a 421 (DNS rebinding). With API tokens on a wildcard address (0.0.0.0) and no --allowed-host, any host is answered; * answers any host (not with --no-auth).",
    ),
]


def server_cmd(
    store: StoreOption = DEFAULT_STORE,
    bus: ClusterBusOption = "",
    wait_for_engine: WaitForEngineOption = 0.0,
    standby: Annotated[
        bool,
        typer.Option(
            "--standby",
            help="Deprecated, changes nothing: every server is active and the servers share the partitions.",
        ),
    ] = False,
    sweep_interval: Annotated[
        float,
        typer.Option(
            "--sweep-interval",
            envvar="TIDEFLOW_SWEEP_INTERVAL",
            metavar="SECONDS",
            min=0,
            help="Seconds between two reconciliation sweeps (due timers, unrelayed outbox rows, runs never started: what a lost notification leaves); 0 turns the sweep off.",
        ),
    ] = 30.0,
    max_active_runs: Annotated[
        int | None,
        typer.Option(
            "--max-active-runs",
            envvar="TIDEFLOW_MAX_ACTIVE_RUNS",
            metavar="RUNS",
            min=1,
            help="Admission bound: at most this many runs of this server's partitions are active at once; the others wait pending and are admitted by priority, then oldest first, as runs end (default: a tenth of the run cache, 1000).",
        ),
    ] = None,
    max_tasks_in_flight: Annotated[
        int | None,
        typer.Option(
            "--max-tasks-in-flight",
            envvar="TIDEFLOW_MAX_TASKS_IN_FLIGHT",
            metavar="TASKS",
            min=1,
            help="No run is admitted while this server's runs have this many attempts in flight (dispatched or running): a lower bound keeps a step's wait behind the others short (dispatch latency) for some throughput (default: --max-active-runs).",
        ),
    ] = None,
    batch_size: Annotated[
        int,
        typer.Option(
            "--batch-size",
            envvar="TIDEFLOW_BATCH_SIZE",
            metavar="EVENTS",
            min=1,
            max=10_000,
            help="Most events the server applies and commits together: larger batches cost less per event under a backlog, smaller ones keep each commit (and the wait of an event behind it) short (PostgreSQL: ~70 us per event at 512).",
        ),
    ] = 512,
    http: Annotated[
        str | None,
        typer.Option(
            "--http",
            envvar="TIDEFLOW_HTTP",
            metavar="HOST:PORT",
            help="Also serve the REST API (docs/api.md) on this address (127.0.0.1:8080, 0.0.0.0:8080; port 0 picks a free one). Every request but /health and /ready needs an API token (tideflow tokens create).",
        ),
    ] = None,
    no_auth: Annotated[
        bool,
        typer.Option(
            "--no-auth",
            help="Serve the REST API without API tokens: anyone who connects may do anything, so --http must be a loopback address.",
        ),
    ] = False,
    allowed_host: AllowedHostOption = None,
    embedded: Annotated[
        bool,
        typer.Option(
            "--embedded",
            help="Everything in this one process: the store's engine, the in-process bus and --workers workers (a one-machine deployment, on SQLite by default); no --bus.",
        ),
    ] = False,
    workers: Annotated[
        int | None,
        typer.Option(
            "--workers",
            min=1,
            help="With --embedded: concurrent step executions (default 32). A cluster's servers run no steps: start `tideflow worker`.",
        ),
    ] = None,
    max_body: Annotated[
        str | None,
        typer.Option(
            "--max-body",
            envvar="TIDEFLOW_HTTP_MAX_BODY",
            metavar="SIZE",
            help="Largest request body the HTTP API takes (default 1MiB; 512KiB, 4MiB, bytes); a larger one is a 413, POST /events included.",
        ),
    ] = None,
    max_streams: Annotated[
        int | None,
        typer.Option(
            "--max-streams",
            envvar="TIDEFLOW_HTTP_MAX_STREAMS",
            metavar="N",
            min=1,
            help="Event streams (GET /streams/...) the HTTP API keeps open at once (default 500); past it a 429 with Retry-After.",
        ),
    ] = None,
    max_streams_per_token: Annotated[
        int | None,
        typer.Option(
            "--max-streams-per-token",
            envvar="TIDEFLOW_HTTP_MAX_STREAMS_PER_TOKEN",
            metavar="N",
            min=1,
            help="Event streams one API token may hold open at once (default 20; with --no-auth every stream counts as one token's); past it a 429 with Retry-After.",
        ),
    ] = None,
    event_sources: Annotated[
        Path | None,
        typer.Option(
            "--event-sources",
            envvar="TIDEFLOW_EVENT_SOURCES",
            metavar="FILE",
            help="The event gateway's sources (POST /events, docs/events.md): a YAML or JSON file naming each source, its auth (bearer or hmac, the secret in an environment variable) and the event types it may send. Without it, only API tokens may send events. Needs --http.",
        ),
    ] = None,
    verbose: VerboseOption = False,
    log_format: LogFormatOption = "auto",
    log_level: LogLevelOption = None,
) -> None:
    """Run one of a cluster's engines: scheduler, relay, timers and recovery, no workers.

    Start as many as you like on one store and bus: each holds leases on a
    share of the event partitions and applies their runs' events; a new one
    takes its share without a restart, and a dead one's partitions are taken
    over within the lease's TTL (TIDEFLOW_ENGINE_LEASE_TTL, 10 s) or the bus's
    delivery lease, whichever is longer. --wait-for-engine SECONDS waits for an
    embedded engine (`tideflow run`) on the store to exit. Every
    --sweep-interval seconds (30) it repairs what a lost notification left,
    with one indexed query per kind. SIGTERM or Ctrl-C:
    finish the batch in progress, release the partitions, exit 0. Logs go to
    stderr. --http 127.0.0.1:8080 serves the REST API beside it, every
    request but /health and /ready with an API token (`tideflow tokens
    create`); --no-auth serves it without, on loopback only; --event-sources
    FILE says who may send CloudEvents to its POST /events (docs/events.md);
    --allowed-host NAME is a Host name it answers to besides the bound address
    and localhost (docs/api.md).
    See docs/deployment.md, docs/api.md, docs/events.md and docs/security.md.

    --embedded runs the whole of tideflow in this one process instead (the
    store's one engine, the in-process bus, --workers workers): with --http it
    is a one-machine deployment, SQLite (the default store) included.

    Examples:
      tideflow server --store postgresql://tideflow@db/tideflow --bus redis://mq:6379/0
      tideflow server --embedded --http 127.0.0.1:8080
      tideflow server --bus redis://mq:6379/0 --http 127.0.0.1:8080
      TIDEFLOW_STORE=postgresql://… TIDEFLOW_BUS=nats://mq:4222 tideflow server
    """
    from tideflow.runtime.clock import clock_from_environment
    from tideflow.runtime.lease import ttl_from_environment
    from tideflow.runtime.server import ServerOptions, serve
    from tideflow.runtime.sweep import check_interval

    if embedded and bus:
        raise fail_usage(
            "--embedded uses the in-process bus: leave out --bus (and TIDEFLOW_BUS), or run "
            "a cluster's server without --embedded"
        )
    if not embedded and workers is not None:
        raise fail_usage(
            "a cluster's server runs no steps: start `tideflow worker` processes, or give "
            "--embedded to run workers in this process"
        )
    if not bus and not embedded:
        raise fail_usage(
            "give the cluster's bus: --bus redis://host:6379/0 (or TIDEFLOW_BUS), or "
            "--embedded for one process with the in-process bus"
        )
    try:
        clock = clock_from_environment(os.environ)
        ttl = ttl_from_environment(os.environ)
        limits = Limits.from_env(os.environ)
        sweep_interval = check_interval(sweep_interval)
    except (ValueError, TideflowError) as exc:
        raise fail_usage(str(exc)) from None
    if no_auth and not http:
        raise fail_usage("--no-auth is about the REST API: give --http HOST:PORT with it")
    if event_sources is not None and not http:
        raise fail_usage("--event-sources configures the HTTP API's event gateway: give --http too")
    if max_body is not None and not http:
        raise fail_usage("--max-body is about the HTTP API: give --http HOST:PORT with it")
    streams = {"max_streams": max_streams, "max_streams_per_token": max_streams_per_token}
    for name, cap in streams.items():
        if cap is not None and not http:
            flag = "--" + name.replace("_", "-")
            raise fail_usage(f"{flag} is about the HTTP API: give --http HOST:PORT with it")
    if allowed_host and not http:
        raise fail_usage("--allowed-host is about the HTTP API: give --http HOST:PORT with it")
    try:
        body_limit = parse_size(max_body, 0)  # 0: the API's default (1 MiB)
    except TideflowError as exc:
        raise fail_usage(f"--max-body: {exc.message}") from None
    if max_body is not None and body_limit < 1:
        raise fail_usage("--max-body must be at least 1 byte")
    setup_logging(verbose, log_level, log_format)
    metrics = _engine_metrics() if http else None
    services, listeners = (
        _http_service(
            http, not no_auth, event_sources, body_limit, metrics, streams, allowed_host or ()
        )
        if http
        else ((), ())
    )
    if standby:
        logging.getLogger("tideflow.server").warning(
            "--standby is deprecated and changes nothing: every server is active, the "
            "servers share the event partitions and take over a dead one's"
        )
    options = ServerOptions(
        store=store,
        bus=bus,
        wait_for_engine=wait_for_engine,
        lease_ttl=ttl,
        runtime={
            "clock": clock,
            "max_step_output": limits.step_output,
            "max_run_input": limits.run_input,
            "sweep_interval": sweep_interval,
            "max_active_runs": max_active_runs,
            "max_tasks_in_flight": max_tasks_in_flight,
            "batch_size": batch_size,
            **_worker_metrics(metrics, embedded),
        },
        services=services,
        listeners=listeners,
        hooks=(metrics.attach,) if metrics is not None else (),
        embedded=embedded,
        workers=(workers or 32) if embedded else 0,
        executors=registry() if embedded else None,
    )
    code = run_async(_serve(options, serve))
    raise typer.Exit(code)


def _worker_metrics(metrics: EngineMetrics | None, embedded: bool) -> dict[str, Any]:
    """An embedded server's workers time their attempts into the engine's metrics."""
    if metrics is None or not embedded:
        return {}
    return {"interceptors": [metrics.workers().interceptor]}


def _engine_metrics() -> EngineMetrics | None:
    """The engine's metrics for ``/metrics``; None (logged) without the metrics extra."""
    try:
        from tideflow.observability.metrics import EngineMetrics
    except ImportError as exc:
        logging.getLogger("tideflow.server").warning(
            "no /metrics: the metrics extra is not installed (%s is missing): pip install "
            "'tideflow[metrics]'",
            exc.name,
        )
        return None
    return EngineMetrics()


def _http_service(
    address: str,
    auth: bool,
    event_sources: Path | None,
    max_body: int,
    metrics: EngineMetrics | None = None,
    streams: dict[str, int | None] | None = None,
    allowed_hosts: Sequence[str] = (),
) -> tuple[tuple[Service], tuple[Listener]]:
    """The REST API and the web UI (and ``metrics`` on ``/metrics``) on ``address``, a
    listening socket already (a refused address, a port in use or a bad sources file is an
    exit 2 before the server starts); API tokens unless not ``auth``; ``streams``: the caps
    on open event streams given (``max_streams``, ``max_streams_per_token``; None: the
    API's default); answering to ``allowed_hosts`` (and the bound address and loopback
    names). With it, the listener that tells the UI's event streams of the runs'
    changes."""
    try:
        from tideflow.api.app import DEFAULT_MAX_BODY
        from tideflow.api.browsers import allowed_hosts as check_hosts
        from tideflow.api.changes import RunChanges
        from tideflow.api.compiling import compile_limits
        from tideflow.api.event_sources import EventSources, EventSourcesError
        from tideflow.api.serving import AddressRefused, http_api, listen, parse_address
        from tideflow.api.stream_slots import DEFAULT_MAX_STREAMS, DEFAULT_MAX_STREAMS_PER_TOKEN
    except ImportError as exc:
        raise fail_usage(
            f"--http needs the API's packages ({exc.name} is missing): pip install 'tideflow[api]'"
        ) from None
    try:
        sources = EventSources.load(event_sources) if event_sources else EventSources()
    except EventSourcesError as exc:
        raise fail_usage(f"--event-sources: {exc}") from None
    try:
        check_hosts(allowed_hosts, auth=auth)
        compile_limits(os.environ)
        host, port = parse_address(address, auth=auth)
        sock = listen(host, port)
    except (AddressRefused, ValueError) as exc:
        raise fail_usage(str(exc)) from None
    except OSError as exc:
        raise fail_usage(f"--http {address}: cannot listen there: {exc.strerror or exc}") from None
    changes = RunChanges()
    service = functools.partial(
        http_api,
        sock=sock,
        auth=auth,
        event_sources=sources,
        changes=changes,
        max_body=max_body or DEFAULT_MAX_BODY,
        metrics=metrics,
        max_streams=(streams or {}).get("max_streams") or DEFAULT_MAX_STREAMS,
        max_streams_per_token=(
            (streams or {}).get("max_streams_per_token") or DEFAULT_MAX_STREAMS_PER_TOKEN
        ),
        allowed_hosts=tuple(allowed_hosts),
    )
    return (service,), (changes.listener,)


async def _serve(options: Any, serve: Any) -> int:
    try:
        return int(await serve(options))
    except EngineAlreadyRunning as exc:
        raise EngineAlreadyRunning(f"{display_url(options.store)}: {exc.message}") from None
    except (TideflowError, OSError) as exc:
        if isinstance(exc, BusError):
            raise
        raise store_unavailable(options.store, exc) from None


def worker_cmd(
    bus: ClusterBusOption = "",
    queues: Annotated[
        str | None,
        typer.Option(
            "--queues",
            "-q",
            metavar="NAMES",
            help="Comma-separated queues to take tasks from (default: every queue).",
        ),
    ] = None,
    concurrency: Annotated[
        int, typer.Option("--concurrency", "-c", min=1, help="Attempts run at a time.")
    ] = 8,
    prefetch: Annotated[
        int | None,
        typer.Option(
            "--prefetch",
            min=1,
            help="Tasks held at most, running or waiting for a slot (default: --concurrency).",
        ),
    ] = None,
    path: Annotated[
        list[Path] | None,
        typer.Option(
            "--path",
            metavar="DIR",
            help="Put DIR first on sys.path, for `python` step functions (repeatable).",
        ),
    ] = None,
    grace: Annotated[
        float,
        typer.Option(
            "--grace",
            metavar="SECONDS",
            min=0,
            help="On SIGTERM, how long running attempts may take to finish before they are handed back.",
        ),
    ] = 30.0,
    store: Annotated[
        str | None,
        typer.Option(
            "--store",
            envvar="TIDEFLOW_STORE",
            metavar="URL",
            help="The cluster's store: needed only to run `idempotent: false` steps (their start is recorded before they run).",
        ),
    ] = None,
    metrics: Annotated[
        str | None,
        typer.Option(
            "--metrics",
            envvar="TIDEFLOW_WORKER_METRICS",
            metavar="HOST:PORT",
            help="Serve this worker's Prometheus metrics on http://HOST:PORT/metrics (no authentication: give an address only your scraper reaches; port 0 picks a free one). Needs tideflow[metrics].",
        ),
    ] = None,
    verbose: VerboseOption = False,
    log_format: LogFormatOption = "auto",
    log_level: LogLevelOption = None,
) -> None:
    """Run a worker pool on a cluster's bus: execute the tasks of its queues.

    Imports `python` step functions from this environment (--path first). SIGTERM
    or Ctrl-C: take no new task, give running attempts --grace seconds, hand
    back the rest, exit 0. A SIGKILLed worker's tasks are delivered to another
    worker once their lease (the bus URL's lease option) expires. Logs go to
    stderr. See docs/deployment.md.

    Examples:
      tideflow worker --bus redis://mq:6379/0 --queues default,high --concurrency 16
      tideflow worker --bus redis://mq:6379/0 --path ./flows --store postgresql://tideflow@db/tideflow
    """
    from tideflow.worker.process import WorkerOptions, work

    if not bus:
        raise fail_usage("give the cluster's bus: --bus redis://host:6379/0 (or TIDEFLOW_BUS)")
    names = [q.strip() for q in (queues or "").split(",") if q.strip()]
    if queues is not None and not names:
        raise fail_usage("--queues names no queue: give names separated by commas (default,high)")
    missing = [str(p) for p in path or () if not p.is_dir()]
    if missing:
        raise fail_usage(f"--path {missing[0]} is not a directory")
    try:
        limits = Limits.from_env(os.environ)
    except TideflowError as exc:
        raise fail_usage(exc.message) from None
    metrics_at = _metrics_address(metrics) if metrics is not None else None
    setup_logging(verbose, log_level, log_format)
    options = WorkerOptions(
        bus=bus,
        queues=names or None,
        concurrency=concurrency,
        prefetch=prefetch,
        paths=[str(p) for p in path or ()],
        grace=grace,
        store=store,
        max_output=limits.step_output,
        metrics=metrics_at,
    )
    raise typer.Exit(run_async(work(options)))


def _metrics_address(text: str) -> socket.socket:
    """``--metrics HOST:PORT`` as a listening socket, bound before the worker starts (a
    missing extra, a bad address or a port in use is an exit 2)."""
    try:
        from tideflow.observability.metrics import listen
    except ImportError:
        raise fail_usage(
            "--metrics needs the metrics extra (prometheus-client): pip install 'tideflow[metrics]'"
        ) from None
    host, sep, port = text.strip().rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise fail_usage(f"--metrics {text}: give HOST:PORT, such as 127.0.0.1:9464")
    try:
        return listen(host, int(port))
    except OSError as exc:
        raise fail_usage(f"--metrics {text}: cannot listen there: {exc.strerror or exc}") from None


__all__ = [
    "BUS_ENV",
    "EXIT_USAGE",
    "BusOption",
    "LogFormatOption",
    "LogLevelOption",
    "connected",
    "server_cmd",
    "setup_logging",
    "worker_cmd",
]
