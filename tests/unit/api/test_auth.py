"""API tokens: issued once, stored hashed, checked in constant time, roles enforced."""

from __future__ import annotations

import dataclasses
import hmac
import itertools
from typing import Any

import pytest

from tideflow.api import auth
from tideflow.api.auth import (
    Action,
    Principal,
    Role,
    authenticate,
    issue_token,
    require,
)
from tideflow.errors import (
    Forbidden,
    MalformedToken,
    MissingToken,
    RevokedToken,
    StoreUnavailable,
    Unauthenticated,
    UnknownToken,
    WrongSecret,
)
from tideflow.model.tokens import PERMISSIONS
from tideflow.store.backends.memory import MemoryStore

T0 = 1_000_000.0


async def issued(role: Role = Role.OPERATOR) -> tuple[MemoryStore, str]:
    store = MemoryStore()
    token = await issue_token(store, name="ci", role=role, now=T0)
    return store, token.value


async def test_a_token_authenticates_as_its_role() -> None:
    store, value = await issued(Role.OPERATOR)
    principal = await authenticate(store, f"Bearer {value}")
    (stored,) = await store.list_tokens()
    assert principal == Principal(token_id=stored.token_id, name="ci", role=Role.OPERATOR)
    assert value.startswith(f"tf_{stored.token_id}_")


async def test_the_scheme_is_case_insensitive_and_spaces_around_are_ignored() -> None:
    store, value = await issued()
    assert (await authenticate(store, f"  bearer   {value} ")).role is Role.OPERATOR


async def test_the_stored_row_holds_the_secrets_digest_never_the_secret() -> None:
    store, value = await issued()
    (stored,) = await store.list_tokens()
    secret = value.split("_", 2)[2]
    row = dataclasses.asdict(stored)
    assert all(secret not in str(field) for field in row.values())
    assert all(value not in str(field) for field in row.values())
    assert stored.secret_hash == auth.hash_secret(secret)
    assert stored.secret_hash.startswith("sha256:") and len(stored.secret_hash) == 7 + 64


async def test_every_token_is_new() -> None:
    store = MemoryStore()
    values = {
        (await issue_token(store, name="x", role=Role.VIEWER, now=T0)).value for _ in range(20)
    }
    assert len(values) == 20
    assert len({t.token_id for t in await store.list_tokens()}) == 20


@pytest.mark.parametrize("header", [None, "", "   "])
async def test_no_token(header: str | None) -> None:
    store, _ = await issued()
    with pytest.raises(MissingToken, match="Authorization: Bearer"):
        await authenticate(store, header)


@pytest.mark.parametrize(
    ("header", "said"),
    [
        ("Basic dXNlcjpwYXNz", "the Authorization scheme is 'Basic', not Bearer"),
        ("tf_0123456789abcdef_" + "A" * 43, "the Authorization scheme is missing, not Bearer"),
        ("Bearer tf_0123", "not `Bearer tf_<id>_<secret>`"),
    ],
)
async def test_a_malformed_token_says_what_is_wrong(header: str, said: str) -> None:
    store, _ = await issued()
    with pytest.raises(MalformedToken) as caught:
        await authenticate(store, header)
    assert said in caught.value.message
    assert "A" * 10 not in caught.value.message


@pytest.mark.parametrize(
    "mangle",
    [
        lambda v: v,  # no scheme at all
        lambda v: f"Basic {v}",
        lambda v: f"Token {v}",
        lambda v: "Bearer",
        lambda v: "Bearer ",
        lambda v: f"Bearer {v[3:]}",  # without tf_
        lambda v: f"Bearer {v}x",  # secret too long
        lambda v: f"Bearer {v[:-1]}",  # secret too short
        lambda v: f"Bearer {v[:-1]}!",  # not the URL-safe alphabet
        lambda v: f"Bearer {v.upper()}",  # the id is lower-case hex
        lambda v: f"Bearer {v} {v}",
    ],
)
async def test_a_malformed_token_is_refused_without_echoing_it(mangle: Any) -> None:
    store, value = await issued()
    header = mangle(value)
    with pytest.raises(MalformedToken) as caught:
        await authenticate(store, header)
    assert value.split("_", 2)[2][:10] not in caught.value.message


async def test_an_unknown_token_id() -> None:
    """A well-formed token from another store: its id is not in this one."""
    store, _ = await issued()
    _, foreign = await issued()
    with pytest.raises(UnknownToken, match=f"no API token has id {foreign.split('_')[1]}"):
        await authenticate(store, f"Bearer {foreign}")


async def test_a_wrong_secret_is_refused_and_not_shown() -> None:
    store, value = await issued()
    token_id = value.split("_")[1]
    wrong = f"tf_{token_id}_{'A' * 43}"
    with pytest.raises(WrongSecret, match=token_id) as caught:
        await authenticate(store, f"Bearer {wrong}")
    assert "A" * 43 not in caught.value.message


async def test_a_revoked_token_is_refused() -> None:
    store, value = await issued()
    token_id = value.split("_")[1]
    assert await store.revoke_token(token_id, T0 + 1)
    with pytest.raises(RevokedToken, match=rf"{token_id} \(ci\) was revoked"):
        await authenticate(store, f"Bearer {value}")


