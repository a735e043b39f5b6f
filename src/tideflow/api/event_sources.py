"""Who may send events for which source: the gateway's sources configuration.

A file (``tideflow server --event-sources FILE``, YAML or JSON) lists the sources::

    sources:
      - source: https://pay.example.com/webhooks     # this exact `source` attribute
        auth: hmac
        secret_env: PAY_WEBHOOK_SECRET               # the secret is in the environment
        previous_secret_env: PAY_WEBHOOK_SECRET_OLD  # optional: also valid (rotation)
        replay_window: 300                           # seconds, optional (default 300)
        types: ["com.example.payment.*"]             # the event types it may send
      - source: "urn:approvals:*"                    # every source that starts so
        auth: bearer
        token_env: APPROVALS_TOKEN
        types: [com.example.order.approved]
        address_runs: true                           # may name a run (tideflowrunid)

A pattern (of a source or of a type) is a value exactly, or a prefix followed by one
``*`` at its end (``*`` alone: any). The rule for an event's source is the exact one if
there is one, else the longest prefix.

- ``bearer``: the request carries ``Authorization: Bearer <the token>``.
- ``hmac``: the request is signed (api/event_signatures.py): a ``v2=`` signature covers
  the method, path, ``Content-Type``, every ``ce-*`` header and the body; a ``sha256=``
  one (``<timestamp>.<raw body>``) is taken in structured and batched mode only, where
  the body carries every attribute. A timestamp more than ``replay_window`` seconds
  from the server's clock (in either direction) is refused. A replay inside the window
  is a redelivery, which deduplication applies once.
- ``types`` (required): the event types the source may send; ``address_runs`` (default
  false): whether its events may name a run by ``tideflowrunid`` (else they find their
  runs by correlation, a `wait`'s ``match``). An event outside its source's policy is
  refused (`SourceRule.not_allowed`).

Secrets are compared with ``hmac.compare_digest``. Nothing here imports an HTTP framework.
"""

from __future__ import annotations

import hmac
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from tideflow.api.auth import PREFIX as API_TOKEN_PREFIX
from tideflow.api.event_signatures import (
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    EventRequest,
    SignatureRefused,
    check_signature,
    sign,
    sign_v2,
)

__all__ = [
    "DEFAULT_REPLAY_WINDOW",
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "EventRequest",
    "EventSources",
    "EventSourcesError",
    "SourceRefused",
    "SourceRule",
    "sign",
    "sign_v2",
]

DEFAULT_REPLAY_WINDOW = 300.0
MIN_SECRET = 16
"""Characters a source's secret or token has at least."""

_POLICY = {"types", "address_runs"}
_KEYS = {
    "bearer": {"source", "auth", "token_env", "previous_token_env", *_POLICY},
    "hmac": {"source", "auth", "secret_env", "previous_secret_env", "replay_window", *_POLICY},
}
_SECRET_KEY = {"bearer": "token_env", "hmac": "secret_env"}


class EventSourcesError(ValueError):
    """A sources configuration that cannot be used; the message says where and why."""


class SourceRefused(Exception):
    """A request that is not authorised for an event's source. The message is for the
    log only: the caller is told nothing about why."""


def covers(pattern: str, value: str) -> bool:
    """Whether ``pattern`` (a value exactly, or a prefix and a final ``*``) covers ``value``."""
    if pattern.endswith("*"):
        return value.startswith(pattern[:-1])
    return value == pattern


