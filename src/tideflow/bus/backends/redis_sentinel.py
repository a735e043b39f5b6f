"""The Redis bus behind Redis Sentinel: where the master is, asked of the sentinels.

URL form (parsed by ``tideflow.bus.open_bus``)::

    redis+sentinel://[user:password@]host1:port1[,host2:port2,...]/<master-name>[/<db>][?options]

The hosts are the *sentinels* (any number, at least one; the port defaults to 26379),
the first path segment is the name the sentinels monitor the master under (``sentinel
monitor <name> …``), the optional second one the database number (0). ``user:password``
are the credentials of the data nodes (master and replicas); the sentinels are asked
without them. The options are the Redis bus's (``prefix``, ``partitions``, ``lease``)
and ``wait`` / ``wait_timeout`` (below). A master name is a path segment, never a host,
so ``host:port`` lists and names cannot be confused.

The connections come from redis-py's ``SentinelConnectionPool``: each new connection
asks the sentinels for the master's address (the first sentinel that answers with a
master it does not consider down), and a connection that finds its server demoted
(``READONLY``) drops itself. When the master dies, commands fail with connection
errors until the sentinels have promoted a replica (``down-after-milliseconds`` plus
the election, a few seconds): the consumers retry with backoff (redis_consumers'
``Backoff``, 50 ms doubling to 5 s), the producer's ``BusError`` is retried by the
relay, so the bus rides through the failover on the new master. The pool blocks for a
free connection like the plain bus's (``BlockingConnectionPool``).

``wait=N`` makes every publish (``publish_tasks``, ``publish_events``) end with ``WAIT N
<wait_timeout ms>`` in the same pipeline: the publish returns only when ``N`` replicas
have the entries, so a failover that promotes one of them cannot lose it (Redis
replicates asynchronously: without it, what the master acknowledged in its last moments
and had not yet sent is gone). When fewer replicas confirm within ``wait_timeout``
(seconds, default 1), the publish fails with ``BusError`` and its caller tries again:
the entries stay on the master, so the retry can deliver them twice, which the engine
already tolerates (the same attempt, its first outcome applied). ``wait`` is also
accepted on a plain ``redis://`` URL of a master with replicas.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import redis.asyncio as aioredis
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool

from tideflow.errors import BusError

SCHEME = "redis+sentinel"
DEFAULT_SENTINEL_PORT = 26379
SENTINEL_TIMEOUT = 1.0
"""Seconds a sentinel has to answer (connect, reply) before the next one is asked."""


@dataclass(frozen=True)
class SentinelTarget:
    """Where a Redis bus behind Sentinel finds its master: the sentinels' addresses, the
    master's name, the database, and the data nodes' credentials."""

    sentinels: tuple[tuple[str, int], ...]
    master: str
    db: int = 0
    username: str | None = None
    password: str | None = None


def parse_target(url: str, netloc: str, path: str) -> SentinelTarget:
    """The target of a ``redis+sentinel://`` URL, from its ``netloc`` and ``path``
    (split by the caller, query and fragment already taken off)."""
    auth, at, hosts = netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = auth.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    sentinels: list[tuple[str, int]] = []
    for host in hosts.split(","):
        sentinels.append(_address(url, host.strip()))
    segments = path.strip("/").split("/") if path.strip("/") else []
    if not segments or not segments[0]:
        raise BusError(
            f"bus URL {url!r}: name the master after the sentinels: "
            "redis+sentinel://host1:26379,host2:26379/<master-name>[/<db>]"
        )
    if len(segments) > 2:
        raise BusError(
            f"bus URL {url!r}: the path is /<master-name>[/<db>], got {path!r} "
            "(list every sentinel before it, separated by commas)"
        )
    master = unquote(segments[0])
    db = segments[1] if len(segments) == 2 else "0"
    if not db.isdigit():
        raise BusError(
            f"bus URL {url!r}: the database after the master name is a number, got {db!r}"
        )
    return SentinelTarget(tuple(sentinels), master, int(db), username, password)


def _address(url: str, host: str) -> tuple[str, int]:
    if not host:
        raise BusError(f"bus URL {url!r}: an empty sentinel address (a stray comma?)")
    if host.startswith("["):  # [IPv6]:port
        name, _, rest = host[1:].partition("]")
        port = rest.removeprefix(":")
    else:
        name, _, port = host.partition(":")
    if not name:
        raise BusError(f"bus URL {url!r}: a sentinel address without a host: {host!r}")
    if not port:
        return name, DEFAULT_SENTINEL_PORT
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise BusError(f"bus URL {url!r}: the port of sentinel {host!r} is not a port number")
    return name, int(port)


class BlockingSentinelPool(SentinelConnectionPool, aioredis.BlockingConnectionPool):
    """A ``SentinelConnectionPool`` that waits for a free connection (as the plain bus's
    ``BlockingConnectionPool`` does) instead of failing with "Too many connections"."""


class SentinelClientPool(aioredis.ConnectionPool):
    """The pool of the client of one sentinel, which closes on ``aclose`` every
    connection it made, also one that left its lists.

    A task cancelled while it asks a sentinel where the master is (a bus closing in the
    middle of a reconnection: the consumers' and the pub/sub loops' reconnections ask)
    can be cancelled inside redis-py's ``release``, between taking the connection out of
    the in-use set and putting it back: the connection is then in neither list, and
    ``disconnect`` never closes it (an unclosed socket for the garbage collector)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._made: set[Any] = set()

    def make_connection(self) -> Any:
        # forget what was closed and left the lists, so reconnections do not pile up
        listed = {*self._in_use_connections, *self._available_connections}
        self._made = {c for c in self._made if c.is_connected or c in listed}
        base: Any = super()  # make_connection is untyped in redis-py
        connection = base.make_connection()
        self._made.add(connection)
        return connection

    async def disconnect(self, inuse_connections: bool = True) -> None:
        await super().disconnect(inuse_connections)
        if inuse_connections:
            made, self._made = self._made, set()
            for connection in made:
                with contextlib.suppress(Exception):
                    await connection.disconnect()


def sentinel_pool(
    target: SentinelTarget, **connection: Any
) -> tuple[Sentinel, BlockingSentinelPool]:
    """The sentinels' client and a pool of connections to the master they name.
    ``connection``: the pool's keyword arguments (``max_connections``, ``timeout``,
    socket timeouts, ``retry``, …), as for ``BlockingConnectionPool``."""
    untyped: Any = Sentinel  # redis-py's sentinel module has no annotations
    manager: Sentinel = untyped([])
    manager.sentinels = [
        aioredis.Redis.from_pool(
            SentinelClientPool(
                host=host,
                port=port,
                socket_connect_timeout=SENTINEL_TIMEOUT,
                socket_timeout=SENTINEL_TIMEOUT,
            )
        )
        for host, port in target.sentinels
    ]
    pool_class: Any = BlockingSentinelPool
    pool: BlockingSentinelPool = pool_class(
        target.master,
        manager,
        db=target.db,
        username=target.username,
        password=target.password,
        **connection,
    )
    return manager, pool
