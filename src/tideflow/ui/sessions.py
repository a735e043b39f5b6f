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
"""Sessions kept at once (in memory): past that, a login ends the least recently used."""
LOCAL = Principal(token_id="local", name="tideflow ui (local user)", role=Role.ADMIN)


@dataclass(slots=True)
class _Session:
    token: str | None
    """The API token it authenticates with (None: the local user's session)."""
    used_at: float


@dataclass
class Sessions:
    store: Store | None
    """Where API tokens are checked (None: `tideflow ui`, the one-time code only)."""
    code: str | None = None
    """The one-time code of `tideflow ui` (None once redeemed, or on a server)."""
    _sessions: dict[str, _Session] = field(default_factory=dict)

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
        return self._new(token.strip()), principal

    def redeem(self, code: str) -> str | None:
        """A session for the one-time code (None when it is wrong or was used)."""
        if self.code is None or not hmac.compare_digest(self.code.encode(), code.encode()):
            return None
        self.code = None
        return self._new(None)

    async def principal(self, session_id: str | None) -> Principal | None:
        """Who the session is; None for no session, an unknown or an expired one.
        ``Unauthenticated`` when its token is no longer live (and the session ends)."""
        session = self._sessions.get(session_id or "")
        now = time.monotonic()
        if session is None or now - session.used_at > LIFETIME:
            self._sessions.pop(session_id or "", None)
            return None
        session.used_at = now
        self._sessions[session_id or ""] = self._sessions.pop(session_id or "")  # last: newest
        if session.token is None:
            return LOCAL
        assert self.store is not None
        try:
            return await authenticate(self.store, f"Bearer {session.token}")
        except Unauthenticated:  # revoked since: the session ends with its token
            self._sessions.pop(session_id or "", None)
            raise

    def end(self, session_id: str | None) -> None:
        self._sessions.pop(session_id or "", None)

    def _new(self, token: str | None) -> str:
        if len(self._sessions) >= MAX_SESSIONS:  # the one used longest ago goes (the
            del self._sessions[next(iter(self._sessions))]  # first: used moves it last)
        session_id = secrets.token_urlsafe(32)
        self._sessions[session_id] = _Session(token=token, used_at=time.monotonic())
        return session_id
