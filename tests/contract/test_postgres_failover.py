"""The PostgreSQL store on a multi-host URL across a failover: a primary and a synchronous
streaming standby of the test's own (``postgres_standby``), the primary SIGKILLed while
the store commits, the standby promoted, and the same store object goes on writing to
the new primary, its pool and its inbox LISTEN connection reconnected by themselves;
then the old primary rejoins as a standby and a second failover goes back to it.

A commit cut by the failover fails as ``StoreUnavailable`` and is sent again, as the
engine does; it is then either applied once or found applied already (the optimistic
check of each run's ``last_seq`` refuses it as ``ConcurrencyConflict``), never twice:
each run's history holds every event once, its sequence numbers 1..n without a gap."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import pytest

from tideflow.errors import RunExists
from tideflow.model.events import Event
from tideflow.model.plan import Plan
from tideflow.store.backends.postgres import PostgresStore
from tideflow.store.base import ConcurrencyConflict, StoreUnavailable
from tideflow.testing.harness import CoreHarness
from tideflow.testing.topologies.postgres_standby import PostgresStandby

from .conftest import compile_stored
from .scenarios import Driver, loaded_state, order_plan, order_script, same_state

pytestmark = [pytest.mark.timeout(90)]

WITHIN = 30.0


@dataclass
class RetryingDriver(Driver):
    """Commits as the engine does when the store is away: the same batch again after a
    pause until it goes through; refused as a conflict, it had been applied already."""

    unavailable: int = 0
    """Writes that failed as ``StoreUnavailable`` (the failover, seen by the store)."""
    found_applied: int = 0
    """Commits sent again after a failure that had been applied before it."""
    felt: asyncio.Event = field(default_factory=asyncio.Event)
    """Set by a write that failed to connect: no host of the URL took a connection."""

    async def _retry(self, write: object) -> object:
        deadline = time.monotonic() + WITHIN
        while True:
            try:
                return await write()  # type: ignore[operator]
            except StoreUnavailable as exc:
                self.unavailable += 1
                # both hosts named, none took a connection
                if f"no host of PostgreSQL at {getattr(self.store, 'server', '?')} " in str(exc):
                    self.felt.set()
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.02)  # a backoff, as the engine's; the loop is bounded

    async def new_run(self, plan: Plan, run_id: str, **options: object) -> CoreHarness:
        h = CoreHarness(plan, run_id=run_id, now=1_767_225_600.0)
        h.on_decision = lambda event, decision: self._record(h, event, decision)
        self.harnesses[run_id] = h
        created = await self._retry(lambda: self.store.create_runs([(h.state, None)]))
        assert isinstance(created, list)
        # RunExists: made by a try the failover cut after the row was written
        assert created[0] == (run_id, True) or isinstance(created[0], RunExists), created
        return h

    async def flush(self) -> None:
        if not self.pending:
            return
        try:
            await self._retry(lambda: self.store.commit(self.pending, self.relayed))
        except ConcurrencyConflict:
            self.found_applied += 1
        self.committed.extend(self.pending)
        self.pending, self.relayed = [], []


@pytest.fixture
async def store(postgres_standby: PostgresStandby) -> AsyncIterator[PostgresStore]:
    opened = PostgresStore(postgres_standby.url, compile_plan=compile_stored)
    await opened.open()
    try:
        yield opened
    finally:
        await opened.close()


async def test_writes_go_on_through_the_same_store_after_the_standby_is_promoted(
    postgres_standby: PostgresStandby, store: PostgresStore
) -> None:
    plan = order_plan()
    await store.save_definition(plan)
    heard = asyncio.Event()
    await store.listen_inbox(heard.set)
    old_listener = store._listener
    driver = RetryingDriver(store, batch_size=3, snapshot_every=4)
    progress = asyncio.Event()
    promoted_at: list[int] = []
    """The block the writer was at when the standby was promoted."""

    async def write() -> None:
        """Blocks of six runs, until two blocks went through after the promotion."""
        block = 0
        while not promoted_at or block < promoted_at[0] + 2:
            scripts = []
            for i in range(6):
                h = await driver.new_run(plan, f"fo-{block}-{i}")
                scripts.append(order_script(h))
            await driver.play(*scripts)
            block += 1
            if block == 2:
                progress.set()

    writing = asyncio.create_task(write())
    await within(_first(progress.wait(), writing), "the writer makes progress")
    killed = await asyncio.to_thread(postgres_standby.kill_primary)
    # the store finds the primary gone before the standby is promoted
    await within(_first(driver.felt.wait(), writing), "no host takes a connection")
    assert driver.unavailable, "no write failed while no primary was up"
    await _only_standbys_are_unavailable(postgres_standby)
    promoted = await asyncio.to_thread(postgres_standby.promote)
    promoted_at.append(len(driver.harnesses) // 6)
    await within(writing, "the writer ends after the promotion")
    assert (killed, promoted) == ("a", "b")

    # every event once, in order, and the runs load as the harness holds them
    for run_id, h in driver.harnesses.items():
        seqs = [entry.seq for entry in await store.history(run_id)]
        assert seqs == list(range(1, driver.seqs[run_id] + 1)), run_id
        assert same_state(await loaded_state(store, plan, run_id), h.state), run_id
    assert len(driver.harnesses) >= 4 * 6

    # the inbox's LISTEN moved to the new primary (the listener is called once it has:
    # what came meanwhile is applied), and a notification is heard there
    await within(heard.wait(), "the inbox LISTEN is back")
    assert store._listener is not None and store._listener is not old_listener
    heard.clear()
    await store.add_to_inbox([_signal("fo-0-0")])
    await within(heard.wait(), "a notification is heard on the new primary")

    # the old primary comes back as a standby of the new one; a second failover returns
    # to it, and the same store goes on again
    await asyncio.to_thread(postgres_standby.restart, killed)
    assert (postgres_standby.primary, postgres_standby.standby) == ("b", "a")
    assert await asyncio.to_thread(postgres_standby.failover) == "a"
    h = await driver.new_run(plan, "fo-after-both")
    await driver.play(order_script(h))
    # the old primary rejoins once more; a standby killed and restarted in place streams
    # again (synchronous: the primary's commits wait for it meanwhile)
    await asyncio.to_thread(postgres_standby.restart, "b")
    await asyncio.to_thread(postgres_standby.kill, "b")
    await asyncio.to_thread(postgres_standby.restart, "b")
    h = await driver.new_run(plan, "fo-standby-back")
    await driver.play(order_script(h))
    for run_id in list(driver.harnesses)[:: len(driver.harnesses) // 5]:
        assert same_state(await loaded_state(store, plan, run_id), driver.harnesses[run_id].state)
    print(
        f"{driver.unavailable} writes failed in the failover, "
        f"{driver.found_applied} commit(s) sent again had been applied"
    )


async def within(waited: Awaitable[object], what: str) -> None:
    try:
        async with asyncio.timeout(WITHIN):
            await waited
    except TimeoutError:
        raise AssertionError(f"not within {WITHIN:g}s: {what}") from None


async def _first(waited: Coroutine[Any, Any, object], writer: asyncio.Task[None]) -> None:
    """Wait for ``waited``; a writer that ends meanwhile (it failed) raises its error."""
    waiting = asyncio.ensure_future(waited)
    try:
        await asyncio.wait({waiting, writer}, return_when=asyncio.FIRST_COMPLETED)
        if not waiting.done():
            writer.result()
            raise AssertionError("the writer ended before it was waited for")
    finally:
        waiting.cancel()


async def _only_standbys_are_unavailable(topology: PostgresStandby) -> None:
    """A URL whose every host answers and none accepts writes (here: the standby alone,
    not yet promoted) is ``StoreUnavailable``, not the driver's own exception."""
    assert topology.standby is not None
    url = f"{topology.node_url(topology.standby)}?target_session_attrs=read-write"
    store = PostgresStore(url, compile_plan=compile_stored)
    with pytest.raises(StoreUnavailable, match=r"no server of PostgreSQL at 127\.0\.0\.1:\d+ "):
        await store.open()


def _signal(run_id: str) -> Event:
    from tideflow.model.events import SignalReceived

    return SignalReceived(
        event_id=f"{run_id}:sig", run_id=run_id, time=time.time(), name="approve", payload={}
    )
