"""`tideflow definitions`: register, list and show the definitions kept in a store.

Definitions live in the store only: in a cluster these commands need its ``--store``;
``--bus`` (or ``TIDEFLOW_BUS``) is accepted, so that one set of options works for every
command, and not used. With ``--server`` (cli/remote.py) they go to a server's HTTP API
instead (a file to register is read here and sent as its text)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from tideflow.cli.cluster import BusOption
from tideflow.cli.common import (
    DEFAULT_STORE,
    JsonOption,
    StoreOption,
    iso,
    opened_runtime,
    opened_store,
    out,
    registry,
    run_async,
    table_console,
    write_json,
)
from tideflow.cli.remote import ServerOption, TokenOption, check_server, http_client

definitions_app = typer.Typer(
    help="Register, list and show workflow definitions kept in a store.", no_args_is_help=True
)


@definitions_app.command("register")
def register_cmd(
    ctx: typer.Context,
    files: Annotated[
        list[Path], typer.Argument(help="Definition files (YAML or JSON).", show_default=False)
    ],
    store: StoreOption = DEFAULT_STORE,
    bus: BusOption = None,
    server: ServerOption = None,
    token: TokenOption = None,
) -> None:
    """Compile definitions and register them (name, version) in the store.

    Registering the same content again changes nothing; other content under a
    version already registered is refused (exit 2): give it a new version.

    Examples:
      tideflow definitions register flows/*.yaml
      tideflow definitions register order.yaml --store postgresql://tideflow@db/tideflow
    """
    check_server(ctx, server)
    remote = (server, token) if server else None
    for line in run_async(_register(store, files, remote)):
        out.print(line, markup=False)


Remote = tuple[str, str | None] | None
"""``(server URL, token)`` for a command given ``--server`` (cli/remote.py)."""


async def _register(url: str, files: list[Path], remote: Remote) -> list[str]:
    lines = []
    if remote is not None:
        async with http_client(*remote) as client:
            for file in files:
                found = await client.register(file)
                lines.append(f"{file}: {found.name} {found.version} ({found.hash[:12]})")
        return lines
    async with opened_runtime(
        url, recover=False, workers=0, create=True, upgrade=True, executors=registry()
    ) as rt:
        for file in files:
            plan = await rt.register(file)
            lines.append(f"{file}: {plan.name} {plan.version} ({plan.hash[:12]})")
    return lines


@definitions_app.command("list")
def list_cmd(
    ctx: typer.Context,
    name: Annotated[str | None, typer.Option("--name", help="Only this workflow.")] = None,
    as_json: JsonOption = False,
    store: StoreOption = DEFAULT_STORE,
    bus: BusOption = None,
    server: ServerOption = None,
    token: TokenOption = None,
) -> None:
    """List registered definitions: name, title (when a definition has a `title:`),
    version, content hash, when registered, and whether the version is active (starts
    new runs).

    Examples:
      tideflow definitions list
      tideflow definitions list --name order-fulfillment --json
    """
    check_server(ctx, server)
    rows = run_async(_list(store, name, (server, token) if server else None))
    if as_json:
        write_json({"definitions": rows})
        return
    titled = any(row["title"] for row in rows)  # a "title" column when one has a title:
    table = Table("name", *(("title",) if titled else ()), "version", "hash", "registered")
    table.add_column("active")
    for row in rows:
        active = "yes" if row["active"] else "no"
        title = (escape(row["title"] or ""),) if titled else ()
        table.add_row(
            escape(row["name"]),
            *title,
            escape(row["version"]),
            row["hash"][:12],
            row["created_at"],
            active,
        )
    table_console().print(table)


async def _list(url: str, name: str | None, remote: Remote) -> list[dict[str, Any]]:
    if remote is not None:
        async with http_client(*remote) as client:
            found = await client.definitions(name)
    else:
        async with opened_store(url) as store:
            found = await store.list_definitions(name)
    return [
        {
            "name": d.name,
            "title": d.title,
            "version": d.version,
            "hash": d.hash,
            "created_at": iso(d.created_at),
            "active": d.active,
        }
        for d in found
    ]


VersionArgument = Annotated[
    str, typer.Argument(metavar="VERSION", help="The version.", show_default=False)
]
NameArgument = Annotated[str, typer.Argument(help="The workflow name.", show_default=False)]


@definitions_app.command("activate")
def activate_cmd(
    ctx: typer.Context,
    name: NameArgument,
    version: VersionArgument,
    store: StoreOption = DEFAULT_STORE,
    bus: BusOption = None,
    server: ServerOption = None,
    token: TokenOption = None,
) -> None:
    """Activate a registered version: it starts runs again (by name, by version, from
    an event). Every version is active when registered.

    Examples:
      tideflow definitions activate order-fulfillment 1.2.0
    """
    check_server(ctx, server)
    remote = (server, token) if server else None
    changed = run_async(_set_active(store, remote, name, version, True))
    _report_activity(name, version, changed, True)


@definitions_app.command("deactivate")
def deactivate_cmd(
    ctx: typer.Context,
    name: NameArgument,
    version: VersionArgument,
    store: StoreOption = DEFAULT_STORE,
    bus: BusOption = None,
    server: ServerOption = None,
    token: TokenOption = None,
) -> None:
    """Deactivate a registered version: it starts no new run; its runs go on.

    Starting the workflow by name then starts its highest active version; starting
    this version by number, or by an event its triggers take, is refused.

    Examples:
      tideflow definitions deactivate order-fulfillment 1.1.0
    """
    check_server(ctx, server)
    remote = (server, token) if server else None
    changed = run_async(_set_active(store, remote, name, version, False))
    _report_activity(name, version, changed, False)


async def _set_active(url: str, remote: Remote, name: str, version: str, active: bool) -> bool:
    if remote is not None:
        async with http_client(*remote) as client:
            return await client.activate(name, version, active)
    async with opened_store(url) as store:
        return await store.set_definition_active(name, version, active)


def _report_activity(name: str, version: str, changed: bool, active: bool) -> None:
    state = "active" if active else "deactivated"
    out.print(f"{name} {version}: {state}" + ("" if changed else " (it was already)"), markup=False)


@definitions_app.command("show")
def show_cmd(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The workflow name.", show_default=False)],
    version: Annotated[
        str | None,
        typer.Option("--version", help="A version (default: the highest active one)."),
    ] = None,
    as_json: JsonOption = False,
    store: StoreOption = DEFAULT_STORE,
    bus: BusOption = None,
    server: ServerOption = None,
    token: TokenOption = None,
) -> None:
    """Print a registered definition in its normalised form (YAML, or JSON with --json).

    Examples:
      tideflow definitions show order-fulfillment
      tideflow definitions show order-fulfillment --version 1.2.0 --json
    """
    check_server(ctx, server)
    source = run_async(_show(store, name, version, (server, token) if server else None))
    if as_json:
        write_json(source)
    else:
        import yaml

        out.print(
            yaml.safe_dump(source, sort_keys=False, allow_unicode=True).rstrip(), markup=False
        )


async def _show(url: str, name: str, version: str | None, remote: Remote) -> dict[str, Any]:
    if remote is not None:
        async with http_client(*remote) as client:
            return dict((await client.definition(name, version)).source or {})
    async with opened_runtime(url, recover=False, workers=0, executors=registry()) as rt:
        plan = await rt.client.definition(name, version)
    return dict(plan.source)
