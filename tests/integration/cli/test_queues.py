"""`tideflow queues` in process against the real Redis and NATS servers (a fresh prefix
per test), and its errors: a bad or unreachable bus URL is exit 2 with one line."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
from tests.contract.test_bus_contract import stop as stop_read

from tideflow.bus import open_bus
from tideflow.bus.base import Bus
from tideflow.cli.queues import age_text
from tideflow.model.commands import DispatchTask
from tideflow.model.plan import Priority

from .conftest import invoke, stdout_json


def task(n: int, queue: str, priority: Priority = Priority.NORMAL) -> DispatchTask:
    return DispatchTask(
        run_id=f"run-{n}",
        step_key="s",
        step_id="s",
        type="noop",
        config={},
        input={},
        attempt=1,
        idempotency_key=f"run-{n}:s:1",
        timeout=None,
        queue=queue,
        priority=priority,
    )


@pytest.fixture(params=["redis", "nats"])
def bus_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A bus URL with a prefix of its own (the CLI runs its own event loop: this is sync)."""
    prefix = f"cliq_{uuid.uuid4().hex[:12]}"
    if request.param == "redis":
        url = f"{request.getfixturevalue('redis_url')}?prefix={prefix}"
    else:
        url = f"{request.getfixturevalue('nats_url')}?prefix={prefix}"
    try:
        yield url
    finally:
        asyncio.run(_forget(url, prefix))


async def _forget(url: str, prefix: str) -> None:
    bus = open_bus(url)
    await bus.open()
    try:
        await _delete(bus, prefix)
    finally:
        await bus.close()


async def _delete(bus: Bus, prefix: str) -> None:
    from tideflow.bus.backends.nats import NatsBus
    from tideflow.bus.backends.redis import RedisBus

    if isinstance(bus, RedisBus):
        keys = [k async for k in bus.client.scan_iter(match=f"{prefix}:*")]
        if keys:
            await bus.client.delete(*keys)
    elif isinstance(bus, NatsBus):
        from tideflow.testing.nats import delete_prefix

        await delete_prefix(bus)


def publish(url: str, tasks: list[DispatchTask]) -> None:
    asyncio.run(_publish(url, tasks))


async def _publish(url: str, tasks: list[DispatchTask]) -> None:
    bus = open_bus(url)
    await bus.open()
    try:
        await bus.publish_tasks(tasks)
    finally:
        await bus.close()


def test_queues_shows_each_queue_and_priority_and_warns_of_unserved_ones(
    bus_url: str,
) -> None:
    shown = invoke("queues", "--bus", bus_url)
    assert shown.exit_code == 0, shown.output
    assert "no task queue on this bus yet" in shown.stdout
    publish(bus_url, [task(1, "reports"), task(2, "reports", Priority.HIGH)])
    shown = invoke("queues", "--bus", bus_url)
    assert shown.exit_code == 0, shown.output
    lines = [line for line in shown.stdout.splitlines() if "reports" in line]
    assert [line.replace("│", " ").split()[:4] for line in lines] == [
        ["reports", "high", "1", "0"],
        ["reports", "normal", "1", "0"],
        ["reports", "low", "0", "0"],
    ]
    assert "no worker serves queue reports: 2 task(s) waiting, oldest" in shown.stderr

    listed = invoke("queues", "--json", env={"TIDEFLOW_BUS": bus_url})
    assert listed.exit_code == 0, listed.output
    data = stdout_json(listed)
    assert data["unserved"] == ["reports"]
    assert [(r["queue"], r["priority"], r["depth"], r["consumers"]) for r in data["queues"]] == [
        ("reports", "high", 1, 0),
        ("reports", "normal", 1, 0),
        ("reports", "low", 0, 0),
    ]
    assert data["queues"][2]["oldest_age"] is None
    assert data["queues"][0]["oldest_age"] >= 0


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("kafka://mq:9092", "unknown bus URL"),
        ("redis://127.0.0.1:1/0", "connecting failed"),
        ("redis://127.0.0.1:6379/x", "the path is the database number"),
        ("nats://127.0.0.1:1", "cannot connect to NATS"),
        ("memory://", "the in-process bus lives inside one process"),
    ],
)
def test_queues_refuses_a_bad_or_unreachable_bus(url: str, message: str) -> None:
    done = invoke("queues", "--bus", url)
    assert done.exit_code == 2, done.output
    assert message in done.stderr
    assert "Traceback" not in done.stderr
    listed = invoke("queues", "--bus", url, "--json")
    assert listed.exit_code == 2
    assert stdout_json(listed)["error"]["message"]


def test_queues_needs_a_bus() -> None:
    done = invoke("queues", env={"TIDEFLOW_BUS": ""})
    assert done.exit_code == 2
    assert "give the cluster's bus" in done.stderr


def test_ages_read_as_people_say_them() -> None:
    assert [age_text(s) for s in (0.42, 42, 180, 192, 7500, 97_200, 86_400)] == [
        "0.4s",
        "42s",
        "3m",
        "3m12s",
        "2h05m",
        "1d03h",
        "1d",
    ]


def test_queues_lists_the_workers_with_their_heartbeat(bus_url: str) -> None:
    """A worker's reader open on the bus (in another thread and event loop) is listed
    live with the queues it reads; once it closes, it is gone."""
    stop = threading.Event()

    async def read() -> None:
        bus = open_bus(bus_url)
        await bus.open()
        try:
            reader = bus.consume_tasks(["reports"], prefetch=1, worker="cli-host/4242")
            waiting = asyncio.ensure_future(anext(reader))
            await asyncio.to_thread(stop.wait)
            await stop_read(waiting)  # one that runs on fails here, not hangs
            await reader.aclose()
        finally:
            await bus.close()

    failed: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(read())
        except BaseException as exc:  # (pytest.fail's too) said by the test's own thread
            failed.append(exc)

    def listed() -> list[dict[str, Any]]:
        data = stdout_json(invoke("queues", "--json", "--bus", bus_url))
        return [b for b in data["workers"] if b["worker"] == "cli-host/4242"]

    thread = threading.Thread(target=run)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not (beats := listed()):
            assert time.monotonic() < deadline, "the reader never beat"
            time.sleep(0.05)
        (beat,) = beats
        assert beat["queues"] == ["reports"] and beat["live"] is True
        last_beat = datetime.fromisoformat(beat["last_beat"]).timestamp()  # ISO 8601
        assert last_beat <= time.time() + 5
        shown = invoke("queues", "--bus", bus_url)
        assert shown.exit_code == 0, shown.output
        row = next(line for line in shown.stdout.splitlines() if "cli-host/4242" in line)
        assert row.replace("│", " ").split()[:3] == ["cli-host/4242", "reports", "live"]
    finally:
        stop.set()
        thread.join(20)
    assert not failed, f"the reader's thread failed: {failed[0]!r}"
    assert listed() == []
