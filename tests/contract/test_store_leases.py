"""The Store port's engine lease and inbox, on every backend (memory, sqlite, postgres)."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import uuid

import pytest

from tideflow.model.events import CancelRequested, SignalReceived
from tideflow.store.backends.postgres import PostgresStore
from tideflow.store.base import ENGINE_LEASE, Lease, Store, UnstorableData

from .conftest import Backend, drop_schema, postgres_backend

T0 = 1_000_000.0


def lease(owner: str, *, at: float = T0, ttl: float = 10.0, address: str | None = None) -> Lease:
    return Lease(
        name=ENGINE_LEASE,
        owner=owner,
        kind="engine",
        host="host-a",
        pid=4242,
        address=address,
        acquired_at=at,
        expires_at=at + ttl,
    )


def signal(event_id: str, run_id: str = "r1", payload: object = None) -> SignalReceived:
    return SignalReceived(
        event_id=event_id, run_id=run_id, time=T0, name="approve", payload=payload
    )


async def test_a_free_lease_is_taken_and_a_held_one_is_refused(store: Store) -> None:
    assert await store.lease_holder(ENGINE_LEASE) is None
    mine = lease("a", address="udp://127.0.0.1:9")
    assert await store.acquire_lease(mine, now=T0) == mine
    assert await store.lease_holder(ENGINE_LEASE) == mine

    assert await store.acquire_lease(lease("b", at=T0 + 1), now=T0 + 1) == mine
    assert await store.acquire_lease(lease("a", at=T0 + 2), now=T0 + 2) == lease("a", at=T0 + 2)


async def test_an_expired_lease_is_taken_over(store: Store) -> None:
    await store.acquire_lease(lease("a"), now=T0)
    assert (await store.acquire_lease(lease("b", at=T0 + 9.9), now=T0 + 9.9)).owner == "a"
    taken = await store.acquire_lease(lease("b", at=T0 + 10), now=T0 + 10)
    assert taken.owner == "b"
    assert not await store.renew_lease(ENGINE_LEASE, "a", T0 + 30)  # a has lost it


async def test_a_lease_of_a_dead_holder_is_taken_from_it_by_name(store: Store) -> None:
    await store.acquire_lease(lease("a"), now=T0)
    assert (await store.acquire_lease(lease("b"), now=T0, take_from="other")).owner == "a"
    assert (await store.acquire_lease(lease("b"), now=T0, take_from="a")).owner == "b"


async def test_renew_and_release_only_by_the_holder(store: Store) -> None:
    await store.acquire_lease(lease("a"), now=T0)
    assert await store.renew_lease(ENGINE_LEASE, "a", T0 + 60)
    holder = await store.lease_holder(ENGINE_LEASE)
    assert holder is not None and holder.expires_at == T0 + 60
    assert not await store.renew_lease(ENGINE_LEASE, "b", T0 + 90)

    await store.release_lease(ENGINE_LEASE, "b")
    assert await store.lease_holder(ENGINE_LEASE) is not None
    await store.release_lease(ENGINE_LEASE, "a")
    assert await store.lease_holder(ENGINE_LEASE) is None
    assert not await store.renew_lease(ENGINE_LEASE, "a", T0 + 90)
    assert (await store.acquire_lease(lease("b"), now=T0)).owner == "b"


async def test_inbox_keeps_events_in_order_once_each_until_removed(store: Store) -> None:
    first = signal("e1", payload={"ok": True, "n": [1, 2]})
    second = CancelRequested(event_id="e2", run_id="r2", time=T0, reason="stop")
    assert await store.add_to_inbox([first]) is None  # no engine holds the lease
    await store.add_to_inbox([second, signal("e1", payload="changed")])
    assert await store.inbox() == [first, second]
    assert await store.inbox(limit=1) == [first]

    await store.remove_from_inbox(["e1", "unknown"])
    assert await store.inbox() == [second]
    await store.remove_from_inbox(["e2"])
    assert await store.inbox() == []


async def test_adding_to_the_inbox_returns_the_engine_lease(store: Store) -> None:
    held = lease("engine-1", address="udp://127.0.0.1:5555")
    await store.acquire_lease(held, now=T0)
    assert await store.add_to_inbox([signal("e1")]) == held


async def test_an_unstorable_event_is_refused_and_nothing_is_added(store: Store) -> None:
    with pytest.raises(UnstorableData):
        await store.add_to_inbox([signal("e1"), signal("e2", payload=2**70)])
    assert await store.inbox() == []


async def test_a_listener_hears_of_events_another_store_adds(backend: Backend) -> None:
    engine = await backend.open()
    client = engine if backend.name == "memory" else await backend.open()
    heard = asyncio.Event()
    address = await engine.listen_inbox(heard.set)
    if backend.name == "sqlite":
        assert address is None  # the runtime listens on a socket of its own
        return
    assert address is not None
    await client.add_to_inbox([signal("e1")])
    await asyncio.wait_for(heard.wait(), 10)
    assert [e.event_id for e in await engine.inbox()] == ["e1"]


async def test_a_dropped_postgresql_listen_connection_is_replaced(postgres_url: str) -> None:
    schema = f"contract_{uuid.uuid4().hex[:16]}"
    backend = postgres_backend(postgres_url, schema)
    try:
        engine, client = await backend.open(), await backend.open()
        heard = asyncio.Event()
        await engine.listen_inbox(heard.set)
        assert isinstance(engine, PostgresStore)
        pid = engine._listener.get_server_pid()
        await backend.raw(f"SELECT pg_terminate_backend({int(pid)})")
        await asyncio.wait_for(heard.wait(), 30)  # reconnected: told to look at the inbox
        heard.clear()
        await client.add_to_inbox([signal("e1")])
        await asyncio.wait_for(heard.wait(), 30)
        assert engine._listener.get_server_pid() != pid
    finally:
        await backend.close_all()
        await drop_schema(postgres_url, schema)


async def test_leases_are_listed_by_name_prefix_expired_ones_too(store: Store) -> None:
    def named(name: str, owner: str, ttl: float = 10.0) -> Lease:
        return Lease(
            name=name,
            owner=owner,
            kind="server",
            host="h",
            pid=1,
            address=None,
            acquired_at=T0,
            expires_at=T0 + ttl,
        )

    assert await store.list_leases("partition:") == []
    for name, owner in [("partition:10", "a"), ("partition:2", "b"), ("server:a", "a")]:
        await store.acquire_lease(named(name, owner), now=T0)
    await store.acquire_lease(named("partition:3", "c", ttl=-1.0), now=T0)  # expired
    await store.acquire_lease(lease("engine-holder"), now=T0)
    await store.acquire_lease(named("partition_x", "d"), now=T0)  # "_" is no wildcard

    listed = await store.list_leases("partition:")
    assert [(x.name, x.owner) for x in listed] == [
        ("partition:10", "a"),
        ("partition:2", "b"),
        ("partition:3", "c"),
    ]
    assert listed[0] == named("partition:10", "a")
    assert [x.name for x in await store.list_leases("server:")] == ["server:a"]
    assert ENGINE_LEASE in {x.name for x in await store.list_leases("")}
    await store.release_lease("partition:2", "b")
    assert [x.name for x in await store.list_leases("partition:")] == [
        "partition:10",
        "partition:3",
    ]


async def test_a_lease_that_never_expires_is_kept(store: Store) -> None:
    """A cluster records its partition count as such a row (runtime/partitions.py)."""
    forever = Lease(
        name="cluster:partitions",
        owner="16",
        kind="setting",
        host="h",
        pid=1,
        address=None,
        acquired_at=T0,
        expires_at=math.inf,
    )
    assert await store.acquire_lease(forever, now=T0) == forever
    later = dataclasses.replace(forever, owner="8", acquired_at=T0 * 1000)
    assert await store.acquire_lease(later, now=T0 * 1000) == forever
    assert await store.lease_holder("cluster:partitions") == forever


async def test_leases_are_renewed_together_only_where_the_owner_holds_them(store: Store) -> None:
    def named(name: str, owner: str) -> Lease:
        return dataclasses.replace(lease(owner), name=name)

    for name, owner in [("partition:0", "a"), ("partition:1", "a"), ("partition:2", "b")]:
        await store.acquire_lease(named(name, owner), now=T0)
    asked = ["server:a", "partition:0", "partition:1", "partition:2", "partition:9"]
    await store.acquire_lease(named("server:a", "a"), now=T0)
    renewed = await store.renew_leases(asked, "a", T0 + 99)
    assert renewed == {"server:a", "partition:0", "partition:1"}
    held = {held.name: held for held in await store.list_leases("")}
    assert {name for name, row in held.items() if row.expires_at == T0 + 99} == renewed
    assert held["partition:2"].owner == "b" and held["partition:2"].expires_at == T0 + 10
    assert "partition:9" not in held  # renewing never creates a lease
    assert await store.renew_leases([], "a", T0 + 100) == set()
