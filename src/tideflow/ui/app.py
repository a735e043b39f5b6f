"""The web UI's own routes, mounted at ``/ui`` on the API app: the page, its assets and
the session routes (login with an API token or the one-time code, logout, who am I).
Everything the page shows comes from the API's routes (docs/api.md)."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from tideflow.errors import Unauthenticated
from tideflow.model.tokens import PERMISSIONS
from tideflow.ui.sessions import COOKIE, CSRF_HEADER, LIFETIME, Sessions

__all__ = ["STATIC", "ui_app"]

STATIC = Path(str(files("tideflow.ui") / "static"))
_NO_STORE = {"Cache-Control": "no-store"}
_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)


def ui_app(sessions: Sessions | None) -> Starlette:
    """The UI; ``sessions`` None: the API checks no tokens (`--no-auth`), nor does the UI."""

    async def page(request: Request) -> Response:
        return FileResponse(STATIC / "index.html", headers={**_NO_STORE, **_security()})

    async def whoami(request: Request) -> Response:
        if sessions is None:
            return _me("anonymous (no authentication)", "admin", "none")
        try:
            principal = await sessions.principal(request.cookies.get(COOKIE))
        except Unauthenticated as exc:
            return _refused(exc.message)
        if principal is None:
            mode = "link" if sessions.required else "token"
            return _refused("log in", mode)
        return _me(principal.name, principal.role.value, "link" if sessions.required else "token")

    async def login(request: Request) -> Response:
        if sessions is None:
            return JSONResponse({"detail": "this server checks no tokens"}, 400)
        if request.method == "GET":  # the one-time link `tideflow ui` printed
            session_id = sessions.redeem(request.query_params.get("code", ""))
            if session_id is None:
                return Response(_USED, 401, media_type="text/plain", headers=_NO_STORE)
            return _with_cookie(RedirectResponse("/ui/", 303), session_id, request)
        if CSRF_HEADER not in request.headers:
            return _refused(f"send the {CSRF_HEADER} header")
        try:
            body = await request.json()
            token = body["token"] if isinstance(body, dict) else None
            if not isinstance(token, str):
                raise ValueError("no token")
            session_id, principal = await sessions.login(token)
        except (ValueError, KeyError, RecursionError):  # RecursionError: JSON nested too deep
            return _refused('send {"token": "tf_…"}: an API token (tideflow tokens create)')
        except Unauthenticated:
            return _refused("that is not a live API token")
        response = _me(principal.name, principal.role.value, "token")
        return _with_cookie(response, session_id, request)

    async def logout(request: Request) -> Response:
        if sessions is not None:
            sessions.end(request.cookies.get(COOKIE))
        response = Response(status_code=204)
        response.delete_cookie(COOKIE, path="/")
        return response

    return Starlette(
        routes=[
            Route("/", page),
            Route("/whoami", whoami),
            Route("/login", login, methods=["GET", "POST"]),
            Route("/logout", logout, methods=["POST"]),
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
        ]
    )


_USED = (
    "This link is wrong or was used already: a `tideflow ui` link opens one browser "
    "session. Stop `tideflow ui` and start it again for a new link.\n"
)


def _security() -> dict[str, str]:
    return {
        "Content-Security-Policy": _CSP,
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
    }


def _me(name: str, role: str, mode: str) -> JSONResponse:
    from tideflow.model.tokens import Role

    actions = sorted(a.value for a in PERMISSIONS[Role(role)])
    body = {"name": name, "role": role, "actions": actions, "login": mode}
    return JSONResponse(body, headers=_NO_STORE)


def _refused(detail: str, mode: str = "token") -> JSONResponse:
    return JSONResponse({"detail": detail, "login": mode}, 401, headers=_NO_STORE)


def _with_cookie(response: Response, session_id: str, request: Request) -> Response:
    response.set_cookie(
        COOKIE,
        session_id,
        max_age=int(LIFETIME),
        path="/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response
