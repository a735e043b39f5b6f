"""Who may send events for which source: the gateway's sources configuration.

A file (``tideflow server --event-sources FILE``, YAML or JSON) lists the sources::

    sources:
      - source: https://pay.example.com/webhooks     # this exact `source` attribute
        auth: hmac
        secret_env: PAY_WEBHOOK_SECRET               # the secret is in the environment
        replay_window: 300                           # seconds, optional (default 300)
      - source: "urn:approvals:*"                    # every source that starts so
        auth: bearer
        token_env: APPROVALS_TOKEN

A pattern is a `source` exactly, or a prefix followed by one ``*`` at its end. The
rule for an event's source is the exact one if there is one, else the longest prefix.

- ``bearer``: the request carries ``Authorization: Bearer <the token>``.
- ``hmac``: the request carries ``X-Tideflow-Timestamp: <unix seconds>`` and
  ``X-Tideflow-Signature: sha256=<hex>``, the HMAC-SHA256 under the secret of
  ``<timestamp>.<raw body>``; a timestamp more than ``replay_window`` seconds from the
  server's clock (in either direction) is refused. A replay inside the window is a
  redelivery, which deduplication applies once.

Secrets are compared with ``hmac.compare_digest``. Nothing here imports an HTTP framework.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from tideflow.api.auth import PREFIX as API_TOKEN_PREFIX

__all__ = [
    "DEFAULT_REPLAY_WINDOW",
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "EventSources",
    "EventSourcesError",
    "SourceRefused",
    "SourceRule",
    "sign",
]

DEFAULT_REPLAY_WINDOW = 300.0
TIMESTAMP_HEADER = "x-tideflow-timestamp"
SIGNATURE_HEADER = "x-tideflow-signature"
SIGNATURE_SCHEME = "sha256="
MIN_SECRET = 16
"""Characters a source's secret or token has at least."""

_KEYS = {
    "bearer": {"source", "auth", "token_env"},
    "hmac": {"source", "auth", "secret_env", "replay_window"},
}
_SECRET_KEY = {"bearer": "token_env", "hmac": "secret_env"}


class EventSourcesError(ValueError):
    """A sources configuration that cannot be used; the message says where and why."""


class SourceRefused(Exception):
    """A request that is not authorised for an event's source. The message is for the
    log only: the caller is told nothing about why."""


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """The ``X-Tideflow-Signature`` value of ``body`` sent at ``timestamp``."""
    message = timestamp.encode("ascii") + b"." + body
    return SIGNATURE_SCHEME + hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


@dataclass(frozen=True, slots=True, kw_only=True)
class SourceRule:
    pattern: str
    """A `source` exactly, or a prefix and a final ``*``."""
    auth: Literal["bearer", "hmac"]
    secret: str = field(repr=False)
    secret_env: str
    replay_window: float = DEFAULT_REPLAY_WINDOW

    @property
    def is_prefix(self) -> bool:
        return self.pattern.endswith("*")

    def covers(self, source: str) -> bool:
        if self.is_prefix:
            return source.startswith(self.pattern[:-1])
        return source == self.pattern

    def check(self, headers: Mapping[str, str], body: bytes, now: float) -> None:
        """`SourceRefused` unless the request carries this source's credentials."""
        if self.auth == "bearer":
            self._check_bearer(headers)
        else:
            self._check_signature(headers, body, now)

    def _check_bearer(self, headers: Mapping[str, str]) -> None:
        scheme, _, token = headers.get("authorization", "").strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise SourceRefused(f"source {self.pattern}: no bearer token")
        if not hmac.compare_digest(token.strip().encode(), self.secret.encode()):
            raise SourceRefused(f"source {self.pattern}: wrong bearer token")

    def _check_signature(self, headers: Mapping[str, str], body: bytes, now: float) -> None:
        timestamp = headers.get(TIMESTAMP_HEADER, "").strip()
        signature = headers.get(SIGNATURE_HEADER, "").strip()
        if not timestamp or not signature:
            raise SourceRefused(f"source {self.pattern}: no signature or no timestamp")
        if not (timestamp.isascii() and timestamp.isdigit()):
            raise SourceRefused(
                f"source {self.pattern}: timestamp {timestamp!r} is not unix seconds"
            )
        if abs(now - int(timestamp)) > self.replay_window:
            raise SourceRefused(
                f"source {self.pattern}: timestamp {timestamp} is {now - int(timestamp):.0f} s "
                f"from now, outside the replay window of {self.replay_window:g} s"
            )
        expected = sign(self.secret, timestamp, body)
        if not hmac.compare_digest(expected.encode(), signature.lower().encode()):
            raise SourceRefused(f"source {self.pattern}: bad signature")


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
    return SourceRule(
        pattern=_pattern(entry.get("source"), where),
        auth=auth,
        secret=_secret(entry, auth, env, where),
        secret_env=entry[_SECRET_KEY[auth]],
        replay_window=_window(entry.get("replay_window", DEFAULT_REPLAY_WINDOW), where),
    )


def _pattern(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip("*"):
        raise EventSourcesError(
            f"{where}: source is the `source` attribute of the events (a URI), or a prefix "
            "of it followed by `*`"
        )
    if "*" in value[:-1]:
        raise EventSourcesError(
            f"{where}: source {value!r}: `*` may only end a pattern (a prefix), once"
        )
    return value


def _secret(entry: dict[str, Any], auth: str, env: Mapping[str, str], where: str) -> str:
    key = _SECRET_KEY[auth]
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
