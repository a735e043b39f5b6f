"""``/docs`` (Swagger UI) and ``/redoc`` (ReDoc) over ``/openapi.json``, with their
scripts and styles served by this server from the ``fastapi-offline`` package (pinned in
pyproject.toml, so the assets are too): FastAPI's own pages load them from a CDN, at
whatever version it serves that day, and not at all on a machine without the internet
(docs/api.md)."""

from __future__ import annotations

import base64
import hashlib
import html
from importlib.resources import files
from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_oauth2_redirect_html
from starlette.responses import HTMLResponse
from starlette.staticfiles import StaticFiles

__all__ = ["ASSETS", "docs_pages"]

ASSETS = "/docs/assets"
"""Where the bundled files are served."""
_FILES = Path(str(files("fastapi_offline") / "static"))
_OAUTH2_REDIRECT = "/docs/oauth2-redirect"
_SWAGGER_SCRIPT = """
SwaggerUIBundle({
  url: "%(openapi)s",
  dom_id: "#swagger-ui",
  layout: "BaseLayout",
  deepLinking: true,
  showExtensions: true,
  showCommonExtensions: true,
  validatorUrl: null,
  oauth2RedirectUrl: window.location.origin + "%(redirect)s",
  presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
  // the server refuses a request that changes something without a JSON Content-Type,
  // body or no body: "Try it out" on a route without one (activate, pause, DELETE) too
  requestInterceptor: (request) => {
    const named = Object.keys(request.headers).some((k) => k.toLowerCase() === "content-type");
    if (request.method !== "GET" && !named) request.headers["Content-Type"] = "application/json";
    return request;
  },
});
"""
_SWAGGER_UI = """<!DOCTYPE html>
<html>
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1.0">
<title>%(title)s - Swagger UI</title>
<link rel="stylesheet" href="%(assets)s/swagger-ui.css">
<link rel="icon" href="%(assets)s/favicon.png">
</head>
<body>
<div id="swagger-ui"></div>
<script src="%(assets)s/swagger-ui-bundle.js"></script>
<script>%(script)s</script>
</body>
</html>
"""
_POLICY = (
    "default-src 'self'; script-src 'self'%s; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; font-src 'self'; worker-src 'self' blob:; connect-src 'self'; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)
"""What the pages may load: this server's files only (the inline styles both UIs set,
ReDoc's search worker from a blob, Swagger UI's one inline script by its hash)."""


def _headers(inline_script: str | None = None) -> dict[str, str]:
    allowed = ""
    if inline_script is not None:
        digest = hashlib.sha256(inline_script.encode()).digest()
        allowed = f" 'sha256-{base64.b64encode(digest).decode()}'"
    return {"Content-Security-Policy": _POLICY % allowed, "X-Content-Type-Options": "nosniff"}


def docs_pages(app: FastAPI) -> None:
    """The two pages, Swagger UI's OAuth2 redirect and the assets on ``app``, which was
    made with ``docs_url=None, redoc_url=None`` (not in the OpenAPI document). Swagger
    UI's page is FastAPI's with two changes: its "Try it out" sends a JSON Content-Type
    on every request that changes something (api/browsers.py), and it asks no outside
    validator. Both pages carry a Content-Security-Policy that lets them load nothing
    but this server's files (ReDoc's footer logo, from its CDN, is not loaded)."""
    openapi_url = app.openapi_url or "/openapi.json"
    app.mount(ASSETS, StaticFiles(directory=_FILES), name="docs-assets")

    script = _SWAGGER_SCRIPT % {"openapi": openapi_url, "redirect": _OAUTH2_REDIRECT}
    swagger = _SWAGGER_UI % {"title": html.escape(app.title), "assets": ASSETS, "script": script}
    swagger_headers = _headers(script)

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        return HTMLResponse(swagger, headers=swagger_headers)

    @app.get(_OAUTH2_REDIRECT, include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get("/redoc", include_in_schema=False)
    async def redoc() -> HTMLResponse:
        page = get_redoc_html(
            openapi_url=openapi_url,
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{ASSETS}/redoc.standalone.js",
            redoc_favicon_url=f"{ASSETS}/favicon.png",
            with_google_fonts=False,
        )
        page.headers.update(_headers())
        return page
