"""Browser sessions of the web UI: an HttpOnly, SameSite=Strict cookie instead of a
bearer header (an ``EventSource`` cannot send headers).

Two ways in:

- `tideflow server --http`: the login form posts an API token; the session keeps the
  token (in this process's memory only) and every request through the session is
  authenticated with it again, so a revoked token ends its sessions at once and the
  role is the token's.
- `tideflow ui`: the store has no token to ask for; the command prints a URL with a
  one-time code (Jupyter-style), which ``redeem`` exchanges for a session of the local
  user (role admin). The code works once; the process's sessions end with it.

A request authenticated by the cookie must also carry the ``X-Tideflow-UI`` header for
any method that changes something: a form or image on another site cannot add a header,
so the cookie alone cannot be used to act (SameSite=Strict already keeps it off
cross-site requests; the header is the second lock).

Sessions are bounded per token and in total, so that no token can end another's
sessions by logging in again and again: a token holds at most ``MAX_PER_TOKEN``
(its own least recently used goes when it logs in once more), and when the process
holds ``MAX_SESSIONS`` a login ends the least recently used session of the token that
holds the most (one token alone never reaches the total; only as many tokens as an
admin issued could, and then the heaviest holder pays first).
"""

from __future__ import annotations

import hmac
import secrets
import time
from dataclasses import dataclass, field

from tideflow.api.auth import Principal, authenticate
from tideflow.errors import Unauthenticated
from tideflow.model.tokens import Role
from tideflow.store.base import Store

__all__ = ["COOKIE", "CSRF_HEADER", "LOCAL", "Sessions"]

COOKIE = "tideflow_ui"
CSRF_HEADER = "x-tideflow-ui"
LIFETIME = 12 * 3600.0
"""Seconds a session lasts without use."""
MAX_SESSIONS = 10_000
"""Sessions kept at once (in memory): past that, a login ends the least recently used
session of the token that holds the most."""
MAX_PER_TOKEN = 20
"""Sessions one API token holds at once: past that, its own least recently used ends."""
LOCAL = Principal(token_id="local", name="tideflow ui (local user)", role=Role.ADMIN)


@dataclass(slots=True)
class _Session:
    token: str | None
    """The API token it authenticates with (None: the local user's session)."""
    owner: str
    """Whose it is: the token's id (``local`` for the local user)."""
    used_at: float


@dataclass
class Sessions:
    store: Store | None
    """Where API tokens are checked (None: `tideflow ui`, the one-time code only)."""
    code: str | None = None
    """The one-time code of `tideflow ui` (None once redeemed, or on a server)."""
    _sessions: dict[str, _Session] = field(default_factory=dict)
    """Every session, least recently used first."""
    _owned: dict[str, dict[str, None]] = field(default_factory=dict)
    """Each owner's session ids, least recently used first."""

    @classmethod
    def local(cls) -> Sessions:
        return cls(store=None, code=secrets.token_urlsafe(24))

    @property
    def required(self) -> bool:
        """Whether a request needs a session (no API tokens to fall back on)."""
        return self.store is None

    async def login(self, token: str) -> tuple[str, Principal]:
        """A session for an API token (``Unauthenticated`` when it is not a live one)."""
        if self.store is None:
            raise ValueError("this UI is opened with its one-time link, not with API tokens")
        principal = await authenticate(self.store, f"Bearer {token.strip()}")
        return self._new(token.strip(), principal.token_id), principal

    def redeem(self, code: str) -> str | None:
        """A session for the one-time code (None when it is wrong or was used)."""
        if self.code is None or not hmac.compare_digest(self.code.encode(), code.encode()):
            return None
        self.code = None
        return self._new(None, LOCAL.token_id)

    async def principal(self, session_id: str | None) -> Principal | None:
        """Who the session is; None for no session, an unknown or an expired one.
        ``Unauthenticated`` when its token is no longer live (and the session ends)."""
        key = session_id or ""
        session = self._sessions.get(key)
        now = time.monotonic()
        if session is None or now - session.used_at > LIFETIME:
            self.end(key)
            return None
        session.used_at = now
        self._sessions[key] = self._sessions.pop(key)  # last: the most recently used
        owned = self._owned[session.owner]
        owned[key] = owned.pop(key)
        if session.token is None:
            return LOCAL
        assert self.store is not None
        try:
            return await authenticate(self.store, f"Bearer {session.token}")
        except Unauthenticated:  # revoked since: the session ends with its token
            self.end(key)
            raise

    def end(self, session_id: str | None) -> None:
        session = self._sessions.pop(session_id or "", None)
        if session is None:
            return
        owned = self._owned[session.owner]
        del owned[session_id or ""]
        if not owned:
            del self._owned[session.owner]

    def _new(self, token: str | None, owner: str) -> str:
        owned = self._owned.get(owner, {})
        if len(owned) >= MAX_PER_TOKEN:
            self.end(next(iter(owned)))  # the owner's own least recently used
        elif len(self._sessions) >= MAX_SESSIONS:
            self.end(self._heaviest_oldest())
        session_id = secrets.token_urlsafe(32)
        self._sessions[session_id] = _Session(token=token, owner=owner, used_at=time.monotonic())
        self._owned.setdefault(owner, {})[session_id] = None
        return session_id

    def _heaviest_oldest(self) -> str:
        """The least recently used session of the owner that holds the most (scanned
        only when every slot is taken, which takes many tokens)."""
        most = max(len(owned) for owned in self._owned.values())
        return next(key for key, s in self._sessions.items() if len(self._owned[s.owner]) == most)
