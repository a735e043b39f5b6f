"""Run ownership: the rendezvous share, and partition managers on one store with a fake
clock (each heartbeat is one ``tick``; nothing sleeps)."""

from __future__ import annotations

import asyncio
import random
import time
import uuid

import pytest

from tideflow.errors import BusError, EngineAlreadyRunning
from tideflow.runtime.lease import ENGINE, StoreLease
from tideflow.runtime.partitions import (
    PARTITION_COUNT,
    Ownership,
    PartitionManager,
    partition_lease,
    share,
    shown,
)
from tideflow.store.backends.memory import MemoryStore
from tideflow.store.base import Store

TTL = 10.0


def test_every_partition_has_one_owner_whoever_computes_it() -> None:
    members = ["a", "b", "c"]
    shares = [share(64, members, me) for me in members]
    assert sorted(p for s in shares for p in s) == list(range(64))
    assert share(64, ["b", "c"], "a") == shares[0]  # me counts whether listed or not


@pytest.mark.parametrize("partitions", [1, 2, 3, 7, 8, 16, 64, 100])
def test_every_member_gets_an_even_share(partitions: int) -> None:
    """partitions // n or one more, whatever the names (plain rendezvous hashing gives a
    third server none of 8 partitions about one time in 25)."""
    for trial in range(40):
        for n in range(1, 7):
            members = [
                uuid.UUID(int=random.Random(f"{trial}:{i}").getrandbits(128)).hex for i in range(n)
            ]
            sizes = sorted(len(share(partitions, members, me)) for me in members)
            assert sum(sizes) == partitions
            assert sizes[0] == partitions // n and sizes[-1] <= -(-partitions // n), sizes


def test_a_new_member_takes_its_share_and_moves_few_others() -> None:
    moved = 0
    for trial in range(200):
        names = [f"{trial}-{i}" for i in range(3)]
        before = {m: share(64, names[:2], m) for m in names[:2]}
        after = {m: share(64, names, m) for m in names}
        assert len(after[names[2]]) in (21, 22)
        for m in names[:2]:  # what a stayer gains, it takes from the other stayer
            moved += len(after[m] - before[m])
    assert moved / (200 * 64) < 0.15, moved / (200 * 64)


def test_partitions_are_shown_as_ranges() -> None:
    assert shown([9, 0, 1, 2, 3, 7, 10]) == "0-3,7,9-10"
    assert shown([]) == "none"


class Server:
    """A manager whose take and drop only record what they are handed."""

    def __init__(self, store: Store, clock: list[float], partitions: int = 16, **kw: float):
        self.ownership = Ownership(partitions)
        self.taken: list[frozenset[int]] = []
        self.dropped: list[frozenset[int]] = []
        self.manager = PartitionManager(
            store,
            self.ownership,
            take=self._take,
            drop=self.dropped.append,
            ttl=TTL,
            clock=lambda: clock[0],
            **kw,
        )

    async def _take(self, partitions: frozenset[int]) -> None:
        assert not partitions & self.ownership.applied  # recovered before it is applied
        self.taken.append(partitions)

    async def tick(self) -> None:
        await self.manager.tick()
        await self.manager.settle()

    @property
    def applied(self) -> frozenset[int]:
        return self.ownership.applied


async def holders(store: Store) -> dict[int, str]:
    rows = await store.list_leases("partition:")
    return {int(row.name.split(":")[1]): row.owner for row in rows}


async def test_two_servers_split_the_partitions_and_a_dead_ones_are_taken_over() -> None:
    store, clock = MemoryStore(), [1000.0]
    a, b = Server(store, clock), Server(store, clock)
    await a.manager.join()
    await a.manager.start()
    await a.manager.halt()  # heartbeats by hand from here on
    assert a.applied == frozenset(range(16)) and a.taken == [frozenset(range(16))]

    await b.manager.join()
    await b.tick()
    assert b.applied == frozenset()  # a holds them, live
    await a.tick()  # a sees b and gives up b's share
    b_share = share(16, [a.manager.owner, b.manager.owner], b.manager.owner)
    assert a.applied == frozenset(range(16)) - b_share
    assert a.dropped == [b_share]
    await b.tick()
    assert b.applied == b_share and b.taken == [b_share]
    owners = await holders(store)
    assert {p for p, o in owners.items() if o == b.manager.owner} == b_share
    assert len(owners) == 16

    clock[0] += TTL + 1  # b dies: no more heartbeats; a renews in time
    await a.tick()
    assert a.applied == frozenset(range(16))
    assert a.taken[-1] == b_share  # recovered before applying
    assert set((await holders(store)).values()) == {a.manager.owner}


