"""The bus port and its backends, chosen by URL.

``memory://`` (or ``local://``): the in-process bus, nothing to start; options in
the query: ``?partitions=16&lease=30`` (event partitions; seconds a delivery is
held without an ack).

``redis://[user:password@]host:port/db`` (or ``rediss://`` for TLS): the Redis Streams
bus (``pip install 'tideflow[redis]'``), with ``?prefix=tideflow&partitions=16&lease=30``
(``prefix``: the start of every key it creates, so that several clusters share a server).

``nats://host:4222`` (``tls://`` for TLS; several servers: ``nats://a:4222,b:4222``;
``user:password@`` before the host): the NATS JetStream bus (``pip install
'tideflow[nats]'``); options ``?prefix=tideflow&partitions=16&lease=30&max_deliver=10``
(the prefix of its subjects, streams and consumers, so that clusters can share a
server; deliveries of a task before it goes to the dead-letter subject, -1: no
limit). See docs/operations.md, "NATS JetStream bus".
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from tideflow.bus.base import Bus
from tideflow.errors import BusError

DEFAULT_URL = "memory://"

__all__ = ["DEFAULT_URL", "Bus", "BusError", "open_bus"]


def open_bus(url: str) -> Bus:
    """A bus for ``url`` (not yet opened: ``await bus.open()``)."""
    scheme = url.split(":", 1)[0].lower() if "://" in url else ""
    if scheme in ("memory", "local"):
        from tideflow.bus.backends.local import LocalBus

        partitions, lease = _local_options(url)
        return LocalBus(partitions=partitions, lease=lease)
    if scheme in ("redis", "rediss"):
        return _redis_bus(url)
    if scheme in ("nats", "tls"):
        return _nats_bus(url)
    raise BusError(
        f"unknown bus URL {url!r}: use memory:// (in-process), redis://host:port/db "
        "(Redis Streams) or nats://host:4222 (NATS JetStream)"
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


def _redis_bus(url: str) -> Bus:
    try:
        from tideflow.bus.backends.redis import RedisBus
    except ImportError as exc:
        if not (exc.name or "").startswith("redis"):
            raise
        raise BusError(
            f"bus URL {url.split('://', 1)[0]}:// needs redis-py: pip install 'tideflow[redis]'"
        ) from None
    parts = urlsplit(url)
    if parts.fragment:
        raise BusError(f"bus URL {url!r}: a Redis bus URL has no #fragment")
    try:
        parts.port  # noqa: B018 (a bad port raises)
    except ValueError:
        raise BusError(f"bus URL {url!r}: the port is not a number") from None
    db = parts.path.strip("/") or "0"
    if not db.isdigit():
        raise BusError(
            f"bus URL {url!r}: the path is the database number (redis://host:6379/0), got {db!r}"
        )
    options: dict[str, Any] = {}
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        try:
            if key == "prefix":
                options["prefix"] = value
            elif key == "partitions":
                options["partitions"] = int(value)
            elif key == "lease":
                options["lease"] = float(value)
            else:
                raise BusError(
                    f"bus URL {url!r}: unknown option {key!r}; the options are prefix, "
                    "partitions, lease"
                )
        except ValueError:
            raise BusError(f"bus URL {url!r}: {key}={value!r} is not a number") from None
    server = urlunsplit((parts.scheme, parts.netloc, f"/{db}", "", ""))
    return RedisBus(server, **options)