@dataclass(frozen=True, slots=True, kw_only=True)
class SourceRule:
    pattern: str
    """A `source` exactly, or a prefix and a final ``*``."""
    auth: Literal["bearer", "hmac"]
    secrets: tuple[str, ...] = field(repr=False)
    """The current secret (or token), then the previous one while a key is rotated."""
    secret_env: str
    replay_window: float = DEFAULT_REPLAY_WINDOW
    types: tuple[str, ...] = ("*",)
    """Patterns of the event types the source may send."""
    address_runs: bool = False
    """Whether its events may name a run by ``tideflowrunid``."""

    @property
    def secret(self) -> str:
        """The current secret (or token)."""
        return self.secrets[0]

    @property
    def is_prefix(self) -> bool:
        return self.pattern.endswith("*")

    def covers(self, source: str) -> bool:
        return covers(self.pattern, source)

    def check(self, request: EventRequest, now: float) -> None:
        """`SourceRefused` unless the request carries this source's credentials."""
        if self.auth == "bearer":
            self._check_bearer(request.header("authorization"))
            return
        try:
            check_signature(request, self.secrets, now, self.replay_window)
        except SignatureRefused as exc:
            raise SourceRefused(f"source {self.pattern}: {exc}") from None

    def not_allowed(self, event_type: str, names_a_run: bool) -> list[tuple[str, str]]:
        """What of an event this source may not send: (``type`` or ``tideflowrunid``,
        why) for each; empty when the event is inside the source's policy."""
        refused: list[tuple[str, str]] = []
        if not any(covers(pattern, event_type) for pattern in self.types):
            refused.append(
                (
                    "type",
                    f"source {self.pattern} may not send events of type {event_type!r}: it "
                    f"may send {', '.join(self.types)} (`types` in the event sources)",
                )
            )
        if names_a_run and not self.address_runs:
            refused.append(
                (
                    "tideflowrunid",
                    f"source {self.pattern} may not address a run by tideflowrunid: send the "
                    "event without it (a wait's match finds its runs) or allow it with "
                    "`address_runs: true` in the event sources",
                )
            )
        return refused

    def _check_bearer(self, header: str) -> None:
        scheme, _, token = header.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise SourceRefused(f"source {self.pattern}: no bearer token")
        given = token.strip().encode()
        if not any(hmac.compare_digest(given, secret.encode()) for secret in self.secrets):
            raise SourceRefused(f"source {self.pattern}: wrong bearer token")


