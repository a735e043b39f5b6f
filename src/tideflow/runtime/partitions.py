"""Run ownership in a cluster: which `tideflow server` applies which event partitions.

Runs hash to the bus's event partitions (``partition_of``). Every server of a cluster
holds leases on a share of them, rows in the store's lease table (``partition:<n>``),
and applies only the events of the partitions it holds, so one scheduler at a time
advances a run, in order. No server talks to another: each one

- holds a *membership* lease (``server:<owner>``) while it lives;
- every ``ttl / 5`` seconds renews it and its partition leases, reads the live members
  and computes its share by rendezvous (highest-random-weight) hashing with bounded
  loads: partition ``p`` goes to the member with the highest ``weight(member, p)`` that
  still has room, and each member's quota is ``partitions // n`` or one more
  (``share``). Every server computes the same answer from the same rows; a member that
  joins or leaves moves the partitions it wins or held (about ``1/n`` of them) and, to
  keep the shares even, a few between the others (about 6% of them on average);
- takes the partitions of its share that are free or whose lease expired, recovers
  each (runtime/recovery.py, filtered to the partition) and only then applies its
  events (``Ownership``: the scheduler consumes ``bus.consume_events(applied)``);
- gives up the partitions no longer in its share: the scheduler stops consuming them
  (after the batch in progress is committed), their runs leave the cache and their
  timers the wheel, and then the lease row is deleted, so the new owner takes them at
  its next heartbeat;
- stops applying a partition at once when its lease could not be renewed (another
  server took it over after this one stalled for longer than the TTL). Optimistic
  concurrency on each run's sequence stays the last line of defence.

A dead server's partitions are taken over once its leases expire (the TTL, 10 s by
default). The bus keeps a claim of its own on a partition (as long as its delivery
lease), renewed by the dead consumer until it died; a partition taken from an expired
lease is applied only once that claim has surely run out too, so the takeover time is
``max(TTL, bus lease)`` (see docs/deployment.md).

The cluster's partition count is the bus's ``partitions``; the first server records it
in the store (a lease row that never expires, ``cluster:partitions``) and a server whose
bus has another count is refused: the partitions of runs would not agree.

Embedded mode does not use any of this: one engine holds the store's ``engine`` lease
(runtime/lease.py) and consumes every partition. The two exclude each other: a server
refuses to join while an embedded engine holds the store, and an embedded engine
refuses a store with live servers.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import math
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Collection, Iterable

from tideflow.bus.base import partition_of
from tideflow.bus.closing import cancel_and_wait
from tideflow.errors import BusError, EngineAlreadyRunning
from tideflow.runtime.lease import CLIENT, HOST, StoreLease, describe
from tideflow.store.base import MEMBER_LEASES, PARTITION_LEASES, Lease, Store

log = logging.getLogger("tideflow.partitions")

PARTITION = PARTITION_LEASES
MEMBER = MEMBER_LEASES
PARTITION_COUNT = "cluster:partitions"
SERVER = "server"
SETTING = "setting"


def partition_lease(partition: int) -> str:
    return f"{PARTITION}{partition}"


def weight(member: str, partition: int) -> int:
    """The rendezvous weight of ``member`` for ``partition``: stable across processes."""
    digest = hashlib.blake2b(f"{member}#{partition}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def share(partitions: int, members: Collection[str], me: str) -> frozenset[int]:
    """The partitions ``me`` wins among ``members`` (``me`` counts as one of them)."""
    owners = _owners(partitions, tuple(sorted({*members, me})))
    return frozenset(p for p, owner in enumerate(owners) if owner == me)


@functools.lru_cache(maxsize=64)
def _owners(partitions: int, members: tuple[str, ...]) -> tuple[str, ...]:
    """The owner of each partition: rendezvous hashing with bounded loads. Each member
    has a quota, ``partitions // n`` or one more (the extra ones go to the members that
    rank highest by ``weight(member, -1)``), and the (member, partition) pairs are taken
    in order of falling weight, each partition by the first member with room left.
    Without the bound, 16 partitions over 3 servers is often 9, 4 and 3, and now and
    then a server with none."""
    base, extra = divmod(partitions, len(members))
    ranked = sorted(members, key=lambda m: (weight(m, -1), m), reverse=True)
    room = {m: base + (1 if i < extra else 0) for i, m in enumerate(ranked)}
    pairs = sorted(((weight(m, p), m, p) for m in members for p in range(partitions)), reverse=True)
    owners: dict[int, str] = {}
    for _, member, partition in pairs:
        if partition not in owners and room[member]:
            owners[partition] = member
            room[member] -= 1
    return tuple(owners[p] for p in range(partitions))


def shown(partitions: Iterable[int]) -> str:
    """``0-3,7,9-10``: a set of partitions as a person reads it."""
    ordered = sorted(partitions)
    spans: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        spans.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(spans) or "none"


class Ownership:
    """The partitions an engine applies (``applied``, written by the manager) and the ones
    its scheduler's event stream holds now (``consuming``, written by the scheduler)."""

    def __init__(self, partitions: int) -> None:
        self.partitions = partitions
        self.applied: frozenset[int] = frozenset()
        self.consuming: frozenset[int] = frozenset()
        self.recovering: frozenset[int] = frozenset()
        """Partitions being taken: recovered now, applied next."""
        self._applied_changed = asyncio.Event()
        self._consuming_changed = asyncio.Event()

    def owns(self, run_id: str) -> bool:
        """Whether this engine applies the run's events now."""
        return partition_of(run_id, self.partitions) in self.applied

    def holds(self, run_id: str) -> bool:
        """Whether the run's timers are this engine's: applied, or being recovered (the
        recovery's refill loads them; what fires waits on the bus for the apply)."""
        partition = partition_of(run_id, self.partitions)
        return partition in self.applied or partition in self.recovering

    def apply(self, partitions: Collection[int]) -> None:
        self._set_applied(self.applied | frozenset(partitions))

    def stop_applying(self, partitions: Collection[int]) -> None:
        self._set_applied(self.applied - frozenset(partitions))

    def _set_applied(self, applied: frozenset[int]) -> None:
        if applied != self.applied:
            self.applied = applied
            self._applied_changed.set()
            self._applied_changed = asyncio.Event()

    async def changed(self, seen: frozenset[int]) -> None:
        """Return once ``applied`` is no longer ``seen``."""
        while self.applied == seen:
            await self._applied_changed.wait()

    def consumed(self, partitions: frozenset[int]) -> None:
        """The scheduler's stream holds ``partitions`` now (none once it is closed)."""
        self.consuming = partitions
        self._consuming_changed.set()
        self._consuming_changed = asyncio.Event()

    async def released(self, partitions: Collection[int]) -> None:
        """Return once the scheduler's stream holds none of ``partitions``."""
        while self.consuming & frozenset(partitions):
            await self._consuming_changed.wait()


