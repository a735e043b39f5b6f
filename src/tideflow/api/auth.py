"""API tokens: issuing them, and checking who a request is and what it may do.

A token reads ``tf_<id>_<secret>``: ``<id>`` (16 hex digits) is public and is how the
token is looked up in the store; ``<secret>`` (``secrets.token_urlsafe(32)``, 256 random
bits) is shown once, when the token is created, and only its SHA-256 digest is stored.

Why a plain SHA-256 and not a slow password hash (bcrypt, scrypt, argon2): those make
guessing a *low-entropy* password expensive. A secret of 256 bits from the operating
system's CSPRNG cannot be guessed at any hash speed, so a slow hash would only make
every request cost tens of milliseconds of CPU; a salt is not needed either, as no two
secrets are alike and no table of precomputed digests can cover 2**256 of them. Someone
who reads the store learns the digests, from which no secret can be recovered. The
digest presented is compared with the stored one with ``hmac.compare_digest``, in time
that does not depend on where they differ.

``authenticate`` raises a different ``Unauthenticated`` subclass for each way a request
can fail (no token, malformed, unknown id, revoked, wrong secret), for logs and for the
HTTP layer, which answers 401 to all of them (telling a caller an id exists helps an
attacker) and 403 to ``Forbidden`` from ``require``. Nothing here imports an HTTP
framework.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import secrets
import time
import unicodedata
from dataclasses import dataclass

from tideflow.errors import (
    Forbidden,
    MalformedToken,
    MissingToken,
    RevokedToken,
    StoreError,
    UnknownToken,
    WrongSecret,
)
from tideflow.model.tokens import PERMISSIONS, Action, ApiToken, Role
from tideflow.store.base import Store

__all__ = [
    "PERMISSIONS",
    "Action",
    "ApiToken",
    "IssuedToken",
    "Principal",
    "Role",
    "authenticate",
    "issue_token",
    "require",
]

log = logging.getLogger("tideflow.api.auth")

USE_RECORDED_EVERY = 60.0
"""Seconds: a token's ``last_used_at`` is written at most this often (one write a minute
per token, not one per request)."""
PREFIX = "tf_"
HASH_SCHEME = "sha256:"
MAX_NAME_LENGTH = 200
_TOKEN = re.compile(r"tf_(?P<id>[0-9a-f]{16})_(?P<secret>[A-Za-z0-9_-]{43})")
"""``secrets.token_urlsafe(32)`` is 43 characters of the URL-safe base64 alphabet."""
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9-]{0,19}")
"""What is named back as the scheme a request used: a word, never a bare token."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Principal:
    """Who a request is: the token it authenticated with (never its secret or hash)."""

    token_id: str
    name: str
    role: Role


@dataclass(frozen=True, slots=True, kw_only=True)
class IssuedToken:
    """A token just created: ``value`` is the only time its secret exists outside the
    caller; ``token`` is what was stored."""

    value: str
    token: ApiToken


def hash_secret(secret: str) -> str:
    return HASH_SCHEME + hashlib.sha256(secret.encode("ascii")).hexdigest()


def token_name(name: str) -> str:
    """A token's name, stripped; ValueError for an empty, overlong or unprintable one."""
    name = name.strip()
    if not name:
        raise ValueError("a token needs a name (who or what it is for)")
    if len(name) > MAX_NAME_LENGTH:
        raise ValueError(f"a token name has at most {MAX_NAME_LENGTH} characters")
    if any(unicodedata.category(c).startswith("C") for c in name):
        raise ValueError("a token name cannot hold control or unassigned characters")
    return name


async def issue_token(store: Store, *, name: str, role: Role, now: float) -> IssuedToken:
    """Create a token and store it (its secret's hash only); ValueError for a bad name."""
    token_id, secret = secrets.token_hex(8), secrets.token_urlsafe(32)
    token = ApiToken(
        token_id=token_id,
        name=token_name(name),
        role=role,
        secret_hash=hash_secret(secret),
        created_at=now,
    )
    await store.create_token(token)
    return IssuedToken(value=f"{PREFIX}{token_id}_{secret}", token=token)


def parse_authorization(header: str | None) -> tuple[str, str]:
    """``(token id, secret)`` of an ``Authorization: Bearer tf_<id>_<secret>`` value."""
    if header is None or not header.strip():
        raise MissingToken()
    scheme, _, credentials = header.strip().partition(" ")
    if scheme.lower() != "bearer":  # schemes are case-insensitive (RFC 9110, 11.1)
        named = f"is {scheme!r}" if _SCHEME.fullmatch(scheme) else "is missing"
        raise MalformedToken(
            f"the Authorization scheme {named}, not Bearer: send "
            "`Authorization: Bearer tf_<id>_<secret>`"
        )
    match = _TOKEN.fullmatch(credentials.strip())
    if match is None:  # the value is not echoed: it may be a real secret mistyped
        raise MalformedToken()
    return match["id"], match["secret"]


async def authenticate(store: Store, header: str | None, *, now: float | None = None) -> Principal:
    """Who the ``Authorization`` header value says the caller is; an ``Unauthenticated``
    subclass saying why not. The token's use is recorded at ``now`` (default: the time),
    at most every ``USE_RECORDED_EVERY`` seconds."""
    token_id, secret = parse_authorization(header)
    token = await store.get_token(token_id)
    if token is None:
        raise UnknownToken(f"no API token has id {token_id}")
    if not hmac.compare_digest(token.secret_hash, hash_secret(secret)):
        raise WrongSecret(f"the secret of API token {token_id} does not match")
    if token.revoked:  # checked after the secret: only its holder learns it was revoked
        raise RevokedToken(
            f"API token {token_id} ({token.name}) was revoked: create another with "
            "`tideflow tokens create`"
        )
    await _record_use(store, token, time.time() if now is None else now)
    return Principal(token_id=token.token_id, name=token.name, role=token.role)


async def _record_use(store: Store, token: ApiToken, now: float) -> None:
    """Bookkeeping: a store that cannot take the write does not refuse the request (the
    token was read and checked), the failure is logged."""
    if token.last_used_at is not None and now - token.last_used_at < USE_RECORDED_EVERY:
        return
    try:
        await store.record_token_use(token.token_id, now)
    except StoreError as exc:
        log.warning("cannot record the use of API token %s: %s", token.token_id, exc.message)


def require(principal: Principal, action: Action) -> None:
    """Forbidden, naming the role needed, unless the principal's role allows ``action``."""
    if principal.role.allows(action):
        return
    needed = Role.lowest_allowing(action)
    above = "" if needed is list(Role)[-1] else " or above"
    raise Forbidden(
        f"API token {principal.token_id} ({principal.name}) has role {principal.role}, "
        f"which may not {action}: that needs role {needed}{above}"
    )
