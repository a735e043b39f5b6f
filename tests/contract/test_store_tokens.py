"""The Store port's API tokens, on every backend (memory, sqlite, postgres)."""

from __future__ import annotations

import dataclasses

import pytest

from tideflow.errors import StateFormatError
from tideflow.model.tokens import ApiToken, Role
from tideflow.store.base import Store, StoreError
from tideflow.store.sqlfiles import migrations

from .conftest import UNDO_SCHEMA_11, Backend
from .scenarios import UNDO_SCHEMA_6, UNDO_SCHEMA_10, Driver, short_plan

T0 = 1_000_000.0


def token(token_id: str, *, role: Role = Role.VIEWER, at: float = T0) -> ApiToken:
    return ApiToken(
        token_id=token_id,
        name=f"for {token_id}",
        role=role,
        secret_hash="sha256:" + "ab" * 32,
        created_at=at,
    )


async def test_a_created_token_reads_back_as_stored(store: Store) -> None:
    created = token("0123456789abcdef", role=Role.OPERATOR)
    await store.create_token(created)
    assert await store.get_token("0123456789abcdef") == created


async def test_an_unknown_token_id_is_none(store: Store) -> None:
    await store.create_token(token("aaaaaaaaaaaaaaaa"))
    assert await store.get_token("bbbbbbbbbbbbbbbb") is None
    assert await store.get_token("") is None


async def test_tokens_are_listed_oldest_first_then_by_id(store: Store) -> None:
    assert await store.list_tokens() == []
    late = token("0000000000000001", at=T0 + 5, role=Role.ADMIN)
    early_b = token("bbbbbbbbbbbbbbbb", at=T0)
    early_a = token("aaaaaaaaaaaaaaaa", at=T0)
    for t in (late, early_b, early_a):
        await store.create_token(t)
    assert await store.list_tokens() == [early_a, early_b, late]


async def test_a_taken_id_is_refused_and_the_first_token_kept(store: Store) -> None:
    first = token("aaaaaaaaaaaaaaaa", role=Role.VIEWER)
    await store.create_token(first)
    with pytest.raises(StoreError, match="aaaaaaaaaaaaaaaa"):
        await store.create_token(token("aaaaaaaaaaaaaaaa", role=Role.ADMIN))
    assert await store.get_token("aaaaaaaaaaaaaaaa") == first


async def test_revoking_marks_the_token_once_and_keeps_it_listed(store: Store) -> None:
    live = token("aaaaaaaaaaaaaaaa")
    other = token("bbbbbbbbbbbbbbbb")
    await store.create_token(live)
    await store.create_token(other)
    assert await store.revoke_token("aaaaaaaaaaaaaaaa", T0 + 10) is True
    revoked = dataclasses.replace(live, revoked_at=T0 + 10)
    assert await store.get_token("aaaaaaaaaaaaaaaa") == revoked
    assert revoked.revoked
    # a second revocation changes nothing: the first time stays
    assert await store.revoke_token("aaaaaaaaaaaaaaaa", T0 + 20) is False
    assert await store.get_token("aaaaaaaaaaaaaaaa") == revoked
    assert await store.list_tokens() == [revoked, other]
    assert await store.get_token("bbbbbbbbbbbbbbbb") == other


async def test_revoking_an_unknown_token_is_false(store: Store) -> None:
    assert await store.revoke_token("cccccccccccccccc", T0) is False
    assert await store.list_tokens() == []


async def test_a_tokens_use_is_recorded_and_only_ever_moves_on(store: Store) -> None:
    created = token("aaaaaaaaaaaaaaaa")
    other = token("bbbbbbbbbbbbbbbb")
    await store.create_token(created)
    await store.create_token(other)
    await store.record_token_use("aaaaaaaaaaaaaaaa", T0 + 60)
    used = dataclasses.replace(created, last_used_at=T0 + 60)
    assert await store.get_token("aaaaaaaaaaaaaaaa") == used
    await store.record_token_use("aaaaaaaaaaaaaaaa", T0 + 30)  # a slower request, older
    assert await store.get_token("aaaaaaaaaaaaaaaa") == used
    await store.record_token_use("cccccccccccccccc", T0)  # unknown: nothing happens
    assert await store.list_tokens() == [used, other]


async def test_tokens_outlive_the_process_that_created_them(sql_backend: Backend) -> None:
    first = await sql_backend.open()
    await first.create_token(token("aaaaaaaaaaaaaaaa", role=Role.ADMIN))
    await first.close()
    again = await sql_backend.open()
    assert [t.role for t in await again.list_tokens()] == [Role.ADMIN]


async def test_a_stored_role_this_tideflow_does_not_know_is_named(sql_backend: Backend) -> None:
    store = await sql_backend.open()
    await store.create_token(token("aaaaaaaaaaaaaaaa"))
    await sql_backend.raw("UPDATE api_tokens SET role = 'superuser'")
    with pytest.raises(StateFormatError, match=r"'aaaaaaaaaaaaaaaa'.*'superuser'"):
        await store.get_token("aaaaaaaaaaaaaaaa")


async def test_a_store_at_schema_4_upgrades_to_hold_tokens(sql_backend: Backend) -> None:
    """Migration 5 on a store an older tideflow wrote: its runs are kept, tokens work."""
    store = await sql_backend.open()
    driver = Driver(store)
    h = await driver.new_run(short_plan(), "kept")
    await driver.play([lambda: h.start()])
    await store.close()
    for statement in (*UNDO_SCHEMA_11, *UNDO_SCHEMA_10, *UNDO_SCHEMA_6):
        await sql_backend.raw(statement)
    await sql_backend.raw("DROP TABLE api_tokens")
    await sql_backend.raw("DELETE FROM schema_version WHERE version > 4")

    with pytest.raises(StoreError, match=r"is at schema 4, .*tideflow db upgrade"):
        await sql_backend.open(auto_upgrade=False)
    upgraded = await sql_backend.open()
    assert await upgraded.schema_version() == migrations(sql_backend.name)[-1].version
    assert (await upgraded.load_run("kept")).last_seq == 2
    await upgraded.create_token(token("aaaaaaaaaaaaaaaa"))
    assert [t.token_id for t in await upgraded.list_tokens()] == ["aaaaaaaaaaaaaaaa"]
