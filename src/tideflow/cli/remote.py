"""``--server URL --token TOKEN``: a `tideflow runs …`, `definitions …` or `queues` command
as a client of a `tideflow server`'s HTTP API (tideflow/remote_http.py) instead of the
store and bus. `connected` in cli/cluster.py hands the command an `HttpClient` then."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Annotated

import click
import typer

from tideflow.cli.common import fail_usage
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


def check_server(server: str | None) -> None:
    """A usage error (exit 2) for --server beside a --store or --bus given explicitly
    (on the command line or by their variables)."""
    if not server:
        return
    given = _given()
    if given:
        raise fail_usage(
            f"--server talks to the server's HTTP API: leave out {' and '.join(given)}"
        )


def _given() -> list[str]:
    context = click.get_current_context(silent=True)
    if context is None:
        return []
    explicit = {click.core.ParameterSource.COMMANDLINE, click.core.ParameterSource.ENVIRONMENT}
    return [
        f"--{name}"
        for name in ("store", "bus")
        if name in context.params and context.get_parameter_source(name) in explicit
    ]


@contextlib.asynccontextmanager
async def http_client(server: str, token: str | None) -> AsyncIterator[HttpClient]:
    try:
        opened = HttpClient(server, token=token)
    except ValueError as exc:
        raise fail_usage(str(exc)) from None
    async with opened as client:
        yield client
