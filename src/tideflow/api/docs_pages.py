"""``/docs`` (Swagger UI) and ``/redoc`` (ReDoc) over ``/openapi.json``, with their
scripts and styles served by this server from the ``fastapi-offline`` package (pinned in
pyproject.toml, so the assets are too): FastAPI's own pages load them from a CDN, at
whatever version it serves that day, and not at all on a machine without the internet
(docs/api.md)."""

from __future__ import annotations

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
_SWAGGER_UI = """<!DOCTYPE html>
<html>
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1.0">
<title>{title} - Swagger UI</title>
<link rel="stylesheet" href="{assets}/swagger-ui.css">
<link rel="icon" href="{assets}/favicon.png">
</head>
<body>
<div id="swagger-ui"></div>
<script src="{assets}/swagger-ui-bundle.js"></script>
<script>
SwaggerUIBundle({{
  url: "{openapi}",
  dom_id: "#swagger-ui",
  layout: "BaseLayout",
  deepLinking: true,
  showExtensions: true,
  showCommonExtensions: true,
  oauth2RedirectUrl: window.location.origin + "{redirect}",
  presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
  // the server refuses a request that changes something without a JSON Content-Type,
  // body or no body: "Try it out" on a route without one (activate, pause, DELETE) too
  requestInterceptor: (request) => {{
    const named = Object.keys(request.headers).some((k) => k.toLowerCase() === "content-type");
    if (request.method !== "GET" && !named) request.headers["Content-Type"] = "application/json";
    return request;
  }},
}});
</script>
</body>
</html>
"""


def docs_pages(app: FastAPI) -> None:
    """The two pages, Swagger UI's OAuth2 redirect and the assets on ``app``, which was
    made with ``docs_url=None, redoc_url=None`` (not in the OpenAPI document). Swagger
    UI's page is FastAPI's with one addition: its "Try it out" sends a JSON
    Content-Type on every request that changes something (api/browsers.py)."""
    openapi_url = app.openapi_url or "/openapi.json"
    app.mount(ASSETS, StaticFiles(directory=_FILES), name="docs-assets")

    swagger = _SWAGGER_UI.format(
        title=html.escape(app.title),
        assets=ASSETS,
        openapi=openapi_url,
        redirect=_OAUTH2_REDIRECT,
    )

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        return HTMLResponse(swagger)

    @app.get(_OAUTH2_REDIRECT, include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get("/redoc", include_in_schema=False)
    async def redoc() -> HTMLResponse:
        return get_redoc_html(
            openapi_url=openapi_url,
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{ASSETS}/redoc.standalone.js",
            redoc_favicon_url=f"{ASSETS}/favicon.png",
            with_google_fonts=False,
        )
