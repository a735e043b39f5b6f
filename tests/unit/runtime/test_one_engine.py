"""One engine per store (runtime/lease.py), and events from other processes reaching it
(runtime/inbox.py, runtime/delivery.py), with real runtimes on one SQLite file."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tideflow.errors import EngineAlreadyRunning, RuntimeNotStarted
from tideflow.model.events import CancelRequested, SignalReceived
from tideflow.runtime.inbox import post
from tideflow.runtime.lease import HOST
from tideflow.runtime.runtime import Runtime
from tideflow.store import open_store
from tideflow.store.base import ENGINE_LEASE, Lease
from tideflow.testing.waiting import step_is, wait_until

WAIT_THEN_STEP: dict[str, Any] = {
    "name": "approval",
    "version": "1",
    "steps": [
        {"id": "ask", "type": "wait", "signal": "approve"},
        {"id": "done", "type": "noop", "depends_on": ["ask"]},
    ],
    "output": "{{ steps.ask.output }}",
}


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'store.db'}"


def client(url: str) -> Runtime:
    """What `tideflow runs signal` opens: no workers, no recovery, no lease of its own."""
    return Runtime(store=url, workers=0, recover=False)


def approve(rt: Runtime, run_id: str, payload: Any = "yes") -> SignalReceived:
    return SignalReceived(
        event_id=rt.new_event_id(), run_id=run_id, time=time.time(), name="approve", payload=payload
    )


async def waiting_run(rt: Runtime) -> str:
    run_id = await rt.start_run(WAIT_THEN_STEP)
    await wait_until(rt, run_id, step_is("ask", "waiting"))
    return run_id


async def test_a_second_engine_on_the_store_is_refused_naming_the_first(url: str) -> None:
    async with Runtime(store=url):
        second = Runtime(store=url)
        with pytest.raises(EngineAlreadyRunning, match=f"pid {os.getpid()} on host"):
            await second.start()
        await second.close()
    async with Runtime(store=url) as third:  # released on close: the next one starts
        assert (await third.store.lease_holder(ENGINE_LEASE)) is not None


async def test_a_second_engine_told_to_wait_starts_once_the_first_exits(url: str) -> None:
    first = Runtime(store=url)
    await first.start()
    second = Runtime(store=url, wait_for_engine=30)
    starting = asyncio.create_task(second.start())
    await asyncio.sleep(0)  # let it find the lease held
    assert not starting.done()
    await first.close()
    await asyncio.wait_for(starting, 30)
    holder = await second.store.lease_holder(ENGINE_LEASE)
    await second.close()
    assert holder is not None and holder.kind == "engine"


async def test_a_signal_from_a_client_reaches_the_live_engine(url: str) -> None:
    async with Runtime(store=url) as engine:
        run_id = await waiting_run(engine)
        async with client(url) as other:
            delivered_to = await other.deliver([approve(other, run_id, {"ok": 1})])
        assert delivered_to is not None and delivered_to.kind == "engine"
        result = await engine.wait(run_id, 30)
    assert result.status == "succeeded"
    assert result.output == {"ok": 1}


async def test_a_cancel_from_a_client_reaches_the_live_engine(url: str) -> None:
    async with Runtime(store=url) as engine:
        run_id = await waiting_run(engine)
        async with client(url) as other:
            cancel = CancelRequested(
                event_id=other.new_event_id(), run_id=run_id, time=time.time(), reason="stop"
            )
            assert await other.deliver([cancel]) is not None
        assert (await engine.wait(run_id, 30)).status == "cancelled"


async def test_without_an_engine_the_client_records_the_event_and_dispatches_nothing(
    url: str,
) -> None:
    async with Runtime(store=url) as engine:
        run_id = await waiting_run(engine)
    async with client(url) as other:
        assert await other.deliver([approve(other, run_id)]) is None
        state = await other.state(run_id)
        assert state.steps["ask"].status.value == "succeeded"
        # Recorded as dispatched, but nothing was handed to a worker: the next engine's
        # recovery dispatches it.
        assert state.steps["done"].status.value == "running"
        assert not any(other.bus.lanes_of("default"))  # type: ignore[attr-defined]
        assert await other.store.lease_holder(ENGINE_LEASE) is None  # held only for a moment
    async with Runtime(store=url) as engine:  # the next engine carries it out
        assert (await engine.wait(run_id, 30)).output == "yes"


async def test_events_left_in_the_inbox_are_applied_by_the_next_engine(url: str) -> None:
    async with Runtime(store=url) as engine:
        run_id = await waiting_run(engine)
        event = approve(engine, run_id, "from the inbox")
    store = open_store(url)
    await store.open()
    try:
        assert await post(store, [event]) is None  # no engine: kept for the next one
    finally:
        await store.close()
    async with Runtime(store=url) as engine:
        assert (await engine.wait(run_id, 30)).output == "from the inbox"
        assert await engine.store.inbox() == []


async def _plant(url: str, holder: Lease, take_from: str | None = None) -> None:
    store = open_store(url)
    await store.open()
    try:
        taken = await store.acquire_lease(holder, now=time.time(), take_from=take_from)
        assert taken.owner == holder.owner
    finally:
        await store.close()


def _foreign(*, host: str, pid: int, expires_at: float) -> Lease:
    return Lease(
        name=ENGINE_LEASE,
        owner="someone-else",
        kind="engine",
        host=host,
        pid=pid,
        address=None,
        acquired_at=time.time(),
        expires_at=expires_at,
    )


async def test_a_live_lease_of_another_host_is_respected_until_it_expires(url: str) -> None:
    await _plant(url, _foreign(host="elsewhere", pid=1, expires_at=time.time() + 600))
    refused = Runtime(store=url)
    with pytest.raises(EngineAlreadyRunning, match="pid 1 on host elsewhere"):
        await refused.start()
    await refused.close()

    await _plant(url, _foreign(host="elsewhere", pid=1, expires_at=time.time() - 1))
    async with Runtime(store=url) as engine:  # expired: taken over
        holder = await engine.store.lease_holder(ENGINE_LEASE)
        assert holder is not None and holder.pid == os.getpid()


async def test_a_lease_of_a_dead_process_on_this_host_is_taken_over_at_once(url: str) -> None:
    gone = await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")
    await gone.wait()  # reaped: no process has this id now
    dead_pid = gone.pid
    await _plant(url, _foreign(host=HOST, pid=dead_pid, expires_at=time.time() + 600))
    async with Runtime(store=url) as engine:
        holder = await engine.store.lease_holder(ENGINE_LEASE)
        assert holder is not None and holder.pid == os.getpid()


async def test_an_engine_whose_lease_was_taken_stops_advancing_runs(url: str) -> None:
    async with Runtime(store=url, lease_ttl=0.2) as engine:
        run_id = await waiting_run(engine)
        seat = engine._seat
        assert seat is not None and seat.lease._heartbeat is not None
        other = _foreign(host="elsewhere", pid=1, expires_at=time.time() + 600)
        await _plant(url, other, take_from=seat.lease.owner)
        # Wait on the heartbeat noticing, not on time: its task ends when it does.
        await asyncio.wait_for(asyncio.shield(seat.lease._heartbeat), 30)
        assert not seat.lease.held
        with pytest.raises(RuntimeNotStarted):  # it takes no more work
            await engine.signal(run_id, "approve", "late")
    holder = await _holder(url)
    assert holder is not None and holder.owner == "someone-else"  # not released by the loser


async def _holder(url: str) -> Lease | None:
    store = open_store(url)
    await store.open()
    try:
        return await store.lease_holder(ENGINE_LEASE)
    finally:
        await store.close()


async def test_a_run_started_by_a_client_is_run_by_the_live_engine(url: str) -> None:
    async with Runtime(store=url) as engine, client(url) as other:
        plan = await other.register(WAIT_THEN_STEP)
        remote = other.client.recording(via=other.deliver)
        assert await remote.start(plan.name, 5, run_id="started-elsewhere") == "started-elsewhere"
        assert remote.delivered_to is not None  # the start went to the live engine
        await wait_until(engine, "started-elsewhere", step_is("ask", "waiting"), 30)
        assert await other.deliver([approve(other, "started-elsewhere", "ok")]) is not None
        assert (await engine.wait("started-elsewhere", 30)).output == "ok"
