"""API tokens and the roles they carry: what a token may do, and its row as stored.

A token is shown once, when it is created (``tideflow.api.auth.issue_token``); the
store keeps only a hash of its secret (``ApiToken.secret_hash``). The one permission
table is ``PERMISSIONS``: each role's actions, every role holding the actions of the
roles below it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from tideflow.errors import StateFormatError


class Action(StrEnum):
    """What a request does, as far as authorisation is concerned."""

    READ = "read"
    """Read definitions, runs, their history, queues."""
    START = "start"
    """Start a run."""
    CANCEL = "cancel"
    """Cancel a run."""
    SIGNAL = "signal"
    """Send a signal (or an event) to a run."""
    RETRY = "retry"
    """Retry a failed or timed-out run."""
    SCHEDULES = "schedules"
    """Pause, resume and trigger schedules (deleting one is ``DEFINITIONS``)."""
    DEFINITIONS = "definitions"
    """Register definitions, activate and deactivate their versions."""
    TOKENS = "tokens"
    """Create, list and revoke API tokens."""


class Role(StrEnum):
    """A token's role, lowest first: each holds every action of the roles before it."""

    VIEWER = "viewer"
    """Reads only."""
    OPERATOR = "operator"
    """Runs work: start, cancel, signal, retry, pause/resume/trigger schedules (and read)."""
    ADMIN = "admin"
    """Changes the deployment: definitions (and deleting schedules) and tokens (and
    everything an operator does)."""

    def allows(self, action: Action) -> bool:
        return action in PERMISSIONS[self]

    @classmethod
    def lowest_allowing(cls, action: Action) -> Role:
        """The least privileged role that may do ``action``."""
        return next(role for role in cls if role.allows(action))

    @classmethod
    def parse(cls, text: str) -> Role:
        """The role named ``text``; ValueError naming the roles there are."""
        try:
            return cls(text)
        except ValueError:
            known = ", ".join(role.value for role in cls)
            raise ValueError(f"unknown role {text!r} (roles: {known})") from None


_VIEWER = frozenset({Action.READ})
_OPERATOR = _VIEWER | {
    Action.START,
    Action.CANCEL,
    Action.SIGNAL,
    Action.RETRY,
    Action.SCHEDULES,
}
PERMISSIONS: dict[Role, frozenset[Action]] = {
    Role.VIEWER: _VIEWER,
    Role.OPERATOR: _OPERATOR,
    Role.ADMIN: _OPERATOR | {Action.DEFINITIONS, Action.TOKENS},
}
"""The one permission table: the actions each role may do."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ApiToken:
    """An API token as stored: never its secret, only the secret's hash."""

    token_id: str
    """The public part of the token (``tf_<token_id>_<secret>``): how it is looked up."""
    name: str
    """Who or what it is for (``ci``, ``payments-webhook``)."""
    role: Role
    secret_hash: str
    """``sha256:<hex digest of the secret>`` (the scheme named, so another can follow)."""
    created_at: float
    revoked_at: float | None = None
    """When it was revoked (epoch seconds); None while it is live."""
    last_used_at: float | None = None
    """When it last authenticated a request, to the minute (``Store.record_token_use``);
    None while it never has."""

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None


def stored_role(token_id: str, text: str) -> Role:
    """A stored token's role; StateFormatError for a role this tideflow does not know."""
    try:
        return Role.parse(text)
    except ValueError as exc:
        raise StateFormatError(f"stored token {token_id!r}: {exc}") from None
