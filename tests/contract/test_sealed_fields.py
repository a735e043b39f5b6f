"""Fields a definition declares ``sensitive`` are encrypted in every row a SQL store writes.

A real runtime runs a workflow whose first step takes a sensitive run input and returns
a sensitive output; a wait step holds the run while the runtime is closed and every row
of every table is read with the database's own driver (sqlite3, asyncpg); a second
runtime on the same database finishes the run, and the last step must receive both
values in clear. Then keys: a wrong key and a missing key are clear errors, rotation
reads the old key and seals with the new one, and without a key a PostgreSQL store
refuses the start while a SQLite store makes a private key file beside the database.
"""

from __future__ import annotations

import base64
import os
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tideflow.dsl import compile_definition
from tideflow.errors import NotFound, StateFormatError, StoreError, UnstorableData
from tideflow.model.events import SignalReceived
from tideflow.model.plan import Plan
from tideflow.runtime.runtime import Runtime
from tideflow.store.sealing import KEY_VARIABLE, OLD_KEYS_VARIABLE, SEALED_PREFIX
from tideflow.testing.waiting import step_is, wait_until
from tideflow.worker.executors.functions import register, unregister

from .conftest import Backend

CARD = "4111-1111-1111-1111"
TOKEN = "tok-7c1e9a53b2d84f06"
WAIT = 30.0

PLAN: Plan = compile_definition(
    textwrap.dedent(
        """
        name: vault
        version: "1"
        steps:
          - id: tokenize
            type: python
            function: sealed.tokenize
            input: {card_number: "{{ inputs.card_number }}"}
            sensitive: [card_number, api_token]
          - {id: confirm, type: wait, signal: go, depends_on: [tokenize]}
          - id: pay
            type: python
            function: sealed.pay
            depends_on: [confirm]
            input:
              card_number: "{{ inputs.card_number }}"
              api_token: "{{ steps.tokenize.output.api_token }}"
        """
    )
)
PLAIN: Plan = compile_definition(
    textwrap.dedent(
        """
        name: plain
        version: "1"
        steps:
          - {id: echo, type: python, function: sealed.echo, input: {v: "{{ inputs.v }}"}}
        """
    )
)


def key(key_id: str, fill: int) -> str:
    return f"{key_id}:{base64.urlsafe_b64encode(bytes([fill]) * 32).decode()}"


@pytest.fixture(autouse=True)
def functions() -> Iterator[list[dict[str, Any]]]:
    received: list[dict[str, Any]] = []

    def pay(**values: Any) -> dict[str, Any]:
        received.append(values)
        return {"paid": True}

    register("sealed.tokenize")(lambda card_number: {"api_token": TOKEN, "last4": card_number[-4:]})
    register("sealed.pay")(pay)
    register("sealed.echo")(lambda v: v)
    yield received
    for name in ("sealed.tokenize", "sealed.pay", "sealed.echo"):
        unregister(name)


@pytest.fixture(autouse=True)
def no_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_VARIABLE, raising=False)
    monkeypatch.delenv(OLD_KEYS_VARIABLE, raising=False)


async def raw_text(backend: Backend) -> str:
    """Every row of every table of the store's database, as text."""
    assert backend.raw is not None
    if backend.name == "sqlite":
        tables = [
            r[0] for r in await backend.raw("SELECT name FROM sqlite_master WHERE type='table'")
        ]
    else:
        tables = [
            r[0]
            for r in await backend.raw(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = current_schema()"
            )
        ]
    assert "runs" in tables and "history" in tables and "outbox" in tables
    rows = [
        repr(tuple(row)) for table in tables for row in await backend.raw(f"SELECT * FROM {table}")
    ]
    return "\n".join(rows)


async def start_and_hold(backend: Backend) -> None:
    async with Runtime(store=backend.make()) as rt:
        await rt.start_run(PLAN, {"card_number": CARD}, run_id="r1")
        await wait_until(rt, "r1", step_is("confirm", "waiting"), timeout=WAIT)


async def finish(backend: Backend) -> str:
    async with Runtime(store=backend.make()) as rt:
        await rt.signal("r1", "go", {"ok": True})
        return (await rt.wait("r1", WAIT)).status


async def test_sensitive_values_are_ciphertext_in_every_row_and_the_run_survives_a_restart(
    sql_backend: Backend, monkeypatch: pytest.MonkeyPatch, functions: list[dict[str, Any]]
) -> None:
    monkeypatch.setenv(KEY_VARIABLE, key("k1", 1))
    await start_and_hold(sql_backend)
    held = await raw_text(sql_backend)
    assert CARD not in held and TOKEN not in held
    assert f"{SEALED_PREFIX}k1:" in held

    assert await finish(sql_backend) == "succeeded"
    assert functions == [{"card_number": CARD, "api_token": TOKEN}]  # after the restart
    done = await raw_text(sql_backend)
    assert CARD not in done and TOKEN not in done
    assert '"last4": "1111"' in done or '"last4":"1111"' in done  # not declared: as it is