@dataclass(frozen=True, slots=True)
class EventSources:
    """The rules, one per pattern; `rule_for` finds a source's."""

    rules: tuple[SourceRule, ...] = ()

    def rule_for(self, source: str) -> SourceRule | None:
        """The exact rule for ``source``, else the one with the longest prefix."""
        exact = [r for r in self.rules if not r.is_prefix and r.pattern == source]
        if exact:
            return exact[0]
        prefixes = [r for r in self.rules if r.is_prefix and r.covers(source)]
        return max(prefixes, key=lambda r: len(r.pattern), default=None)

    @classmethod
    def load(cls, path: str | Path, environ: Mapping[str, str] | None = None) -> EventSources:
        """The sources in a YAML or JSON file (JSON is YAML); `EventSourcesError`."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise EventSourcesError(f"{path}: cannot read the event sources: {exc}") from None
        try:
            data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
        except (ValueError, yaml.YAMLError) as exc:
            raise EventSourcesError(f"{path}: not valid {_format(path)}: {exc}") from None
        return cls.of(data, environ, where=str(path))

    @classmethod
    def of(
        cls, data: Any, environ: Mapping[str, str] | None = None, *, where: str = "event sources"
    ) -> EventSources:
        """The sources a parsed configuration lists, their secrets read from ``environ``
        (default: the process's); `EventSourcesError` naming the entry and the key."""
        env = os.environ if environ is None else environ
        if not isinstance(data, dict) or set(data) != {"sources"}:
            raise EventSourcesError(
                f"{where}: expected a mapping with one key, `sources`, a list of sources "
                "(docs/events.md, 'Sources')"
            )
        entries = data["sources"]
        if not isinstance(entries, list):
            raise EventSourcesError(f"{where}: `sources` is a list of sources")
        rules = tuple(
            _rule(entry, env, f"{where}: sources[{i}]") for i, entry in enumerate(entries)
        )
        seen: dict[str, int] = {}
        for index, rule in enumerate(rules):
            if rule.pattern in seen:
                raise EventSourcesError(
                    f"{where}: sources[{index}]: source {rule.pattern!r} is listed already, "
                    f"at sources[{seen[rule.pattern]}]"
                )
            seen[rule.pattern] = index
        return cls(rules)


def _format(path: Path) -> str:
    return "JSON" if path.suffix == ".json" else "YAML"


def _rule(entry: Any, env: Mapping[str, str], where: str) -> SourceRule:
    if not isinstance(entry, dict):
        raise EventSourcesError(f"{where}: a source is a mapping (source, auth, ...)")
    auth = entry.get("auth")
    if auth not in _KEYS:
        raise EventSourcesError(f"{where}: auth is {auth!r}: give `bearer` or `hmac`")
    unknown = sorted(set(map(str, entry)) - _KEYS[auth])
    if unknown:
        allowed = ", ".join(sorted(_KEYS[auth]))
        raise EventSourcesError(
            f"{where}: unknown key {unknown[0]!r} for auth {auth} (it takes {allowed})"
        )
    key = _SECRET_KEY[auth]
    secrets: tuple[str, ...] = (_secret(entry, key, auth, env, where),)
    if f"previous_{key}" in entry:
        secrets += (_secret(entry, f"previous_{key}", auth, env, where),)
    return SourceRule(
        pattern=_pattern(entry.get("source"), where, "source"),
        auth=auth,
        secrets=secrets,
        secret_env=entry[key],
        replay_window=_window(entry.get("replay_window", DEFAULT_REPLAY_WINDOW), where),
        types=_types(entry.get("types"), where),
        address_runs=_flag(entry.get("address_runs", False), where),
    )


def _pattern(value: Any, where: str, key: str) -> str:
    if not isinstance(value, str) or not value.strip("*"):
        if key == "source":
            raise EventSourcesError(
                f"{where}: source is the `source` attribute of the events (a URI), or a "
                "prefix of it followed by `*`"
            )
        if value != "*":
            raise EventSourcesError(
                f"{where}: {key}: {value!r} is not an event type, a prefix of one followed "
                "by `*`, or `*` (any type)"
            )
    if "*" in value[:-1]:
        raise EventSourcesError(
            f"{where}: {key} {value!r}: `*` may only end a pattern (a prefix), once"
        )
    return str(value)


def _types(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        raise EventSourcesError(
            f"{where}: give `types`, the event types this source may send: a list of "
            'types, or prefixes ending in `*` (["com.example.payment.*"]; ["*"] for any)'
        )
    if not isinstance(value, list) or not value:
        raise EventSourcesError(
            f"{where}: types is a list of event types (or prefixes ending in `*`), not {value!r}"
        )
    return tuple(_pattern(item, where, f"types[{i}]") for i, item in enumerate(value))


def _flag(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise EventSourcesError(f"{where}: address_runs is true or false, not {value!r}")
    return value


def _secret(entry: dict[str, Any], key: str, auth: str, env: Mapping[str, str], where: str) -> str:
    name = entry.get(key)
    if not isinstance(name, str) or not name:
        raise EventSourcesError(
            f"{where}: auth {auth} needs {key}: the name of the environment variable that "
            "holds the secret (secrets are not written in this file)"
        )
    secret = env.get(name, "")
    if not secret:
        raise EventSourcesError(f"{where}: the environment variable {name} ({key}) is not set")
    if len(secret) < MIN_SECRET:
        raise EventSourcesError(
            f"{where}: the secret in {name} is {len(secret)} characters; use at least "
            f"{MIN_SECRET} (`openssl rand -hex 32` makes one)"
        )
    if auth == "bearer" and secret.startswith(API_TOKEN_PREFIX):
        raise EventSourcesError(
            f"{where}: the token in {name} starts with {API_TOKEN_PREFIX!r}, which marks an "
            "API token: choose another"
        )
    return secret


def _window(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 86400:
        raise EventSourcesError(
            f"{where}: replay_window is seconds, more than 0 and at most 86400 (got {value!r})"
        )
    return float(value)
