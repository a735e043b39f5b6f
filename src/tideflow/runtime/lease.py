"""One engine per store: the engine lease, its heartbeat, and whether its holder lives.

An engine takes the store's ``engine`` lease (a row in the store) before it resumes
or advances any run, renews it every ``ttl / 5`` seconds and releases it on close;
a second engine on the same store is refused (``EngineAlreadyRunning``, naming the
holder) unless told to wait for it. A holder that died without releasing is taken
over once its lease expires, or at once when it ran on this host and its process
is gone (a SIGKILLed `tideflow run` on the same SQLite file).

A *client* (`tideflow runs signal` while no engine is live) holds the same lease for
the moment it takes to record one event, so that no engine starts half-way through;
an engine starting then waits for it instead of refusing.

Lease times are wall-clock seconds (``time.time()``), whatever clock the runtime's
core uses: they are compared across processes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping

from tideflow.bus.closing import cancel_and_wait
from tideflow.errors import EngineAlreadyRunning
from tideflow.model.events import Event
from tideflow.runtime.inbox import Inbox
from tideflow.store.base import ENGINE_LEASE, MEMBER_LEASES, Lease, Store

log = logging.getLogger("tideflow.lease")

DEFAULT_TTL = 10.0
"""Seconds a lease lasts without renewal: how long a dead engine on another host (or
one whose process cannot be checked) keeps its store."""
TTL_ENV = "TIDEFLOW_ENGINE_LEASE_TTL"
CLIENT_WAIT = 5.0
"""How long an engine (or a client) waits for a client's moment with the lease."""
HOST = socket.gethostname()

ENGINE = "engine"
CLIENT = "client"


