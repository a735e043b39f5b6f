"""The web UI: static assets (ES modules, CSS, SVG drawn in the browser; no build step,
no CDN), the plan layout computed in Python, and browser sessions. Served under ``/ui``
by the API app (api/app.py) of `tideflow server --http` and of `tideflow ui`."""

__all__: list[str] = []