Take = Callable[[frozenset[int]], Awaitable[None]]
"""Recover these partitions (what their previous owner left); their events come after."""
Drop = Callable[[frozenset[int]], None]
"""Forget what is held in memory of these partitions' runs (cache, timers)."""


class PartitionManager:
    """One server's membership and partition leases, kept by a heartbeat (see module)."""

    def __init__(
        self,
        store: Store,
        ownership: Ownership,
        *,
        take: Take,
        drop: Drop,
        ttl: float,
        bus_claim: float = 0.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``bus_claim``: seconds the bus keeps a dead consumer's claim on a partition
        (its delivery lease). ``clock``: wall-clock seconds (lease rows are compared
        across processes)."""
        if not ttl > 0:
            raise ValueError(f"a lease must last a positive number of seconds, not {ttl!r}")
        self.store = store
        self.ownership = ownership
        self.partitions = ownership.partitions
        self.ttl = ttl
        self.owner = f"{HOST}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
        self._take = take
        self._drop = drop
        self._bus_claim = bus_claim
        self._clock = clock
        self.held: set[int] = set()
        """Partitions whose lease this server holds (applied, or being taken or given up)."""
        self._ready_at: dict[int, float] = {}
        """Held partitions not applied yet, and from when their events may be consumed."""
        self._releasing: set[int] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._taking: asyncio.Task[None] | None = None
        self._heartbeat: asyncio.Task[None] | None = None
        self.on_taken: list[Callable[[frozenset[int]], Awaitable[None]]] = []
        """Called after partitions were recovered, before their events are applied (the
        reconciliation sweep hooks in here)."""
        self.on_lost: Callable[[frozenset[int]], None] | None = None

    def owns(self, run_id: str) -> bool:
        """Whether this server applies the run's events now."""
        return self.ownership.owns(run_id)

    @property
    def member(self) -> str:
        return f"{MEMBER}{self.owner}"

    # -- joining and leaving ----------------------------------------------------

    async def join(self, *, wait_for_engine: float = 0.0) -> None:
        """Check the partition count and become a member. An embedded engine on the store
        (the ``engine`` lease) is waited for up to ``wait_for_engine`` seconds, then
        refused; the check and the membership are written under that lease, held for a
        moment the way a client holds it, so an embedded engine cannot start half-way."""
        guard = StoreLease(self.store, kind=CLIENT)
        holder = await guard.acquire(wait_for_engine=wait_for_engine)
        if holder is not None:
            raise EngineAlreadyRunning(
                f"an embedded engine runs on this store: {describe(holder, time.time())}. A "
                "store is served either by one embedded engine (`tideflow run`, `tideflow "
                "resume`) or by `tideflow server` processes: stop it first, or pass "
                "--wait-for-engine SECONDS"
            )
        try:
            await self._check_count()
            await self._keep_membership(self._clock())
        finally:
            await guard.release()

    async def _check_count(self) -> None:
        now = self._clock()
        record = Lease(
            name=PARTITION_COUNT,
            owner=str(self.partitions),
            kind=SETTING,
            host=HOST,
            pid=os.getpid(),
            address=None,
            acquired_at=now,
            expires_at=math.inf,
        )
        held = await self.store.acquire_lease(record, now=now)
        if held.owner != record.owner:
            raise BusError(
                f"this cluster's runs are spread over {held.owner} event partitions (recorded "
                f"in the store by the first server, on host {held.host}), but this server's "
                f"bus has {self.partitions}: give the bus URL the cluster's count "
                f"(?partitions={held.owner}). To change the count, drain the cluster (no "
                "unfinished runs, no events on the bus), stop every server and delete the "
                f"store's {PARTITION_COUNT!r} lease row"
            )

    async def _keep_membership(self, now: float) -> None:
        if await self.store.renew_lease(self.member, self.owner, now + self.ttl):
            return
        await self._rejoin(now)

    async def _rejoin(self, now: float) -> None:
        """Write the membership row again (it expired while the store was out of reach)."""
        mine = Lease(
            name=self.member,
            owner=self.owner,
            kind=SERVER,
            host=HOST,
            pid=os.getpid(),
            address=None,
            acquired_at=now,
            expires_at=now + self.ttl,
        )
        await self.store.acquire_lease(mine, now=now)

    async def start(self) -> None:
        """One heartbeat now (free partitions of the share are taken and recovered before
        this returns), then one every ``ttl / 5`` seconds."""
        await self.tick()
        if self._taking is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._taking)
        self._heartbeat = asyncio.create_task(self._beat(), name="tideflow-partitions")

    async def settle(self) -> None:
        """Return once what the heartbeats started (takes, releases) is done."""
        while pending := [
            t for t in [self._taking, *self._tasks] if t is not None and not t.done()
        ]:
            await asyncio.wait(pending)

    async def halt(self) -> None:
        """Stop the heartbeat and whatever it started (before the engine stops)."""
        with contextlib.suppress(Exception):
            await cancel_and_wait(
                *(t for t in [self._heartbeat, self._taking, *self._tasks] if t is not None)
            )
        self._heartbeat = self._taking = None

    async def close(self) -> None:
        """Give every lease up (the engine has stopped applying)."""
        await self.halt()
        self.ownership.stop_applying(self.held)
        given = sorted(self.held)
        for partition in given:
            with contextlib.suppress(Exception):  # it expires by itself
                await self.store.release_lease(partition_lease(partition), self.owner)
        self.held.clear()
        with contextlib.suppress(Exception):
            await self.store.release_lease(self.member, self.owner)
        if given:
            log.info("released partitions %s (stopping)", shown(given))

    # -- the heartbeat ----------------------------------------------------------

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(self.ttl / 5)
            try:
                await self.tick()
            except Exception as exc:  # the store is down for a moment: the leases have time
                log.warning(
                    "partition leases not renewed (%s: %s); trying again", type(exc).__name__, exc
                )

    async def tick(self) -> None:
        """Renew, read the members, take and give up partitions (see the module)."""
        now = self._clock()
        await self._renew(now)
        members = [
            lease.owner for lease in await self.store.list_leases(MEMBER) if lease.expires_at > now
        ]
        mine = share(self.partitions, members, self.owner)
        give = self.held - mine - self._releasing
        if give:
            self._spawn(self._give_up(frozenset(give)))
        await self._take_free(mine, now)
        self._start_taking(now)

    async def _renew(self, now: float) -> None:
        """The membership and every partition held, in one statement."""
        names = {partition_lease(partition): partition for partition in self.held}
        renewed = await self.store.renew_leases([self.member, *names], self.owner, now + self.ttl)
        if self.member not in renewed:
            await self._rejoin(now)
        lost = frozenset(partition for name, partition in names.items() if name not in renewed)
        if lost:
            self._lose(lost)

    def _lose(self, lost: frozenset[int]) -> None:
        log.error(
            "lost partitions %s: another server took their leases over (this one did not "
            "renew them within %gs); it stops applying them",
            shown(lost),
            self.ttl,
        )
        self.held -= lost
        self._releasing -= lost
        for partition in lost:
            self._ready_at.pop(partition, None)
        self.ownership.stop_applying(lost)
        self._drop(lost)
        if self.on_lost is not None:
            self.on_lost(lost)

    async def _take_free(self, mine: frozenset[int], now: float) -> None:
        wanted = mine - self.held
        if not wanted:
            return
        holders = {lease.name: lease for lease in await self.store.list_leases(PARTITION)}
        for partition in sorted(wanted):
            held = holders.get(partition_lease(partition))
            if held is not None and held.expires_at > now and held.owner != self.owner:
                continue  # its owner gives it up at its next heartbeat, or it expires
            candidate = Lease(
                name=partition_lease(partition),
                owner=self.owner,
                kind=SERVER,
                host=HOST,
                pid=os.getpid(),
                address=None,
                acquired_at=now,
                expires_at=now + self.ttl,
            )
            if (await self.store.acquire_lease(candidate, now=now)).owner != self.owner:
                continue
            self.held.add(partition)
            # Taken from a holder that died: the bus's claim of the dead consumer (renewed
            # until it died, at most ``ttl / 5`` after its last renewal here) runs out later.
            died = held is not None and held.owner != self.owner
            self._ready_at[partition] = (
                held.expires_at - self.ttl * 0.8 + self._bus_claim if died and held else now
            )

    def _start_taking(self, now: float) -> None:
        ready = frozenset(p for p, at in self._ready_at.items() if at <= now)
        if ready and (self._taking is None or self._taking.done()):
            self._taking = asyncio.create_task(self._recover(ready), name="tideflow-take")

    async def _recover(self, partitions: frozenset[int]) -> None:
        ownership = self.ownership
        ownership.recovering |= partitions
        try:
            await self._take(partitions)
            for hook in self.on_taken:
                await hook(partitions)
        except Exception as exc:  # the store is down: taken again at a later heartbeat
            log.warning(
                "partitions %s not recovered (%s: %s); trying again",
                shown(partitions),
                type(exc).__name__,
                exc,
            )
            return
        finally:
            ownership.recovering -= partitions
        still = frozenset(p for p in partitions if p in self.held and p in self._ready_at)
        for partition in still:
            del self._ready_at[partition]
        lost = partitions - still
        if lost:  # lost or given up while being recovered: what recovery loaded goes
            self._drop(lost)
        if still:
            self.ownership.apply(still)
            log.info(
                "took partitions %s (recovered; now applying %s of %d)",
                shown(still),
                shown(self.ownership.applied),
                self.partitions,
            )

    async def _give_up(self, partitions: frozenset[int]) -> None:
        """Stop consuming, forget, then delete the leases (see the module)."""
        self._releasing |= partitions
        try:
            for partition in partitions:
                self._ready_at.pop(partition, None)
            self.ownership.stop_applying(partitions)
            await self.ownership.released(partitions)
            self._drop(partitions)
            given = [p for p in partitions if p in self.held]
            for partition in given:
                await self.store.release_lease(partition_lease(partition), self.owner)
                self.held.discard(partition)
        finally:
            self._releasing -= partitions
        if given:
            log.info(
                "released partitions %s (another server's share now; applying %s of %d)",
                shown(given),
                shown(self.ownership.applied),
                self.partitions,
            )

    def _spawn(self, work: Awaitable[None]) -> None:
        async def run() -> None:
            try:
                await work
            except Exception as exc:  # the lease runs out by itself
                log.warning("giving partitions up failed (%s: %s)", type(exc).__name__, exc)

        task = asyncio.create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


__all__ = [
    "MEMBER",
    "PARTITION",
    "PARTITION_COUNT",
    "Ownership",
    "PartitionManager",
    "partition_lease",
    "share",
    "shown",
    "weight",
]
