"""Admission order, end to end (runtime/admission.py): with the bound at 10 and 100 runs
submitted in one burst, no run is admitted before an older one of the same priority, and
no more than 10 runs are ever active. On every store (memory, SQLite, PostgreSQL) with
the in-process bus, and on PostgreSQL with a real `tideflow server` process and worker on
each cluster bus (Redis Streams, NATS JetStream).

The evidence is read from outside the engine: each run's history (its ``run_started``
time is when its engine admitted it), its summary (when it was created, when it ended),
and the count of ``running`` runs in the store, sampled while the burst drains."""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from harness import FLOWS, Cluster, eventually  # noqa: E402

from tideflow import Client  # noqa: E402
from tideflow.runtime.runtime import Runtime  # noqa: E402
from tideflow.store.base import RunFilter, Store  # noqa: E402

pytestmark = [pytest.mark.timeout(180)]

BOUND = 10
RUNS = 100


@dataclass(frozen=True, slots=True)
class Seen:
    run_id: str
    created_at: float
    admitted_at: float
    ended_at: float


async def seen_runs(store: Store, run_ids: list[str]) -> list[Seen]:
    out = []
    for run_id in run_ids:
        summary = await store.get_run(run_id)
        assert summary.status == "succeeded", (run_id, summary.status)
        assert summary.finished_at is not None
        [admitted] = [e.time for e in await store.history(run_id) if e.kind == "run_started"]
        out.append(Seen(run_id, summary.created_at, admitted, summary.finished_at))
    return out


def check_admission(runs: list[Seen], bound: int, sampled: tuple[int, int]) -> None:
    """No run admitted before an older one (all are of one priority); at no admission
    were more than ``bound`` runs active; the sampled count of running runs agrees, and
    runs did wait (``sampled``: the most runs seen running, pending)."""
    sampled_max, queued = sampled
    by_age = sorted(runs, key=lambda r: (r.created_at, r.run_id))
    overtaken = [
        (older.run_id, younger.run_id)
        for older, younger in itertools.pairwise(by_age)
        if younger.admitted_at < older.admitted_at
    ]
    assert not overtaken, f"runs admitted before an older one: {overtaken[:5]}"
    most = max(
        sum(1 for other in runs if other.admitted_at <= run.admitted_at < other.ended_at)
        for run in runs
    )
    assert most <= bound, f"{most} runs were active at once (bound {bound})"
    assert 0 < sampled_max <= bound, f"sampled {sampled_max} running runs (bound {bound})"
    assert queued > 0  # the burst did queue: the bound was at work


async def sample_running(store: Store, stop: asyncio.Event) -> tuple[int, int]:
    """The most runs seen ``running`` in the store at once, and the most seen pending,
    until ``stop``."""
    most = queued = 0
    while not stop.is_set():
        page = await store.list_runs(RunFilter(status="running"), limit=1000)
        most = max(most, len(page.runs))
        queued = max(queued, await store.count_pending())
        await asyncio.sleep(0.01)  # a sampling period, not a synchronisation
    return most, queued


async def burst(
    client: Client, workflow: str, runs: int = RUNS
) -> tuple[list[str], tuple[int, int]]:
    """Submit ``runs`` runs at once, wait for every one to end; the ids and what was
    sampled (``sample_running``)."""
    stop = asyncio.Event()
    sampler = asyncio.create_task(sample_running(client.store, stop))
    run_ids = [await client.start(workflow, {"x": n}) for n in range(runs)]
    for run_id in run_ids:
        await client.wait(run_id, timeout=120)
    stop.set()
    return run_ids, await sampler


# -- one process, the in-process bus, every store ------------------------------------------


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def store_url(
    request: pytest.FixtureRequest, tmp_path: Path, postgres_url: str
) -> AsyncIterator[str]:
    if request.param == "memory":
        yield "memory://"
    elif request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.db'}"
    else:
        schema = f"admission_{uuid.uuid4().hex[:12]}"
        yield f"{postgres_url}?schema={schema}"
        conn = await asyncpg.connect(postgres_url)
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await conn.close()


