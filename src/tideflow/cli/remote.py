"""``--server URL --token TOKEN``: a `tideflow runs …`, `definitions …` or `queues` command
as a client of a `tideflow server`'s HTTP API (tideflow/remote_http.py) instead of the
store and bus. `connected` in cli/cluster.py hands the command an `HttpClient` then."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Annotated

import typer

from tideflow.cli.common import fail_usage

if TYPE_CHECKING:
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


def check_server(context: typer.Context, server: str | None) -> None:
    """A usage error (exit 2) for --server beside a --store or a --bus, on the command line
    or from their variables, even one that names the default store: which one to use is
    unclear."""
    if not server:
        return
    given = [
        option
        for option, name in (("--store", "store"), ("--bus", "bus"))
        if _was_given(context, name)
    ]
    if given:
        raise fail_usage(
            f"--server talks to the server's HTTP API: leave out {' and '.join(given)} "
            "(or TIDEFLOW_STORE / TIDEFLOW_BUS)"
        )


def _was_given(context: typer.Context, name: str) -> bool:
    """Whether the option ``name`` came from the command line or its variable, not from
    its default."""
    source = context.get_parameter_source(name)
    return source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT")


@contextlib.asynccontextmanager
async def http_client(server: str, token: str | None) -> AsyncIterator[HttpClient]:
    from tideflow.remote_http import HttpClient  # httpx: imported by the commands that use it

    try:
        opened = HttpClient(server, token=token)
    except ValueError as exc:
        raise fail_usage(str(exc)) from None
    async with opened as client:
        yield client
