"""``--server URL --token TOKEN``: a `tideflow runs …`, `definitions …` or `queues` command
as a client of a `tideflow server`'s HTTP API (tideflow/remote_http.py) instead of the
store and bus. `connected` in cli/cluster.py hands the command an `HttpClient` then."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Annotated

import typer

from tideflow.cli.common import DEFAULT_STORE, fail_usage
from tideflow.remote_http import HttpClient

SERVER_ENV = "TIDEFLOW_SERVER"
TOKEN_ENV = "TIDEFLOW_TOKEN"

ServerOption = Annotated[
    str | None,
    typer.Option(
        "--server",
        envvar=SERVER_ENV,
        metavar="URL",
        help=(
            "A tideflow server's HTTP API (http://host:8080): the command goes to it "
            "instead of a store (not with --store or --bus)."
        ),
    ),
]
TokenOption = Annotated[
    str | None,
    typer.Option(
        "--token",
        envvar=TOKEN_ENV,
        metavar="TOKEN",
        help="The API token --server needs (tideflow tokens create prints it).",
        show_default=False,
    ),
]


def check_server(server: str | None, store: str = DEFAULT_STORE, bus: str | None = None) -> None:
    """A usage error (exit 2) for --server beside a --store (other than the default) or a
    --bus, on the command line or from their variables: which one to use is unclear."""
    if not server:
        return
    given = [name for name, on in (("--store", store != DEFAULT_STORE), ("--bus", bool(bus))) if on]
    if given:
        raise fail_usage(
            f"--server talks to the server's HTTP API: leave out {' and '.join(given)} "
            "(or TIDEFLOW_STORE / TIDEFLOW_BUS)"
        )


@contextlib.asynccontextmanager
async def http_client(server: str, token: str | None) -> AsyncIterator[HttpClient]:
    try:
        opened = HttpClient(server, token=token)
    except ValueError as exc:
        raise fail_usage(str(exc)) from None
    async with opened as client:
        yield client