async def test_a_burst_is_admitted_in_order_within_the_bound(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIDEFLOW_CLUSTER_LOG", str(tmp_path / "steps.jsonl"))  # cluster_steps
    async with Runtime(store=store_url, workers=8, max_active_runs=BOUND) as rt:
        plan = await rt.register(FLOWS / "chain.yaml")
        run_ids, sampled = await burst(rt.client, plan.name)
        check_admission(await seen_runs(rt.store, run_ids), BOUND, sampled)
        assert rt.admission[:2] == (0, BOUND)


# -- a real server and worker on each cluster bus ------------------------------------------


def test_a_burst_is_admitted_in_order_within_the_bound_by_a_server(cluster: Cluster) -> None:
    server = cluster.server("--max-active-runs", str(BOUND))
    cluster.worker()

    async def drive() -> None:
        async with Client.connect(store=cluster.store, bus=cluster.bus) as client:
            plan = await client.register(FLOWS / "chain.yaml")
            run_ids, sampled = await burst(client, plan.name)
            check_admission(await seen_runs(client.store, run_ids), BOUND, sampled)

    asyncio.run(drive())
    assert "repaired" not in server.text()  # the sweep had nothing to repair


def test_the_attempts_in_flight_bound_admits_wide_runs_by_their_claim(cluster: Cluster) -> None:
    """The run bound (100) leaves room; the task bound (6) holds: a run of the fan-out
    (three steps at one level) claims 3, so two are active at once, admitted in order
    (and the server applies at most 4 events a batch: ``--batch-size``)."""
    server = cluster.server(
        "--max-active-runs", "100", "--max-tasks-in-flight", "6", "--batch-size", "4"
    )
    cluster.worker()

    async def drive() -> None:
        async with Client.connect(store=cluster.store, bus=cluster.bus) as client:
            plan = await client.register(FLOWS / "fanout.yaml")
            run_ids, sampled = await burst(client, plan.name, runs=30)
            check_admission(await seen_runs(client.store, run_ids), 2, sampled)

    asyncio.run(drive())
    assert "repaired" not in server.text()


@pytest.mark.slow
def test_queues_and_why_show_the_runs_held_by_the_bound(cluster: Cluster) -> None:
    """No worker: the two admitted runs stay active, the three others wait their turn."""
    cluster.server("--max-active-runs", "2")
    run_ids = [cluster.start("chain", {"x": n}) for n in range(5)]

    def counted() -> dict[str, int] | None:
        done = cluster.cli("queues", "--store", cluster.store, "--json")
        assert done.returncode == 0, done.stderr
        runs: dict[str, int] = json.loads(done.stdout)["runs"]
        return runs if runs == {"active": 2, "pending": 3} else None

    eventually(counted, "two runs active, three pending")
    shown = cluster.cli("queues", "--store", cluster.store)
    assert "runs: 2 active (admitted, not ended), 3 pending" in shown.stdout, shown.stderr
    why = cluster.cli("runs", "why", run_ids[-1])
    assert "pending: 2 run(s) ahead of it" in why.stdout, why.stdout + why.stderr


@pytest.mark.slow
def test_a_server_that_takes_over_counts_the_active_runs_and_admits_in_order(
    cluster: Cluster,
) -> None:
    """A server is killed at its bound, no worker running: the one that takes its
    partitions over counts the runs it left active (it admits nobody past the bound) and
    admits the queued ones in order once a worker runs them."""
    first = cluster.server("--max-active-runs", "2")

    async def submit() -> list[str]:
        async with Client.connect(store=cluster.store, bus=cluster.bus) as client:
            plan = await client.register(FLOWS / "chain.yaml")
            return [await client.start(plan.name, {"x": n}) for n in range(6)]

    async def pending() -> int:
        async with Client.connect(store=cluster.store, bus=cluster.bus) as client:
            return await client.store.count_pending()

    run_ids = asyncio.run(submit())
    eventually(lambda: asyncio.run(pending()) == 4, "two runs admitted, four queued")
    first.kill()
    cluster.server("--max-active-runs", "2")
    cluster.worker()

    async def drain() -> None:
        async with Client.connect(store=cluster.store, bus=cluster.bus) as client:
            stop = asyncio.Event()
            sampler = asyncio.create_task(sample_running(client.store, stop))
            for run_id in run_ids:
                await client.wait(run_id, timeout=60)
            stop.set()
            most, _ = await sampler
            check_admission(await seen_runs(client.store, run_ids), 2, (most, 4))

    asyncio.run(drain())


def is_waiting(step: Any) -> bool:
    return step is not None and step.status == "waiting"


@pytest.mark.slow
def test_runs_that_wait_hold_no_slot_before_and_after_a_takeover(cluster: Cluster) -> None:
    """With the bound at 2, three runs that each wait for a signal hold no slot: a fourth
    run starts and finishes while they wait, on the first server and on the one that takes
    its partitions over after it is killed (it counts the busy runs, not the parked ones);
    the signals then finish the three."""
    first = cluster.server("--max-active-runs", "2")
    cluster.worker()

    async def waiting() -> list[str]:
        async with Client.connect(store=cluster.store, bus=cluster.bus) as client:
            plan = await client.register(FLOWS / "signal.yaml")
            await client.register(FLOWS / "chain.yaml")
            run_ids = [await client.start(plan.name, {"x": n}) for n in range(3)]
            for run_id in run_ids:
                while not is_waiting((await client.get(run_id)).steps.get("go")):  # noqa: ASYNC110
                    await asyncio.sleep(0.05)  # polled until a condition, bounded by wait_for
            return run_ids

    async def quick() -> None:
        async with Client.connect(store=cluster.store, bus=cluster.bus) as client:
            run_id = await client.start("cl-chain", {"x": 1})
            assert (await client.wait(run_id, timeout=60)).status == "succeeded"

    run_ids = asyncio.run(asyncio.wait_for(waiting(), 60))
    asyncio.run(quick())  # the three parked runs left the bound's two slots free
    first.kill()
    cluster.server("--max-active-runs", "2")
    asyncio.run(quick())  # the new owner counted no busy run

    async def finish() -> None:
        async with Client.connect(store=cluster.store, bus=cluster.bus) as client:
            for run_id in run_ids:
                await client.signal(run_id, "go", {"bonus": 5})
            for run_id in run_ids:
                result = await client.wait(run_id, timeout=60)
                assert result.status == "succeeded", (run_id, result.status)

    asyncio.run(finish())
