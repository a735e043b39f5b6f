"""`tideflow tokens create|list|revoke`: the API tokens kept in a store (api/auth.py).

A token's secret is printed once, by ``create``, and is kept nowhere: the store holds
its SHA-256 digest. ``list`` shows ids, names, roles and dates, never a digest."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from tideflow.cli.common import (
    DEFAULT_STORE,
    JsonOption,
    StoreOption,
    display_url,
    err,
    fail_usage,
    iso,
    opened_store,
    out,
    run_async,
    table_console,
    write_json,
)
from tideflow.model.tokens import Role

if TYPE_CHECKING:
    from tideflow.api.auth import IssuedToken
    from tideflow.model.tokens import ApiToken

tokens_app = typer.Typer(
    help="Create, list and revoke the API tokens of a store (roles viewer, operator, admin).",
    no_args_is_help=True,
)
ROLES = ", ".join(role.value for role in Role)
COLUMNS = ("id", "name", "role", "created_at", "revoked_at", "last_used_at")
"""What ``list`` shows of a token, in its order (``_shown``'s keys)."""


@tokens_app.command("create")
def create_cmd(
    name: Annotated[
        str,
        typer.Option("--name", help="Who or what the token is for (ci, payments-webhook)."),
    ],
    role: Annotated[str, typer.Option("--role", metavar="ROLE", help=f"One of: {ROLES}.")],
    as_json: JsonOption = False,
    store: StoreOption = DEFAULT_STORE,
) -> None:
    """Create an API token and print it, the only time it is shown.

    The token goes to stdout alone (TOKEN=$(tideflow tokens create …) keeps it);
    the store keeps only a hash of its secret, so a lost token cannot be shown
    again: revoke it and create another. Roles: viewer (read), operator (start,
    cancel, signal, retry, and read), admin (definitions and tokens, and all an
    operator may do). --json prints {"token", "id", "name", "role", "created_at",
    "revoked_at", "last_used_at"}.

    Examples:
      tideflow tokens create --name ci --role operator
      tideflow tokens create --name dashboard --role viewer --store postgresql://tideflow@db/tideflow
    """
    from tideflow.api.auth import token_name

    try:
        chosen = Role.parse(role)
        name = token_name(name)
    except ValueError as exc:
        raise fail_usage(str(exc)) from None
    if store.split(":", 1)[0].lower() == "memory":
        raise fail_usage(
            "memory:// keeps nothing after this command: a token created there is gone at once",
            hint="pass --store sqlite:///… or postgresql://…, the store the server uses",
        )
    issued = run_async(_create(store, name, chosen))
    if as_json:
        write_json({"token": issued.value, **_shown(issued.token)})
        return
    out.print(issued.value, markup=False)
    err.print(
        f"created API token {issued.token.token_id} ({name}, role {chosen}) in "
        f"{display_url(store)}: keep it now, it is not shown again",
        markup=False,
    )


async def _create(url: str, name: str, role: Role) -> IssuedToken:
    from tideflow.api.auth import issue_token

    async with opened_store(url, create=True, upgrade=True) as store:
        return await issue_token(store, name=name, role=role, now=time.time())


@tokens_app.command("list")
def list_cmd(as_json: JsonOption = False, store: StoreOption = DEFAULT_STORE) -> None:
    """List API tokens, revoked ones too: id, name, role, when created, revoked, last used.

    Secrets and their hashes are never shown. --json prints {"tokens": [{"id",
    "name", "role", "created_at", "revoked_at", "last_used_at"}]}; a token's use
    is recorded to the minute.

    Examples:
      tideflow tokens list
      tideflow tokens list --json --store sqlite:///orders.db
    """
    tokens = [_shown(token) for token in run_async(_list(store))]
    if as_json:
        write_json({"tokens": tokens})
        return
    table = Table("id", "name", "role", "created", "revoked", "last used")
    for row in tokens:
        table.add_row(*(row[key] for key in COLUMNS))
    table_console().print(table)


async def _list(url: str) -> list[ApiToken]:
    async with opened_store(url) as store:
        return await store.list_tokens()


@tokens_app.command("revoke")
def revoke_cmd(
    token_id: Annotated[
        str, typer.Argument(metavar="ID", help="The token's id (tokens list).", show_default=False)
    ],
    as_json: JsonOption = False,
    store: StoreOption = DEFAULT_STORE,
) -> None:
    """Revoke an API token: requests with it are refused from now on.

    Revoking a revoked token changes nothing (its first revocation time stays);
    an id the store has no token for is an error (exit 2). --json prints the
    token as `tokens list` does, and "revoked_now" (false when it was already).

    Examples:
      tideflow tokens revoke 3f9c2a7b1d4e8f60
    """
    token, now = run_async(_revoke(store, token_id))
    if as_json:
        write_json({**_shown(token), "revoked_now": now})
    elif now:
        out.print(f"revoked API token {token.token_id} ({token.name})", markup=False)
    else:
        out.print(
            f"API token {token.token_id} ({token.name}) was already revoked at "
            f"{iso(token.revoked_at)}",
            markup=False,
        )


async def _revoke(url: str, token_id: str) -> tuple[ApiToken, bool]:
    async with opened_store(url) as store:
        revoked = await store.revoke_token(token_id, time.time())
        token = await store.get_token(token_id)
    if token is None:
        raise fail_usage(f"no API token with id {token_id!r} in {display_url(url)}")
    return token, revoked


def _shown(token: ApiToken) -> dict[str, Any]:
    """What may be shown of a token: never its secret's hash."""
    return {
        "id": token.token_id,
        "name": token.name,
        "role": token.role.value,
        "created_at": iso(token.created_at),
        "revoked_at": iso(token.revoked_at),
        "last_used_at": iso(token.last_used_at),
    }
