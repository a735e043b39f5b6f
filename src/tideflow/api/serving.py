"""Serving the API with uvicorn beside a `tideflow server`'s engine (``--http HOST:PORT``).

uvicorn runs as a task in the server's own event loop, over the server's client, and
stops with the server: the server's SIGTERM handler stops it (uvicorn's own signal
handling is turned off). Every request needs an API token of the server's store
(api/auth_http.py), so the API may listen on any address. Served without
authentication (``--no-auth``) it listens on a loopback address only (`parse_address`
refuses any other) and says so loudly when it starts.

It answers to the Host headers ``hosts_of`` gives (api/browsers.py): the bound address,
the loopback names and ``--allowed-host``; any host on a wildcard bind with tokens and
no ``--allowed-host``, which it logs.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import socket
from collections.abc import AsyncIterator, Generator, Sequence

import uvicorn

from tideflow.api.app import DEFAULT_MAX_BODY, Metrics, create_app
from tideflow.api.browsers import allowed_hosts as allowed_hosts_of
from tideflow.api.changes import RunChanges
from tideflow.api.compiling import CompilerPool
from tideflow.api.event_sources import EventSources
from tideflow.api.stream_slots import DEFAULT_MAX_STREAMS, DEFAULT_MAX_STREAMS_PER_TOKEN
from tideflow.client import Client
from tideflow.errors import StoreError
from tideflow.lifecycle import Stop
from tideflow.ui.sessions import Sessions

log = logging.getLogger("tideflow.api")

GRACE = 5
"""Seconds open requests get to finish when the server stops."""


class AddressRefused(ValueError):
    """An ``--http`` address the API may not listen on."""


def parse_address(text: str, *, auth: bool = True) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6); port 0 picks a free one. Without ``auth``
    a loopback host only. ``AddressRefused`` otherwise."""
    host, sep, port = text.strip().rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise AddressRefused(f"--http {text}: give HOST:PORT, such as 127.0.0.1:8080")
    if not auth and not _loopback(host):
        raise AddressRefused(
            f"--http {text} --no-auth: an API without authentication listens on a loopback "
            "address only (127.0.0.1, ::1 or localhost); drop --no-auth to serve it to "
            "other machines with API tokens (`tideflow tokens create`)"
        )
    return host, int(port)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


_WILDCARDS = frozenset({"0.0.0.0", "::"})


def hosts_of(sock: socket.socket, allowed: Sequence[str], auth: bool) -> list[str] | None:
    """The Host names the API on ``sock`` answers to (``create_app``'s
    ``allowed_hosts``): ``allowed`` and the bound address (and the loopback names, which
    ``create_app`` adds); None (any host) for a wildcard bind with ``auth`` and nothing
    ``allowed``."""
    bound = str(sock.getsockname()[0])
    if bound in _WILDCARDS:
        return None if auth and not allowed else list(allowed)
    return [*allowed, bound]


