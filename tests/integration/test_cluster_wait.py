"""``Client.wait`` in cluster mode: a cluster engine (``Runtime(cluster=True)``) on a real
PostgreSQL store and a real broker, a ``Client.connect`` client in the same process
whose PostgreSQL connection goes through a counting proxy (tideflow.testing.wire).

The client's waits are woken by the run ends the engine announces on the bus: one
subscription for any number of waits, and a fixed number of store reads per wait
however long its run takes. A run end that is not announced (the broker refused it)
still ends the wait, by the slow recheck (``remote.RECHECK``)."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import asyncpg
import pytest

from tideflow.bus import open_bus
from tideflow.bus.backends.nats import NatsBus
from tideflow.bus.backends.redis import RedisBus
from tideflow.bus.base import Bus, RunEnded, Stream
from tideflow.client import Client
from tideflow.runtime import remote
from tideflow.runtime.result import RunResult
from tideflow.runtime.runtime import Runtime
from tideflow.store.backends.postgres import Q
from tideflow.testing.nats import delete_prefix
from tideflow.testing.wire import PgParser, Proxy, host_port, sql_text, via

pytestmark = [pytest.mark.timeout(120)]

NAP = 1.5
"""Seconds a run sleeps: long enough for a poll to read its summary many times."""
FLOW = {
    "name": "nap",
    "version": "1",
    "steps": [
        {"id": "a", "type": "noop"},
        {"id": "nap", "type": "sleep", "duration": f"{NAP}s", "depends_on": ["a"]},
        {"id": "b", "type": "noop", "depends_on": ["nap"]},
    ],
}
GET_RUN = sql_text(Q["get_run"].encode())
WITHIN = 30.0
"""Seconds a wait may take before the test fails (a bound on failure, never a pause)."""


@dataclass
class Cluster:
    engine: Runtime
    client: Client
    client_bus: Bus
    proxy: Proxy

    def get_runs(self) -> int:
        return self.proxy.counter.by[GET_RUN]


@pytest.fixture(params=["redis", "nats"])
def bus_url(request: pytest.FixtureRequest) -> str:
    base = request.getfixturevalue(f"{request.param}_url")
    prefix = f"wait-{uuid.uuid4().hex[:10]}"
    return f"{base}{'&' if '?' in base else '?'}prefix={prefix}&partitions=4"


@pytest.fixture
async def cluster(postgres_url: str, bus_url: str) -> AsyncIterator[Cluster]:
    schema = f"wait_{uuid.uuid4().hex[:12]}"
    proxy = Proxy(host_port(postgres_url, 5432), PgParser)
    engine = Runtime(
        store=f"{postgres_url}?schema={schema}",
        bus=bus_url,
        cluster=True,
        workers=8,
        lease_ttl=2.0,
    )
    try:
        async with proxy.running(), engine:
            client_bus = open_bus(bus_url)
            store = f"{via(postgres_url, proxy.port)}?schema={schema}"
            async with Client.connect(store, client_bus) as client:
                await client.register(FLOW)
                yield Cluster(engine, client, client_bus, proxy)
    finally:
        await _clean(postgres_url, schema, bus_url)


async def _clean(postgres_url: str, schema: str, bus_url: str) -> None:
    conn = await asyncpg.connect(postgres_url)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()
    bus = open_bus(bus_url)
    await bus.open()
    try:
        if isinstance(bus, NatsBus):
            await delete_prefix(bus)
        else:
            assert isinstance(bus, RedisBus)
            keys = [key async for key in bus.client.scan_iter(match=f"{bus.prefix}:*")]
            if keys:
                await bus.client.delete(*keys)
    finally:
        await bus.close()


async def ended(client: Client, run_id: str) -> RunResult:
    """``client.wait`` with no timeout of its own (one that runs out reads the store a last
    time): it ends by hearing the run's end or by a recheck, else the test fails."""
    return await asyncio.wait_for(client.wait(run_id), WITHIN)


