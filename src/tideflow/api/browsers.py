"""What a web page in someone's browser cannot make the API do (docs/security.md,
"Browsers: CSRF and DNS rebinding"). Two middlewares, in front of everything else:

- ``MediaTypes``: a request that changes something (POST, PUT, PATCH, DELETE) must say
  that its body is of a type its route takes, or it is a 415 before anything reads it,
  with a body or without. A page of another site can send, without asking the server
  first, only a form or a ``no-cors`` ``fetch``: no Content-Type, ``text/plain``,
  ``application/x-www-form-urlencoded`` or ``multipart/form-data``. A JSON type needs a
  CORS preflight, which this server never grants. What a route takes is what its
  OpenAPI request body lists (``media_types``): JSON when it lists nothing, YAML too on
  the definition routes, anything for ``*/*`` (``POST /events``, CloudEvents binary mode,
  which authenticates every event's source itself).
- ``AllowedHosts``: a request whose ``Host`` header names a host the server does not
  answer to is a 421. DNS rebinding makes a page of ``evil.example`` reach a loopback
  server as if it were its own origin (the name is made to resolve to 127.0.0.1), but
  the browser still sends ``Host: evil.example``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence
from typing import Any

from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Receive, Scope, Send

from tideflow.api.problems import problem_response

__all__ = [
    "ANY_HOST",
    "JSON",
    "LOOPBACK_HOSTS",
    "YAML_TYPES",
    "AllowedHosts",
    "MediaTypes",
    "allowed_hosts",
    "document",
    "host_of",
    "media_types",
]

log = logging.getLogger("tideflow.api")

JSON = "application/json"
YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml")
MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
"""Always answered to: a page whose Host is one of these was loaded from this machine."""
ANY_HOST = "*"
_NAME = re.compile(r"[a-z0-9._\-]+|[0-9a-f:.]*:[0-9a-f:.]*")
"""A host name, an IPv4 address, or an IPv6 address (without its brackets)."""
_SHOWN = 100
"""Characters of a refused Host header the problem repeats."""


def media_types(route: BaseRoute) -> frozenset[str] | None:
    """The media types ``route`` takes in a body: those its OpenAPI request body lists
    (every YAML alias when it lists one; None, any type, for ``*/*``), else JSON only."""
    extra: dict[str, Any] = getattr(route, "openapi_extra", None) or {}
    listed = set(extra.get("requestBody", {}).get("content", {}))
    if "*/*" in listed:
        return None
    if listed & set(YAML_TYPES):
        listed |= set(YAML_TYPES)
    return frozenset(listed or {JSON})


def _media(value: bytes) -> str:
    return value.decode("latin-1").split(";", 1)[0].strip().lower()


def _values(scope: Scope, name: bytes) -> list[bytes]:
    return [value for key, value in scope["headers"] if key == name]


class MediaTypes:
    """415 for a request that changes something without a Content-Type its route takes.
    ``routes`` is the app's own list, read at each request (routes added later count);
    a request no route serves goes on to its 404 or 405."""

    def __init__(self, app: ASGIApp, routes: Sequence[BaseRoute]) -> None:
        self.app = app
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in MUTATING:
            await self.app(scope, receive, send)
            return
        taken = self._taken(scope)
        sent = _values(scope, b"content-type")
        if taken is None or (len(sent) == 1 and _media(sent[0]) in taken):
            await self.app(scope, receive, send)
            return
        response = problem_response(
            415, "unsupported-media-type", scope.get("path", ""), _refusal(scope, sent, taken)
        )
        await response(scope, receive, send)

    def _taken(self, scope: Scope) -> frozenset[str] | None:
        for route in self.routes:
            match, _ = route.matches(scope)
            if match is Match.FULL:
                return media_types(route)
        return None  # no route serves it: the 404 or 405 says more, and nothing runs


def _refusal(scope: Scope, sent: list[bytes], taken: frozenset[str]) -> str:
    if not sent:
        what = "no Content-Type"
    elif len(sent) > 1:
        what = "more than one Content-Type"
    else:
        what = f"Content-Type {_media(sent[0])[:_SHOWN]}"
    names = sorted(taken)
    takes = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
    return (
        f"{scope['method']} {scope.get('path', '')} takes {takes}, and this request has {what}: "
        f"send `Content-Type: {JSON if JSON in taken else min(taken)}` (with an empty body "
        "when there is nothing to send). A request that changes something must name its "
        "body's type, so that no other site's page can send it (docs/security.md)"
    )


def host_of(value: str) -> str | None:
    """The host a ``Host`` header names (``name``, ``name:port``, ``[v6]:port``): lower
    case, an IPv6 address without brackets; None when the value is not a host."""
    value = value.strip().lower()
    if value.startswith("["):
        host, closed, port = value[1:].partition("]")
        if not closed or ":" not in host or (port and not port.startswith(":")):
            return None
        if port and not _is_port(port[1:]):
            return None
    else:
        host, colon, port = value.partition(":")
        if colon and not _is_port(port):
            return None
    return host if host and _NAME.fullmatch(host) else None


def _is_port(text: str) -> bool:
    return text.isascii() and text.isdigit() and len(text) <= 5


def _name(given: str) -> str:
    """A host name as ``--allowed-host`` takes it: ``api.example.com``, ``10.0.0.5``,
    ``::1`` or ``[::1]``, or ``*``; ``ValueError`` for one with a port or a bad one."""
    text = given.strip().lower()
    if text == ANY_HOST:
        return text
    bare = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    if text.count(":") == 1 or not _NAME.fullmatch(bare):
        raise ValueError(
            f"--allowed-host {given!r}: give a host name or an address without a port "
            "(api.example.com, 10.0.0.5, ::1), or * for any host"
        )
    return bare


def allowed_hosts(names: Iterable[str] | None, *, auth: bool) -> frozenset[str] | None:
    """The hosts the API answers to: ``names`` and ``LOOPBACK_HOSTS``; None (any host)
    for ``*`` among ``names``, or for no ``names`` at all (None) with ``auth``.
    ``ValueError`` for a bad name, and for any host without ``auth``: an API without
    authentication always checks the Host header."""
    given = {_name(n) for n in names or ()}
    if ANY_HOST in given or (names is None and auth):
        if not auth:
            raise ValueError(
                "an API without authentication (--no-auth) always checks the Host header: "
                "name each host it is reached by (--allowed-host NAME), not *"
            )
        return None
    return frozenset(given) | LOOPBACK_HOSTS


class AllowedHosts:
    """421 for a request whose one ``Host`` header does not name one of ``hosts`` (any
    port); None: every host is answered."""

    def __init__(self, app: ASGIApp, hosts: frozenset[str] | None) -> None:
        self.app = app
        self.hosts = hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.hosts is None:
            await self.app(scope, receive, send)
            return
        sent = _values(scope, b"host")
        host = host_of(sent[0].decode("latin-1")) if len(sent) == 1 else None
        if host is not None and host in self.hosts:
            await self.app(scope, receive, send)
            return
        shown = sent[0].decode("latin-1")[:_SHOWN] if len(sent) == 1 else None
        log.info("421 %s %s: Host %r is not allowed", scope["method"], scope["path"], shown)
        detail = (
            f"this server answers to the hosts {', '.join(sorted(self.hosts))} (any port), "
            f"and this request is for {'no host' if shown is None else repr(shown)}: reach "
            "it by one of those names, or give the server --allowed-host NAME (docs/api.md)"
        )
        response = problem_response(421, "host-not-allowed", scope.get("path", ""), detail)
        await response(scope, receive, send)


_DESCRIPTIONS = {
    "415": "The request changes something and its Content-Type is not one the route takes "
    "(none counts): JSON, or YAML where listed",
    "421": "The Host header names a host this server does not answer to (docs/api.md)",
}


def document(schema: dict[str, Any], problem: dict[str, Any], hosts_checked: bool) -> None:
    """The OpenAPI ``schema`` as the middlewares answer: a 415 (``problem``) on every
    operation that changes something, a 421 on every one when hosts are checked."""
    for item in schema.get("paths", {}).values():
        for method, operation in item.items():
            responses = operation.setdefault("responses", {})
            if method.upper() in MUTATING:
                responses.setdefault("415", dict(problem, description=_DESCRIPTIONS["415"]))
            if hosts_checked:
                responses.setdefault("421", dict(problem, description=_DESCRIPTIONS["421"]))
