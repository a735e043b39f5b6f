"""`tideflow ui`: the web UI over a local store, with the store's engine in this process.

It is `tideflow server --embedded` with the HTTP API and the UI on a loopback address,
guarded by a one-time link instead of API tokens (Jupyter-style): the command prints
``http://127.0.0.1:PORT/ui/login?code=…``; the first browser to open it gets an HttpOnly
session cookie, and the code is spent. Nothing else gets in, API included.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Annotated

import typer

from tideflow.cli.cluster import AllowedHostOption, VerboseOption, _serve, setup_logging
from tideflow.cli.common import (
    DEFAULT_STORE,
    Limits,
    StoreOption,
    fail_usage,
    registry,
    run_async,
)
from tideflow.errors import TideflowError

if TYPE_CHECKING:
    from tideflow.client import Client
    from tideflow.lifecycle import Stop

log = logging.getLogger("tideflow.ui")


def ui_cmd(
    store: StoreOption = DEFAULT_STORE,
    http: Annotated[
        str,
        typer.Option(
            "--http",
            metavar="HOST:PORT",
            help="Where to serve it: a loopback address (port 0 picks a free one).",
        ),
    ] = "127.0.0.1:8765",
    workers: Annotated[
        int, typer.Option("--workers", min=1, help="Concurrent step executions.")
    ] = 8,
    allowed_host: AllowedHostOption = None,
    verbose: VerboseOption = False,
) -> None:
    """Serve the web UI for a local store, running its engine and workers here.

    Prints a link with a one-time code: open it in a browser (it works once).
    The runs list, each run's graph coloured by step state (live), the
    timeline of attempts, each step's input, output and error, the history,
    cancel / retry / signal; definitions and queues. Ctrl-C stops it. Another
    engine on the store (`tideflow run`, `tideflow server`) must stop first.
    It answers to the Host names localhost, 127.0.0.1, ::1 and the bound
    address only, and to those --allowed-host NAME adds (DNS rebinding). See
    docs/observability.md (Web UI).

    Examples:
      tideflow ui
      tideflow ui --store sqlite:///runs.db --http 127.0.0.1:0
    """
    from tideflow.runtime.clock import clock_from_environment
    from tideflow.runtime.lease import ttl_from_environment
    from tideflow.runtime.server import ServerOptions, serve

    try:
        from tideflow.api.browsers import allowed_hosts as check_hosts
        from tideflow.api.changes import RunChanges
        from tideflow.api.compiling import compile_limits
        from tideflow.api.serving import AddressRefused, address_of, http_api, listen, parse_address
        from tideflow.ui.sessions import Sessions
    except ImportError as exc:
        raise fail_usage(
            f"the web UI needs the API's packages ({exc.name} is missing): "
            "pip install 'tideflow[api]'"
        ) from None
    try:
        clock = clock_from_environment(os.environ)
        ttl = ttl_from_environment(os.environ)
        limits = Limits.from_env(os.environ)
        allowed = tuple(allowed_host or ())
        check_hosts(allowed, auth=False)
        compile_limits(os.environ)
        host, port = parse_address(http)
        parse_address(http, auth=False)
        sock = listen(host, port)
    except AddressRefused as exc:
        if "HOST:PORT" in str(exc):
            raise fail_usage(str(exc)) from None
        raise fail_usage(
            f"--http {http}: `tideflow ui` listens on a loopback address only (127.0.0.1, "
            "::1 or localhost); to serve the UI to other machines run `tideflow server "
            "--http HOST:PORT`, where people log in with API tokens"
        ) from None
    except OSError as exc:
        raise fail_usage(f"--http {http}: cannot listen there: {exc.strerror or exc}") from None
    except (ValueError, TideflowError) as exc:
        raise fail_usage(str(exc)) from None
    changes, sessions = RunChanges(), Sessions.local()

    @contextlib.asynccontextmanager
    async def service(client: Client, stop: Stop) -> AsyncIterator[None]:
        served = http_api(
            client,
            stop,
            sock,
            auth=False,
            changes=changes,
            sessions=sessions,
            allowed_hosts=allowed,
        )
        async with served:
            link = f"{address_of(sock)}/ui/login?code={sessions.code}"
            print(f"tideflow ui: open {link}", file=sys.stdout, flush=True)
            log.info("the web UI is ready; its link works once")
            yield

    setup_logging(verbose, None, "auto")
    options = ServerOptions(
        store=store,
        bus="",
        lease_ttl=ttl,
        runtime={
            "clock": clock,
            "max_step_output": limits.step_output,
            "max_run_input": limits.run_input,
        },
        services=(service,),
        listeners=(changes.listener,),
        embedded=True,
        workers=workers,
        executors=registry(),
    )
    raise typer.Exit(run_async(_serve(options, serve)))
