"""The HMAC signatures of event requests (docs/events.md, "Signatures").

A signed request carries ``X-Tideflow-Timestamp: <unix seconds>`` and
``X-Tideflow-Signature``: one or more signatures separated by spaces (as Standard
Webhooks' ``webhook-signature`` does, so that a sender can sign with an old and a new
secret while a key is rotated), each ``<version>=<hex HMAC-SHA256>``:

- ``v2=``: the **canonical request** (`canonical_request`): the method, the path, the
  ``Content-Type``, every ``ce-*`` header (lower-case names, sorted) and the SHA-256 of
  the body, under the timestamp. It covers everything that routes or identifies an
  event in every content mode; binary mode (the attributes are ``ce-*`` headers) needs it.
- ``sha256=`` (v1): ``<timestamp>.<raw body>``. It covers the body only, so it is taken
  only where the body carries every attribute: structured and batched mode.

A timestamp more than the source's replay window away from the server's clock is
refused. Pure: no HTTP framework, no I/O.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = [
    "MAX_TIMESTAMP_DIGITS",
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "V1",
    "V2",
    "EventRequest",
    "SignatureRefused",
    "canonical_request",
    "check_signature",
    "sign",
    "sign_v2",
]

TIMESTAMP_HEADER = "x-tideflow-timestamp"
SIGNATURE_HEADER = "x-tideflow-signature"
V1 = "sha256="
V2 = "v2="
V2_LABEL = b"tideflow-v2"
"""The first line of a v2 canonical request: the scheme it is signed under."""
MAX_TIMESTAMP_DIGITS = 12
"""Unix seconds until the year 33658: a longer timestamp is refused, never converted."""


class SignatureRefused(Exception):
    """A request whose signature does not hold; the message (for the log) says why."""


@dataclass(frozen=True, slots=True, kw_only=True)
class EventRequest:
    """What a source's credentials are checked against: the request as it came."""

    method: str
    path: str
    headers: tuple[tuple[str, str], ...]
    """Every header, names lower-case, values as sent (repeats kept, in order)."""
    body: bytes
    self_contained: bool
    """The body carries every attribute of its events (structured or batched mode)."""

    @classmethod
    def of(
        cls,
        method: str,
        path: str,
        headers: Iterable[tuple[str, str]],
        body: bytes,
        *,
        self_contained: bool,
    ) -> EventRequest:
        pairs = tuple((name.lower(), value) for name, value in headers)
        return cls(
            method=method, path=path, headers=pairs, body=body, self_contained=self_contained
        )

    def header(self, name: str) -> str:
        """The first value of the header ``name`` (lower-case), or ``""``."""
        return next((value for key, value in self.headers if key == name), "")


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """The v1 signature (``sha256=<hex>``) of ``body`` sent at ``timestamp``."""
    message = timestamp.encode("ascii") + b"." + body
    return V1 + hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def canonical_request(
    timestamp: str, method: str, path: str, headers: Iterable[tuple[str, str]], body: bytes
) -> bytes:
    """What a v2 signature signs, lines joined by ``\\n``: ``tideflow-v2``, the timestamp,
    the method (upper-case), the path, the ``Content-Type`` as sent (empty when none),
    one ``name:value`` line per ``ce-*`` header (names lower-case, sorted by name then
    value, values as sent without surrounding white space), the body's SHA-256 (hex)."""
    pairs = [(name.lower(), value.strip()) for name, value in headers]
    content_type = next((value for name, value in pairs if name == "content-type"), "")
    events = sorted((name, value) for name, value in pairs if name.startswith("ce-"))
    lines = [
        V2_LABEL,
        timestamp.encode("ascii"),
        method.upper().encode("ascii"),
        path.encode("utf-8"),
        _bytes(content_type),
        *(_bytes(f"{name}:{value}") for name, value in events),
        hashlib.sha256(body).hexdigest().encode("ascii"),
    ]
    return b"\n".join(lines)


def sign_v2(
    secret: str,
    timestamp: str,
    method: str,
    path: str,
    headers: Iterable[tuple[str, str]],
    body: bytes,
) -> str:
    """The v2 signature (``v2=<hex>``) of a request sent at ``timestamp``."""
    message = canonical_request(timestamp, method, path, headers, body)
    return V2 + hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def check_signature(
    request: EventRequest, secrets: Sequence[str], now: float, replay_window: float
) -> None:
    """`SignatureRefused` unless ``request`` carries a signature, under one of
    ``secrets``, that covers what it routes by, at a timestamp inside the window."""
    timestamp = request.header(TIMESTAMP_HEADER).strip()
    offered = [s.lower() for s in request.header(SIGNATURE_HEADER).split()]
    if not timestamp or not offered:
        raise SignatureRefused("no signature or no timestamp")
    if not (timestamp.isascii() and timestamp.isdigit()) or len(timestamp) > MAX_TIMESTAMP_DIGITS:
        shown = timestamp if len(timestamp) <= 40 else timestamp[:40] + "..."
        raise SignatureRefused(f"timestamp {shown!r} is not unix seconds")
    skew = now - int(timestamp)
    if abs(skew) > replay_window:
        raise SignatureRefused(
            f"timestamp {timestamp} is {skew:.0f} s from now, outside the replay window "
            f"of {replay_window:g} s"
        )
    v2 = [_v2(secret, timestamp, request) for secret in secrets]
    v1 = [sign(secret, timestamp, request.body) for secret in secrets]
    if _any_equal(v2 + v1 if request.self_contained else v2, offered):
        return
    if _any_equal(v1, offered):
        raise SignatureRefused(
            "a sha256= (v1) signature covers the body only, and in binary mode the "
            "attributes are ce-* headers: sign the request with v2="
        )
    raise SignatureRefused("bad signature")


def _v2(secret: str, timestamp: str, request: EventRequest) -> str:
    return sign_v2(secret, timestamp, request.method, request.path, request.headers, request.body)


def _any_equal(expected: list[str], offered: list[str]) -> bool:
    return any(hmac.compare_digest(e.encode(), o.encode()) for e in expected for o in offered)


def _bytes(text: str) -> bytes:
    """A header value's bytes as they came (HTTP servers decode them as Latin-1); text
    beyond Latin-1 (a sender's own str) as UTF-8."""
    try:
        return text.encode("latin-1")
    except UnicodeEncodeError:
        return text.encode("utf-8")
