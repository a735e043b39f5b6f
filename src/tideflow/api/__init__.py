"""The HTTP edge: the REST API as an ASGI app (``create_app``, which needs the ``api``
extra) and API tokens (``tideflow.api.auth``, which does not)."""

from __future__ import annotations

from typing import Any

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":  # imported on use: FastAPI is the optional `api` extra
        from tideflow.api.app import create_app

        return create_app
    raise AttributeError(name)
