"""API tokens over HTTP: which routes need which action, checked before a route runs.

::

    @app.post("/runs", dependencies=[allow(Action.START)])

``allow(action)`` is a FastAPI dependency: it reads the ``Authorization`` header,
authenticates it against the store ``enable`` put on the app (``tideflow.api.auth``)
and requires the token's role to allow ``action``; an ``Unauthenticated`` becomes one
generic 401 with ``WWW-Authenticate: Bearer`` (api/problems.py), a ``Forbidden`` a
403 naming the role needed. A route without ``allow`` is open (``/health``,
``/ready``, the OpenAPI document).

The OpenAPI document shows it: a bearer security scheme, and on every route that
calls ``allow`` its ``security`` and its 401 and 403 responses (``document``). An app
served without authentication (``enable(app, None)``, ``tideflow server --no-auth``)
checks nothing and documents no security.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.openapi.models import HTTPBearer as HTTPBearerModel
from fastapi.security.base import SecurityBase

from tideflow.api.auth import Principal, authenticate, require
from tideflow.errors import Forbidden, MissingToken
from tideflow.model.tokens import Action
from tideflow.store.base import Store
from tideflow.ui.sessions import COOKIE, CSRF_HEADER, Sessions

__all__ = ["SCHEME", "action_of", "allow", "document", "enable"]

log = logging.getLogger("tideflow.api.auth")

SCHEME = "bearer"
"""The name of the security scheme in the OpenAPI document."""
_STORE = "tideflow_token_store"
_SESSIONS = "tideflow_ui_sessions"
_SAFE = frozenset({"GET", "HEAD", "OPTIONS"})
_UNAUTHENTICATED = "No live API token: missing, malformed, unknown, revoked or a wrong secret"
_FORBIDDEN = "The token's role does not allow this action (the detail names the role needed)"
_CHALLENGE = {
    "WWW-Authenticate": {
        "description": 'The challenge: `Bearer realm="tideflow"` (RFC 6750)',
        "schema": {"type": "string"},
    }
}


class BearerToken(SecurityBase):
    """The ``Authorization`` header as it came (``authenticate`` parses it), declared in
    the OpenAPI document as an HTTP bearer scheme."""

    def __init__(self) -> None:
        self.model = HTTPBearerModel(
            bearerFormat="tf_<id>_<secret>",
            description="An API token, as `tideflow tokens create` prints it.",
        )
        self.scheme_name = SCHEME

    async def __call__(self, request: Request) -> str | None:
        return request.headers.get("authorization")


_BEARER = BearerToken()


def enable(app: FastAPI, store: Store | None, sessions: Sessions | None = None) -> None:
    """Check tokens against ``store`` on every route that calls ``allow``; None: check
    nothing (an API served without authentication). With ``sessions`` a web UI
    session's cookie is taken too (ui/sessions.py); sessions that are ``required``
    (`tideflow ui`) let nobody in without one, whatever ``store`` says."""
    setattr(app.state, _STORE, store)
    setattr(app.state, _SESSIONS, sessions)


class _Allow:
    """The dependency ``allow`` returns; ``action`` says what it requires."""

    def __init__(self, action: Action) -> None:
        self.action = action

    async def __call__(
        self, request: Request, header: str | None = Depends(_BEARER)
    ) -> Principal | None:
        try:
            store: Store | None = getattr(request.app.state, _STORE)
        except AttributeError:  # fail closed: an app nobody said how to check lets none in
            raise RuntimeError(
                "a route calls tideflow.api.auth_http.allow on an app without "
                "tideflow.api.auth_http.enable(app, store) (None: no authentication)"
            ) from None
        sessions: Sessions | None = getattr(request.app.state, _SESSIONS, None)
        principal = await _session_of(request, sessions)
        if principal is None:
            if sessions is not None and sessions.required:
                raise MissingToken("open the web UI with the link `tideflow ui` printed")
            if store is None:
                return None
            principal = await authenticate(store, header)
        try:
            require(principal, self.action)
        except Forbidden as exc:
            log.info("403 %s %s: %s", request.method, request.url.path, exc.message)
            raise
        return principal


async def _session_of(request: Request, sessions: Sessions | None) -> Principal | None:
    """The principal of the request's UI session cookie, if it has one and (for a method
    that changes something) the UI's header with it."""
    if sessions is None:
        return None
    cookie = request.cookies.get(COOKIE)
    if cookie is None or (request.method not in _SAFE and CSRF_HEADER not in request.headers):
        return None
    return await sessions.principal(cookie)


def allow(action: Action) -> Any:
    """A dependency (``dependencies=[allow(Action.START)]``) that lets a request through
    only with a live token whose role allows ``action``: 401 without one, 403 when the
    role falls short. Its value is the ``Principal`` (None when authentication is off):
    ``principal: Annotated[Principal | None, allow(Action.SIGNAL)]`` in a route's
    parameters hands it to the route."""
    return Depends(_Allow(action))


def action_of(route: Any) -> Action | None:
    """The action a route's ``allow`` requires; None for an open route."""
    dependant = getattr(route, "dependant", None)
    for dependency in dependant.dependencies if dependant else ():
        if isinstance(dependency.call, _Allow):
            return dependency.call.action
    return None


def document(app: FastAPI, schema: dict[str, Any], problem: dict[str, Any]) -> None:
    """The OpenAPI ``schema`` as the app checks tokens: 401 and 403 (``problem``
    responses) on every route with ``security``; without authentication, no security at
    all."""
    enabled = getattr(app.state, _STORE, None) is not None
    if not enabled:
        schema.get("components", {}).pop("securitySchemes", None)
    for item in schema.get("paths", {}).values():
        for operation in item.values():
            if "security" not in operation:
                continue
            if not enabled:
                del operation["security"]
                continue
            responses = operation.setdefault("responses", {})
            responses["401"] = dict(problem, description=_UNAUTHENTICATED, headers=_CHALLENGE)
            responses["403"] = dict(problem, description=_FORBIDDEN)