def listen(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (bound now, so a port in use is known before
    the server starts); ``OSError``."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    if host == "localhost":
        host = "127.0.0.1"
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


def address_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class _Embedded(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield  # the tideflow server's handlers stop it, and this with it


async def _say_how_it_is_guarded(client: Client, where: str, auth: bool) -> None:
    if not auth:
        log.warning(
            "the HTTP API on %s has NO AUTHENTICATION (--no-auth): anyone who can connect "
            "to it can register definitions and start, cancel and signal runs (it listens "
            "on loopback only)",
            where,
        )
        return
    try:
        tokens = await client.store.list_tokens()
    except StoreError as exc:  # the requests will say it too; the server still starts
        log.warning("cannot list the API tokens of the store: %s", exc.message)
        return
    if not any(not token.revoked for token in tokens):
        log.warning(
            "the HTTP API on %s needs an API token on every request but /health and "
            "/ready, and the store has no live one: create one with "
            "`tideflow tokens create --name NAME --role admin` (on this server's --store)",
            where,
        )


def _say_which_hosts(where: str, hosts: frozenset[str] | None) -> None:
    if hosts is None:
        log.info(
            "the HTTP API on %s answers to any Host header (API tokens, and a wildcard "
            "address or --allowed-host *): give --allowed-host NAME, once per name, to "
            "answer to those only",
            where,
        )
        return
    log.info("the HTTP API on %s answers to the hosts %s", where, ", ".join(sorted(hosts)))


@contextlib.asynccontextmanager
async def http_api(
    client: Client,
    stop: Stop,
    sock: socket.socket,
    max_body: int = DEFAULT_MAX_BODY,
    auth: bool = True,
    event_sources: EventSources | None = None,
    changes: RunChanges | None = None,
    sessions: Sessions | None = None,
    metrics: Metrics | None = None,
    max_streams: int = DEFAULT_MAX_STREAMS,
    max_streams_per_token: int = DEFAULT_MAX_STREAMS_PER_TOKEN,
    allowed_hosts: Sequence[str] = (),
    compilers: CompilerPool | None = None,
) -> AsyncIterator[None]:
    """Serve the API (and the web UI at ``/ui``, and ``metrics`` on ``/metrics``) on
    ``sock`` while the block runs, with API tokens unless ``auth`` is False; ``sessions``
    that are ``required`` (`tideflow ui`) guard it instead. ``changes``: the hub the engine
    tells of run changes; ``max_streams`` and ``max_streams_per_token`` cap the open event
    streams (``create_app``). When uvicorn ends on its own, the server is stopped too.
    ``allowed_hosts``: Host names it answers to besides the bound address and the
    loopback names (``hosts_of``; ``ValueError`` for a bad one).

    The definitions requests carry compile in ``compilers`` (default: a pool of processes
    sized by ``TIDEFLOW_COMPILE_WORKERS`` and ``TIDEFLOW_COMPILE_TIMEOUT``, started and
    stopped with the API; api/compiling.py), never on the event loop."""
    where = address_of(sock)
    changes = changes or RunChanges()
    if sessions is None or not sessions.required:
        await _say_how_it_is_guarded(client, where, auth)
    hosts = hosts_of(sock, allowed_hosts, auth)
    own = compilers is None
    compiler = compilers or CompilerPool.from_environment(client.action_types, os.environ)
    await compiler.start()
    await compiler.ready()  # a server that says it listens can compile at once
    app = create_app(
        client,
        auth=auth,
        max_body=max_body,
        event_sources=event_sources,
        changes=changes,
        sessions=sessions,
        metrics=metrics,
        max_streams=max_streams,
        max_streams_per_token=max_streams_per_token,
        allowed_hosts=hosts,
        compiler=compiler,
    )
    _say_which_hosts(where, allowed_hosts_of(hosts, auth=auth))
    config = uvicorn.Config(
        app,
        log_config=None,
        lifespan="off",
        access_log=False,
        timeout_graceful_shutdown=GRACE,
    )
    server = _Embedded(config)
    serving = asyncio.create_task(server.serve(sockets=[sock]), name="tideflow-http")

    def ended(task: asyncio.Task[None]) -> None:
        if not server.should_exit:
            error = None if task.cancelled() else task.exception()
            log.error("the HTTP API on %s stopped: %s", where, error or "uvicorn exited")
            stop.set("the HTTP API stopped")

    serving.add_done_callback(ended)
    guard = "API tokens" if auth else "no authentication"
    if sessions is not None and sessions.required:
        guard = "the web UI's one-time link"
    log.info("HTTP API listening on %s (%s)", where, guard)
    try:
        yield
    finally:
        changes.close()  # the event streams end, so that uvicorn need not wait for them
        server.should_exit = True
        await asyncio.wait([serving])  # how it ended is logged by `ended`
        sock.close()
        if own:
            await compiler.close()


__all__ = ["AddressRefused", "address_of", "hosts_of", "http_api", "listen", "parse_address"]