async def test_a_run_without_sensitive_fields_is_stored_as_it_was(
    sql_backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_VARIABLE, key("k1", 1))
    async with Runtime(store=sql_backend.make()) as rt:
        await rt.start_run(PLAIN, {"v": "visible-value"}, run_id="p1")
        assert (await rt.wait("p1", WAIT)).output == {"echo": "visible-value"}
    text = await raw_text(sql_backend)
    assert "visible-value" in text and SEALED_PREFIX not in text


async def test_a_wrong_key_or_a_missing_key_is_a_clear_error_not_garbage(
    sql_backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_VARIABLE, key("k1", 1))
    await start_and_hold(sql_backend)

    monkeypatch.setenv(KEY_VARIABLE, key("k1", 2))  # the same id, other bytes
    store = await sql_backend.open()
    with pytest.raises(StateFormatError, match="encrypted with key 'k1' does not decrypt"):
        await store.load_run("r1")
    with pytest.raises(StateFormatError, match="does not decrypt"):
        await store.history("r1")

    monkeypatch.setenv(KEY_VARIABLE, key("k2", 2))
    store = await sql_backend.open()
    with pytest.raises(StateFormatError, match=r"key 'k1', which this process does not have"):
        await store.load_run("r1")


async def test_rotation_opens_old_values_and_seals_new_ones_with_the_current_key(
    sql_backend: Backend, monkeypatch: pytest.MonkeyPatch, functions: list[dict[str, Any]]
) -> None:
    monkeypatch.setenv(KEY_VARIABLE, key("k1", 1))
    await start_and_hold(sql_backend)
    monkeypatch.setenv(KEY_VARIABLE, key("k2", 2))
    monkeypatch.setenv(OLD_KEYS_VARIABLE, key("k1", 1))
    assert await finish(sql_backend) == "succeeded"
    assert functions == [{"card_number": CARD, "api_token": TOKEN}]
    text = await raw_text(sql_backend)
    assert f"{SEALED_PREFIX}k2:" in text  # what the second runtime wrote
    assert CARD not in text and TOKEN not in text


@pytest.mark.parametrize("sql_backend", ["postgres"], indirect=True)  # SQLite: next test
async def test_postgres_without_a_key_refuses_the_start_and_writes_nothing(
    sql_backend: Backend,
) -> None:
    async with Runtime(store=sql_backend.make()) as rt:
        with pytest.raises(UnstorableData, match=f"set {KEY_VARIABLE}.*openssl rand -base64 32"):
            await rt.start_run(PLAN, {"card_number": CARD}, run_id="r1")
        with pytest.raises(NotFound):
            await rt.store.get_run("r1")
        await rt.start_run(PLAIN, {"v": "x"}, run_id="p1")  # no sensitive field: no key needed
        assert (await rt.wait("p1", WAIT)).status == "succeeded"
    assert CARD not in await raw_text(sql_backend)


async def test_sqlite_without_a_key_makes_a_private_key_file_beside_the_database(
    tmp_path: Path,
) -> None:
    from .conftest import sqlite_backend

    backend = sqlite_backend(tmp_path)
    await start_and_hold(backend)
    key_file = tmp_path / "store.db.key"
    assert key_file.stat().st_mode & 0o777 == 0o600
    assert CARD not in await raw_text(backend)
    assert await finish(backend) == "succeeded"  # the next process reads the same file
    os.chmod(key_file, 0o600)
    key_file.write_text(key(key_file.read_text().split(":")[0], 9))
    store = await backend.open()
    try:
        with pytest.raises(StateFormatError, match="does not decrypt"):
            await store.history("r1")
    finally:
        await store.close()


async def test_an_event_left_in_the_inbox_by_another_process_is_sealed(
    sql_backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_VARIABLE, key("k1", 1))
    await start_and_hold(sql_backend)
    store = await sql_backend.open()  # as a CLI in another process opens it
    payload = {"card_number": CARD, "note": "visible"}
    await store.add_to_inbox(
        [SignalReceived(event_id="s1", run_id="r1", time=1.0, name="go", payload=payload)]
    )
    text = await raw_text(sql_backend)
    assert CARD not in text and "visible" in text
    (event,) = await store.inbox()
    assert isinstance(event, SignalReceived) and event.payload == payload


async def test_a_sqlite_file_without_its_key_file_says_so(tmp_path: Path) -> None:
    from .conftest import sqlite_backend

    backend = sqlite_backend(tmp_path)
    await start_and_hold(backend)
    (tmp_path / "store.db.key").unlink()  # the database copied without its key
    store = await backend.open()
    try:
        with pytest.raises(StateFormatError, match=r"key file .*store\.db\.key is missing"):
            await store.load_run("r1")
    finally:
        await store.close()


@pytest.mark.parametrize("text", ["k1", "k1:short", "no good:AAAA"])
async def test_a_malformed_key_stops_the_store_when_it_opens(
    sql_backend: Backend, monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    monkeypatch.setenv(KEY_VARIABLE, text)
    with pytest.raises(StoreError, match=KEY_VARIABLE):
        await sql_backend.open()
