"""The bus port and its backends, chosen by URL.

``memory://`` (or ``local://``): the in-process bus, nothing to start; options in
the query: ``?partitions=16&lease=30`` (event partitions; seconds a delivery is
held without an ack).

``nats://host:4222`` (``tls://`` for TLS; several servers: ``nats://a:4222,b:4222``;
``user:password@`` before the host): the NATS JetStream bus (``pip install
'tideflow[nats]'``); options ``?prefix=tideflow&partitions=16&lease=30&max_deliver=10``
(the prefix of its subjects, streams and consumers, so that clusters can share a
server; deliveries of a task before it goes to the dead-letter subject, -1: no
limit). See docs/operations.md, "NATS JetStream bus".

``redis://`` names the Redis Streams backend, which is not built yet.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, urlsplit

from tideflow.bus.base import Bus
from tideflow.errors import BusError

DEFAULT_URL = "memory://"

__all__ = ["DEFAULT_URL", "Bus", "BusError", "open_bus"]

_COMING = {
    "redis": ("Redis Streams", "redis"),
    "rediss": ("Redis Streams", "redis"),
}


def open_bus(url: str) -> Bus:
    """A bus for ``url`` (not yet opened: ``await bus.open()``)."""
    scheme = url.split(":", 1)[0].lower() if "://" in url else ""
    if scheme in ("memory", "local"):
        from tideflow.bus.backends.local import LocalBus

        partitions, lease = _local_options(url)
        return LocalBus(partitions=partitions, lease=lease)
    if scheme in ("nats", "tls"):
        return _nats_bus(url)
    if scheme in _COMING:
        name, extra = _COMING[scheme]
        raise BusError(
            f"the {name} bus ({url.split('://', 1)[0]}://) is not built yet: use memory:// "
            f"for now; when it lands it will need: pip install 'tideflow[{extra}]'"
        )
    raise BusError(
        f"unknown bus URL {url!r}: use memory:// (in-process) or nats:// (NATS JetStream); "
        "redis:// is coming"
    )


def _nats_bus(url: str) -> Bus:
    try:
        from tideflow.bus.backends.nats import from_url
    except ImportError as exc:
        if (exc.name or "").split(".")[0] != "nats":
            raise
        raise BusError(
            f"the NATS JetStream bus ({url.split('://', 1)[0]}://) needs nats-py: "
            "pip install 'tideflow[nats]'"
        ) from None
    return from_url(url)


def _local_options(url: str) -> tuple[int, float]:
    parts = urlsplit(url)
    if parts.netloc or parts.path not in ("", "/"):
        raise BusError(f"bus URL {url!r}: the in-process bus takes no host or path, only ?options")
    from tideflow.bus.base import DEFAULT_LEASE, DEFAULT_PARTITIONS

    partitions, lease = DEFAULT_PARTITIONS, DEFAULT_LEASE
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        try:
            if key == "partitions":
                partitions = int(value)
            elif key == "lease":
                lease = float(value)
            else:
                raise BusError(
                    f"bus URL {url!r}: unknown option {key!r}; the options are partitions, lease"
                )
        except ValueError:
            raise BusError(f"bus URL {url!r}: {key}={value!r} is not a number") from None
    return partitions, lease
