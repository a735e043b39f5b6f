"""The HTTP edge: the REST API as an ASGI app (``create_app``)."""

from tideflow.api.app import create_app

__all__ = ["create_app"]