def counting_subscriptions(bus: Bus) -> list[int]:
    """Count the ``run_ends`` calls made on ``bus`` (one item per call)."""
    calls: list[int] = []
    opened = bus.run_ends

    async def run_ends() -> Stream[RunEnded]:
        calls.append(1)
        return await opened()

    bus.run_ends = run_ends  # type: ignore[method-assign]
    return calls


async def test_concurrent_waits_share_one_subscription_and_read_each_run_twice(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # no recheck within the test: a wait can only end because it heard its run end
    monkeypatch.setattr(remote, "RECHECK", 600.0)
    subscriptions = counting_subscriptions(cluster.client_bus)
    client = cluster.client
    run_ids = [await client.start("nap", {"i": i}) for i in range(30)]
    before = cluster.get_runs()
    results = await asyncio.gather(*(ended(client, run_id) for run_id in run_ids))
    assert [r.status for r in results] == ["succeeded"] * len(run_ids)
    assert len(subscriptions) == 1
    # each wait reads its run's summary once before its end and once after: a poll
    # would have read it about every half second of the NAP
    assert cluster.get_runs() - before == 2 * len(run_ids)
    # the subscription outlives the waits: the next wait opens none
    late = await client.start("nap", {"i": "late"})
    assert (await ended(client, late)).status == "succeeded"
    assert len(subscriptions) == 1


async def test_a_run_end_the_engine_could_not_announce_ends_the_wait_by_the_recheck(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(remote, "RECHECK", 0.2)
    bus = cluster.engine.bus
    announce = bus.publish_run_ends
    refused: list[Sequence[RunEnded]] = []

    async def lost(ends: Sequence[RunEnded]) -> None:
        refused.append(ends)
        raise ConnectionError("the broker connection was reset")

    monkeypatch.setattr(bus, "publish_run_ends", lost)
    caplog.set_level(logging.INFO, logger="tideflow.relay")
    client = cluster.client
    run_ids = []
    for i in range(3):  # one after the other: each end is a batch of its own
        run_ids.append(await client.start("nap", {"i": i}))
        assert (await ended(client, run_ids[-1])).status == "succeeded"
    assert [[end.run_id for end in ends] for ends in refused] == [[r] for r in run_ids]
    warned = [r for r in caplog.records if "announcing" in r.getMessage()]
    assert [r.levelno for r in warned] == [logging.WARNING]  # once for the row of failures

    monkeypatch.setattr(bus, "publish_run_ends", announce)
    monkeypatch.setattr(remote, "RECHECK", 600.0)  # now only a heard end ends the wait
    last = await client.start("nap", {"i": "last"})
    assert (await ended(client, last)).status == "succeeded"
    assert any(
        "announcing run ends works again (3 batch(es)" in r.getMessage() for r in caplog.records
    )


async def test_a_client_that_cannot_subscribe_waits_by_rechecks_and_subscribes_later(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(remote, "RECHECK", 0.2)
    bus = cluster.client_bus
    opened = bus.run_ends
    broker_back = asyncio.Event()
    tries: list[bool] = []

    async def flaky() -> Stream[RunEnded]:
        tries.append(broker_back.is_set())
        if not broker_back.is_set():
            raise ConnectionError("the broker connection was reset")
        return await opened()

    monkeypatch.setattr(bus, "run_ends", flaky)
    client = cluster.client
    run_id = await client.start("nap", {"i": 1})
    # no subscription for the whole run: only a recheck can see that it ended
    assert (await ended(client, run_id)).status == "succeeded"
    assert tries and not any(tries)
    broker_back.set()
    async with asyncio.timeout(10):
        while not tries[-1]:  # opened again in the background  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    monkeypatch.setattr(remote, "RECHECK", 600.0)  # from now on only a heard end ends a wait
    again = await client.start("nap", {"i": 2})
    assert (await ended(client, again)).status == "succeeded"
    assert tries.count(True) == 1


async def test_a_wait_times_out_on_a_run_that_goes_on(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(remote, "RECHECK", 600.0)
    client = cluster.client
    run_id = await client.start("nap", {"i": 1})
    with pytest.raises(TimeoutError, match=r"had not ended after 0\.1s"):
        await client.wait(run_id, timeout=0.1)
    assert (await ended(client, run_id)).status == "succeeded"
