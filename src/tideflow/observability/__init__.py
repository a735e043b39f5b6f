"""Observability hooks: structured logs (``logging``), Prometheus metrics (``metrics``,
the ``metrics`` extra). They hook into the engine's observer port, the worker's
interceptor chain and the log records; nothing in the engine imports them."""