async def test_a_server_that_stalled_past_its_ttl_stops_applying_what_was_taken() -> None:
    store, clock = MemoryStore(), [1000.0]
    a, b = Server(store, clock), Server(store, clock)
    for server in (a, b):
        await server.manager.join()
        await server.tick()
    await a.tick()
    await b.tick()
    assert a.applied and b.applied and not a.applied & b.applied

    clock[0] += TTL + 1  # a stalls; b takes everything
    await b.tick()
    assert b.applied == frozenset(range(16))
    a_had = frozenset(range(16)) - b_share_of(b)
    await a.tick()  # its renewals fail: it lets go at once
    assert a.applied == frozenset()
    assert a.dropped[-1] == a_had
    await a.tick()  # a is a live member again: it gets a share back, handed over by b
    await b.tick()
    await a.tick()
    assert a.applied and b.applied and a.applied | b.applied == frozenset(range(16))


def b_share_of(server: Server) -> frozenset[int]:
    return frozenset(server.taken[0]) if server.taken else frozenset()


async def test_a_partition_taken_from_a_dead_holder_waits_for_the_bus_claim() -> None:
    store, clock = MemoryStore(), [1000.0]
    dead = Server(store, clock)
    await dead.manager.join()
    await dead.tick()
    clock[0] += TTL + 0.5
    late = Server(store, clock, bus_claim=30.0)
    await late.manager.join()
    await late.tick()
    assert late.applied == frozenset()  # leases held, events not consumed yet
    assert len(await holders(store)) == 16
    assert set((await holders(store)).values()) == {late.manager.owner}
    clock[0] += 30.0 - 0.8 * TTL - 0.5  # the dead consumer's bus claim has run out
    await late.tick()
    assert late.applied == frozenset(range(16))


async def test_a_clean_stop_hands_the_partitions_over_at_once() -> None:
    store, clock = MemoryStore(), [1000.0]
    a, b = Server(store, clock), Server(store, clock)
    for server in (a, b):
        await server.manager.join()
        await server.tick()
    await a.tick()
    await b.tick()
    await a.manager.close()
    assert await store.lease_holder(a.manager.member) is None
    clock[0] += TTL / 5  # b's next heartbeat, long before a's leases would expire
    await b.tick()
    assert b.applied == frozenset(range(16))


async def test_giving_a_partition_up_waits_until_the_scheduler_stopped_consuming_it() -> None:
    store, clock = MemoryStore(), [1000.0]
    a = Server(store, clock)
    await a.manager.join()
    await a.tick()
    a.ownership.consumed(frozenset(range(16)))  # the scheduler's stream holds them
    b = Server(store, clock)
    await b.manager.join()
    await a.manager.tick()
    for _ in range(10):  # the hand-over task runs up to its wait for the scheduler
        await asyncio.sleep(0)
    give = frozenset(range(16)) - a.applied
    assert give  # asked to stop applying them...
    assert set((await holders(store)).values()) == {a.manager.owner}  # ...not released yet
    a.ownership.consumed(a.applied)  # the scheduler reopened its stream without them
    await a.manager.settle()
    assert {p for p, o in (await holders(store)).items() if o == a.manager.owner} == a.applied


async def test_a_server_whose_bus_has_another_partition_count_is_refused() -> None:
    store, clock = MemoryStore(), [1000.0]
    await Server(store, clock, partitions=16).manager.join()
    with pytest.raises(BusError) as refused:
        await Server(store, clock, partitions=8).manager.join()
    assert "16 event partitions" in str(refused.value)
    assert "has 8" in str(refused.value) and "?partitions=16" in str(refused.value)
    recorded = await store.lease_holder(PARTITION_COUNT)
    assert recorded is not None and recorded.owner == "16"


async def test_a_server_is_refused_while_an_embedded_engine_holds_the_store() -> None:
    store, clock = MemoryStore(), [time.time()]
    engine = StoreLease(store, kind=ENGINE)
    assert await engine.acquire() is None
    with pytest.raises(EngineAlreadyRunning) as refused:
        await Server(store, clock).manager.join()
    assert "embedded engine" in str(refused.value)
    await engine.release()
    await Server(store, clock).manager.join()


async def test_partition_leases_are_named_after_the_partition() -> None:
    assert partition_lease(7) == "partition:7"