def process_alive(pid: int) -> bool:
    """Whether a process with this id runs on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        return True
    except OSError:
        return True
    return True


def is_live(lease: Lease, now: float) -> bool:
    """The holder still counts: its lease has not expired and, on this host, its process
    is still there."""
    if lease.expires_at <= now:
        return False
    return lease.host != HOST or lease.pid == os.getpid() or process_alive(lease.pid)


def describe(lease: Lease, now: float) -> str:
    """The holder as a person reads it."""
    what = "a tideflow engine" if lease.kind == ENGINE else "a tideflow command"
    return (
        f"{what} (pid {lease.pid} on host {lease.host}, since "
        f"{time.strftime('%H:%M:%S', time.localtime(lease.acquired_at))}; its lease expires "
        f"in {max(lease.expires_at - now, 0.0):.1f}s unless renewed)"
    )


class StoreLease:
    """This process's claim on a store's engine lease."""

    def __init__(self, store: Store, *, kind: str, ttl: float = DEFAULT_TTL) -> None:
        if not ttl > 0:
            raise ValueError(f"a lease must last a positive number of seconds, not {ttl!r}")
        self.store = store
        self.kind = kind
        self.ttl = ttl
        self.owner = f"{HOST}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
        self.held = False
        self._heartbeat: asyncio.Task[None] | None = None

    def _candidate(self, address: str | None, now: float) -> Lease:
        return Lease(
            name=ENGINE_LEASE,
            owner=self.owner,
            kind=self.kind,
            host=HOST,
            pid=os.getpid(),
            address=address,
            acquired_at=now,
            expires_at=now + self.ttl,
        )

    async def try_acquire(self, address: str | None = None) -> Lease:
        """One attempt; the holder afterwards (this process's lease when taken)."""
        now = time.time()
        candidate = self._candidate(address, now)
        holder = await self.store.acquire_lease(candidate, now=now)
        if holder.owner != self.owner and not is_live(holder, now):  # died on this host
            holder = await self.store.acquire_lease(candidate, now=now, take_from=holder.owner)
        self.held = holder.owner == self.owner
        return holder

    async def acquire(
        self, address: str | None = None, *, wait_for_engine: float = 0.0
    ) -> Lease | None:
        """Take the lease: None when taken, else the live engine that holds it. A client's
        moment is waited out (up to ``CLIENT_WAIT``), a live engine up to ``wait_for_engine``
        seconds; only startup waits like this, never an engine in steady state."""
        began = time.monotonic()
        delay = 0.01
        while True:
            holder = await self.try_acquire(address)
            if self.held:
                return None
            waited = time.monotonic() - began
            patience = CLIENT_WAIT if holder.kind == CLIENT else wait_for_engine
            if waited >= patience:
                return holder
            await asyncio.sleep(min(delay, patience - waited))
            delay = min(delay * 2, 0.25)

    def keep(self, on_lost: Callable[[], None]) -> None:
        """Renew the lease every ``ttl / 5`` seconds; ``on_lost`` when another took it over."""
        self._heartbeat = asyncio.create_task(self._beat(on_lost), name="tideflow-lease")

    async def _beat(self, on_lost: Callable[[], None]) -> None:
        while True:
            await asyncio.sleep(self.ttl / 5)
            try:
                renewed = await self.store.renew_lease(
                    ENGINE_LEASE, self.owner, time.time() + self.ttl
                )
            except Exception as exc:  # the store is down for a moment: the lease has time
                log.warning(
                    "engine lease not renewed (%s: %s); trying again", type(exc).__name__, exc
                )
                continue
            if not renewed:
                self.held = False
                on_lost()
                return

    async def release(self) -> None:
        if self._heartbeat is not None:
            await cancel_and_wait(self._heartbeat)
            self._heartbeat = None
        if self.held:
            self.held = False
            try:
                await self.store.release_lease(ENGINE_LEASE, self.owner)
            except Exception as exc:  # it expires by itself
                log.warning("engine lease not released (%s: %s)", type(exc).__name__, exc)


class EngineSeat:
    """What makes a runtime the store's one engine: the lease, and the inbox it applies."""

    def __init__(
        self,
        store: Store,
        apply: Callable[[list[Event]], Awaitable[object]],
        *,
        ttl: float = DEFAULT_TTL,
        wait_for_engine: float = 0.0,
    ) -> None:
        self.lease = StoreLease(store, kind=ENGINE, ttl=ttl)
        self.inbox = Inbox(store, apply)
        self._wait_for_engine = wait_for_engine

    async def take(self) -> None:
        """Listen for inbox events, then take the lease (in that order: a client that
        reads this lease's address finds someone listening); EngineAlreadyRunning when a
        live engine holds it."""
        address = await self.inbox.listen()
        holder = await self.lease.acquire(address, wait_for_engine=self._wait_for_engine)
        if holder is not None:
            await self.inbox.close()
            raise EngineAlreadyRunning(refusal(holder))
        servers = await cluster_members(self.lease.store)
        if servers:  # servers join under this lease: none can be half-way in
            await self.inbox.close()
            await self.lease.release()
            raise EngineAlreadyRunning(served_by_cluster(servers))

    def start(self, on_lost: Callable[[], None]) -> None:
        """Apply what is in the inbox now and whatever arrives; keep the lease."""
        self.inbox.start()
        self.lease.keep(on_lost)

    async def stop_listening(self) -> None:
        await self.inbox.close()

    async def release(self) -> None:
        await self.lease.release()


def refusal(holder: Lease) -> str:
    return (
        f"another engine is running on this store: {describe(holder, time.time())}. Only one "
        "engine may advance a store's runs: send its runs signals, cancels and retries with "
        "`tideflow runs signal|cancel|retry` (they reach it at once), wait until it exits "
        "(or pass --wait-for-engine SECONDS), or use another --store"
    )


async def cluster_members(store: Store, now: float | None = None) -> list[Lease]:
    """The live `tideflow server` processes of a cluster on this store (none embedded)."""
    moment = time.time() if now is None else now
    return [lease for lease in await store.list_leases(MEMBER_LEASES) if lease.expires_at > moment]


def served_by_cluster(servers: list[Lease]) -> str:
    where = ", ".join(f"pid {s.pid} on {s.host}" for s in servers[:5])
    return (
        f"this store is served by a cluster of {len(servers)} live `tideflow server` "
        f"process(es) ({where}): it applies the runs' events from its bus. Give `tideflow "
        "runs …` the cluster's bus (--bus URL or TIDEFLOW_BUS) to steer them, and stop the "
        "servers before running an embedded engine (`tideflow run`, `tideflow resume`) on it"
    )


def ttl_from_environment(environ: Mapping[str, str]) -> float:
    text = environ.get(TTL_ENV, "").strip()
    if not text:
        return DEFAULT_TTL
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(
            f"{TTL_ENV}={text!r}: give the engine lease's lifetime in seconds (e.g. 10)"
        )
    return value


__all__ = [
    "DEFAULT_TTL",
    "EngineSeat",
    "StoreLease",
    "cluster_members",
    "describe",
    "is_live",
    "process_alive",
    "served_by_cluster",
    "ttl_from_environment",
]
