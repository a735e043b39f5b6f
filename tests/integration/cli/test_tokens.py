"""`tideflow tokens create|list|revoke` on a SQLite file: shown once, stored hashed."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest

from tideflow.api.auth import authenticate
from tideflow.errors import RevokedToken
from tideflow.store.backends.sqlite import SqliteStore

from .conftest import Workdir, invoke, stdout_json

SHOWN = {"id", "name", "role", "created_at", "revoked_at", "last_used_at"}


def create(workdir: Workdir, name: str, role: str, *extra: str) -> dict[str, str]:
    done = invoke("tokens", "create", "--name", name, "--role", role, "--json", *extra,
                  "--store", workdir.store)  # fmt: skip
    assert done.exit_code == 0, done.stderr
    created: dict[str, str] = stdout_json(done)
    return created


def check(store: str, token: str) -> str:
    async def authenticated() -> str:
        s = SqliteStore(store)
        await s.open()
        try:
            return (await authenticate(s, f"Bearer {token}")).role.value
        finally:
            await s.close()

    return asyncio.run(authenticated())


def test_create_prints_the_token_once_and_it_authenticates(workdir: Workdir) -> None:
    done = invoke("tokens", "create", "--name", "ci", "--role", "operator",
                  "--store", workdir.store)  # fmt: skip
    assert done.exit_code == 0, done.stderr
    token = done.stdout.strip()
    assert token.startswith("tf_") and "\n" not in token  # stdout is the token alone
    assert "not shown again" in done.stderr and "role operator" in done.stderr
    assert check(workdir.store, token) == "operator"

    created = create(workdir, "dashboard", "viewer")
    assert set(created) == {"token", *SHOWN}
    assert created["token"].startswith(f"tf_{created['id']}_")
    assert (created["name"], created["role"], created["revoked_at"]) == (
        "dashboard",
        "viewer",
        None,
    )
    assert check(workdir.store, created["token"]) == "viewer"


def test_neither_the_store_nor_list_holds_a_secret(workdir: Workdir) -> None:
    created = create(workdir, "ci", "admin")
    secret = created["token"].split("_", 2)[2]
    dump = "\n".join(sqlite3.connect(workdir.db).iterdump())
    assert secret not in dump and created["id"] in dump

    listed = invoke("tokens", "list", "--json", "--store", workdir.store)
    assert listed.exit_code == 0, listed.stderr
    (row,) = stdout_json(listed)["tokens"]
    assert set(row) == SHOWN
    assert (row["id"], row["name"], row["role"]) == (created["id"], "ci", "admin")
    table = invoke("tokens", "list", "--store", workdir.store)
    assert created["id"] in table.stdout and "admin" in table.stdout
    for output in (listed.stdout, table.stdout):
        assert secret not in output and "sha256" not in output


def test_list_shows_when_a_token_last_authenticated(workdir: Workdir) -> None:
    used = create(workdir, "ci", "operator")
    idle = create(workdir, "idle", "viewer")
    check(workdir.store, used["token"])
    rows = stdout_json(invoke("tokens", "list", "--json", "--store", workdir.store))["tokens"]
    by_id = {row["id"]: row for row in rows}
    assert by_id[used["id"]]["last_used_at"] >= used["created_at"]  # ISO-8601 in UTC
    assert by_id[idle["id"]]["last_used_at"] is None
    table = invoke("tokens", "list", "--store", workdir.store).stdout
    assert "last used" in table and by_id[used["id"]]["last_used_at"] in table


def test_revoke_refuses_the_token_from_then_on(workdir: Workdir) -> None:
    created = create(workdir, "ci", "operator")
    kept = create(workdir, "other", "viewer")
    done = invoke("tokens", "revoke", created["id"], "--store", workdir.store)
    assert done.exit_code == 0, done.stderr
    assert f"revoked API token {created['id']} (ci)" in done.stdout
    with pytest.raises(RevokedToken):
        check(workdir.store, created["token"])
    assert check(workdir.store, kept["token"]) == "viewer"

    again = invoke("tokens", "revoke", created["id"], "--json", "--store", workdir.store)
    assert again.exit_code == 0
    shown = stdout_json(again)
    assert shown["revoked_now"] is False and shown["revoked_at"] is not None
    rows = stdout_json(invoke("tokens", "list", "--json", "--store", workdir.store))["tokens"]
    assert [(r["name"], r["revoked_at"] is not None) for r in rows] == [
        ("ci", True),
        ("other", False),
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["create", "--name", "ci", "--role", "root"], "unknown role 'root' (roles: viewer, operator, admin)"),
        (["create", "--name", "  ", "--role", "viewer"], "a token needs a name"),
        (["create", "--name", "ci", "--role", "viewer", "--store", "memory://"], "memory://"),
        (["revoke", "0123456789abcdef"], "no API token with id '0123456789abcdef'"),
    ],
)  # fmt: skip
def test_bad_input_is_a_clear_error_and_exit_2(
    workdir: Workdir, args: list[str], message: str
) -> None:
    create(workdir, "existing", "viewer")
    store = [] if "--store" in args else ["--store", workdir.store]
    done = invoke("tokens", *args, *store)
    assert done.exit_code == 2, done.stdout
    assert message in done.stderr
    failed = invoke("tokens", *args, "--json", *store)
    assert failed.exit_code == 2
    assert message in stdout_json(failed)["error"]["message"]
    rows = stdout_json(invoke("tokens", "list", "--json", "--store", workdir.store))["tokens"]
    assert [r["name"] for r in rows] == ["existing"]  # nothing was created


def test_a_bad_name_creates_no_store(workdir: Workdir) -> None:
    done = invoke("tokens", "create", "--name", "", "--role", "viewer", "--store", workdir.store)
    assert done.exit_code == 2
    assert not workdir.db.exists()


def test_list_on_a_missing_store_is_an_error(workdir: Workdir) -> None:
    done = invoke("tokens", "list", "--store", workdir.store)
    assert done.exit_code == 2
    assert "no store at" in done.stderr