async def test_a_revoked_token_with_a_wrong_secret_says_wrong_secret() -> None:
    """Revocation is told only to whoever holds the secret."""
    store, value = await issued()
    token_id = value.split("_")[1]
    await store.revoke_token(token_id, T0 + 1)
    with pytest.raises(WrongSecret):
        await authenticate(store, f"Bearer tf_{token_id}_{'A' * 43}")


async def test_every_refusal_is_unauthenticated() -> None:
    for cls in (MissingToken, MalformedToken, UnknownToken, RevokedToken, WrongSecret):
        assert issubclass(cls, Unauthenticated)
    assert not issubclass(Forbidden, Unauthenticated)


async def test_the_secret_is_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    store, value = await issued()
    calls: list[tuple[Any, Any]] = []
    compare = hmac.compare_digest

    def spy(a: Any, b: Any) -> bool:
        calls.append((a, b))
        return compare(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    await authenticate(store, f"Bearer {value}")
    (stored,) = await store.list_tokens()
    assert calls == [(stored.secret_hash, auth.hash_secret(value.split("_", 2)[2]))]


async def test_a_use_is_recorded_at_most_once_a_minute() -> None:
    store, value = await issued()
    header = f"Bearer {value}"
    await authenticate(store, header, now=T0 + 10)
    (token,) = await store.list_tokens()
    assert token.last_used_at == T0 + 10
    await authenticate(store, header, now=T0 + 10 + auth.USE_RECORDED_EVERY - 1)
    assert (await store.list_tokens())[0].last_used_at == T0 + 10
    await authenticate(store, header, now=T0 + 10 + auth.USE_RECORDED_EVERY)
    assert (await store.list_tokens())[0].last_used_at == T0 + 10 + auth.USE_RECORDED_EVERY


async def test_a_refused_token_records_no_use() -> None:
    store, value = await issued()
    token_id = value.split("_")[1]
    with pytest.raises(WrongSecret):
        await authenticate(store, f"Bearer tf_{token_id}_{'A' * 43}", now=T0 + 10)
    await store.revoke_token(token_id, T0 + 20)
    with pytest.raises(RevokedToken):
        await authenticate(store, f"Bearer {value}", now=T0 + 30)
    assert (await store.list_tokens())[0].last_used_at is None


class NoWrites(MemoryStore):
    async def record_token_use(self, token_id: str, at: float) -> None:
        raise StoreUnavailable("the store is busy")


async def test_a_use_that_cannot_be_recorded_is_logged_and_the_caller_let_in(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = NoWrites()
    value = (await issue_token(store, name="ci", role=Role.VIEWER, now=T0)).value
    assert (await authenticate(store, f"Bearer {value}", now=T0)).role is Role.VIEWER
    token_id = value.split("_")[1]
    assert f"cannot record the use of API token {token_id}: the store is busy" in caplog.text


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("", "needs a name"),
        ("   ", "needs a name"),
        ("x" * 201, "at most 200"),
        ("ci\x00", "control"),
        ("ci\nroot", "control"),
    ],
)
async def test_a_bad_name_is_refused_and_nothing_stored(name: str, message: str) -> None:
    store = MemoryStore()
    with pytest.raises(ValueError, match=message):
        await issue_token(store, name=name, role=Role.VIEWER, now=T0)
    assert await store.list_tokens() == []


async def test_a_name_is_stored_stripped() -> None:
    store = MemoryStore()
    issued_token = await issue_token(store, name="  payments webhook ", role=Role.VIEWER, now=T0)
    assert issued_token.token.name == "payments webhook"


# -- roles ---------------------------------------------------------------------------

OPERATIONS = {Action.START, Action.CANCEL, Action.SIGNAL, Action.RETRY, Action.SCHEDULES}


def principal(role: Role) -> Principal:
    return Principal(token_id="0123456789abcdef", name="ci", role=role)


def test_a_viewer_only_reads() -> None:
    require(principal(Role.VIEWER), Action.READ)
    for action in set(Action) - {Action.READ}:
        with pytest.raises(Forbidden, match=f"may not {action}"):
            require(principal(Role.VIEWER), action)


def test_an_operator_runs_work_but_changes_no_definitions_or_tokens() -> None:
    for action in OPERATIONS | {Action.READ}:
        require(principal(Role.OPERATOR), action)
    for action in (Action.DEFINITIONS, Action.TOKENS):
        with pytest.raises(Forbidden, match=r"needs role admin$"):
            require(principal(Role.OPERATOR), action)


def test_an_admin_may_do_everything() -> None:
    for action in Action:
        require(principal(Role.ADMIN), action)


def test_each_role_holds_what_the_roles_below_it_hold() -> None:
    roles = list(Role)
    for lower, higher in itertools.pairwise(roles):
        assert PERMISSIONS[lower] < PERMISSIONS[higher]
    assert set(PERMISSIONS) == set(Role)


def test_forbidden_names_the_token_its_role_and_the_role_needed() -> None:
    with pytest.raises(Forbidden) as caught:
        require(principal(Role.VIEWER), Action.START)
    assert caught.value.message == (
        "API token 0123456789abcdef (ci) has role viewer, which may not start: "
        "that needs role operator or above"
    )


def test_an_unknown_role_name_lists_the_roles() -> None:
    with pytest.raises(ValueError, match=r"unknown role 'root' \(roles: viewer, operator, admin\)"):
        Role.parse("root")
    assert Role.parse("admin") is Role.ADMIN
