"""Cluster mode with real processes on PostgreSQL + Redis: `tideflow server`, `tideflow
worker`, the `tideflow runs …` client and `tideflow.Client.connect`, with SIGKILL and
SIGTERM (several servers sharing partitions: test_partitions.py). Every wait is on a condition with a bound."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections import Counter
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from harness import FLOWS, Cluster, eventually  # noqa: E402

from tideflow import Client, RunResult  # noqa: E402
from tideflow.store.base import HistoryEntry  # noqa: E402

pytestmark = [pytest.mark.timeout(120)]

SHAPES = ("chain", "fanout", "retrying", "signal", "sleep")


def expected(shape: str, x: int) -> int:
    a = x + 1
    return {
        "chain": x + 111,
        "fanout": 3 * a + 6,
        "retrying": 2 * x,
        "signal": a + x,  # the signal's bonus is x
        "sleep": x + 2,
    }[shape]


async def _results(cluster: Cluster, run_ids: list[str], timeout: float) -> list[RunResult]:
    async with Client.connect(cluster.store, cluster.bus) as client:
        return list(await asyncio.gather(*(client.wait(run_id, timeout) for run_id in run_ids)))


def results(cluster: Cluster, run_ids: list[str], timeout: float = 30.0) -> list[RunResult]:
    return asyncio.run(_results(cluster, run_ids, timeout))


async def _history(cluster: Cluster, run_id: str) -> list[HistoryEntry]:
    async with Client.connect(cluster.store, cluster.bus) as client:
        return await client.history(run_id)


def history(cluster: Cluster, run_id: str) -> list[HistoryEntry]:
    return asyncio.run(_history(cluster, run_id))


def completions(entries: list[HistoryEntry]) -> Counter[tuple[str, int]]:
    """How many completions of each (step, attempt) the history applied."""
    return Counter(
        (e.event["step_key"], e.event["attempt"]) for e in entries if e.kind == "task_completed"
    )


def causes(entries: list[HistoryEntry], subject: str) -> list[str]:
    return [t["cause"] for e in entries for t in e.transitions if t["subject"] == subject]


def assert_applied_once(cluster: Cluster, run_ids: list[str]) -> None:
    for run_id in run_ids:
        twice = {k: n for k, n in completions(history(cluster, run_id)).items() if n > 1}
        assert not twice, f"run {run_id}: completions applied twice: {twice}"


def gate(cluster: Cluster) -> Path:
    path = cluster.tmp / "gate"
    path.write_text("held")
    return path


def started_by(cluster: Cluster, run_id: str, step: str) -> set[int]:
    return {
        e["pid"]
        for e in cluster.executions()
        if e["run_id"] == run_id and e["step_key"] == step and e["phase"] == "start"
    }


# -- (a) 1 server + 2 workers, ~50 mixed runs ----------------------------------------


async def _start_many(cluster: Cluster, count: int) -> dict[str, tuple[str, int]]:
    """``count`` runs of every shape through the Python cluster client (signals sent at
    once: a signal that comes before its wait is kept for it)."""
    runs: dict[str, tuple[str, int]] = {}
    async with Client.connect(cluster.store, cluster.bus) as client:
        for shape in SHAPES:
            plan = await client.register(FLOWS / f"{shape}.yaml")
            for i in range(count):
                x = 1000 + 10 * i
                run_id = await client.start(plan.name, {"x": x})
                if shape == "signal":
                    await client.signal(run_id, "go", {"bonus": x})
                runs[run_id] = (shape, x)
    return runs


@pytest.mark.slow
def test_a_server_and_two_workers_run_mixed_workflows(cluster: Cluster) -> None:
    cluster.server()
    workers = [cluster.worker("--concurrency", "4"), cluster.worker("--concurrency", "4")]
    by_cli: dict[str, tuple[str, int]] = {}
    for shape in SHAPES:  # one of each through `tideflow runs start`
        by_cli[cluster.start(shape, {"x": 7})] = (shape, 7)
    signal_run = next(run_id for run_id, (shape, _) in by_cli.items() if shape == "signal")
    runs = {**by_cli, **asyncio.run(_start_many(cluster, 9))}
    assert len(runs) == 50

    sent = cluster.cli("runs", "signal", signal_run, "go", "--payload", '{"bonus": 7}')
    assert sent.returncode == 0, sent.stderr
    assert "published for run" in sent.stderr

    done = results(cluster, list(runs))
    for result in done:
        shape, x = runs[result.run_id]
        assert result.status == "succeeded", (shape, result.error, result.steps)
        assert result.output == expected(shape, x), shape
    assert_applied_once(cluster, list(runs))
    flaky = [e for e in cluster.executions() if e["step_key"] == "f"]
    assert Counter(e["attempt"] for e in flaky) == {1: 10, 2: 10}  # retried once each
    keys = {e["idempotency_key"] for e in flaky}
    assert len(keys) == 10  # both attempts of a run's step share its key
    pids = {e["pid"] for e in cluster.executions()}
    assert pids <= {w.pid for w in workers}

    waited = cluster.cli("runs", "wait", signal_run, "--json")
    assert waited.returncode == 0, waited.stderr
    assert json.loads(waited.stdout)["output"] == expected("signal", 7)


# -- (b) SIGKILL a worker mid-step -----------------------------------------------------


@pytest.mark.slow
def test_b_a_killed_workers_step_runs_again_elsewhere(cluster: Cluster) -> None:
    cluster.server()
    first = cluster.worker()
    held = gate(cluster)
    run_id = cluster.start("hold", {"x": 1, "gate": str(held)})
    eventually(lambda: started_by(cluster, run_id, "slow"), "the slow step starts")
    assert started_by(cluster, run_id, "slow") == {first.pid}
    second = cluster.worker()
    first.kill()
    held.unlink()

    (result,) = results(cluster, [run_id])
    assert result.status == "succeeded" and result.output == 3
    runs = [e for e in cluster.executions() if e["step_key"] == "slow" and e["phase"] == "start"]
    assert [e["pid"] for e in runs] == [first.pid, second.pid]
    assert {(e["attempt"], e["idempotency_key"]) for e in runs} == {(1, f"{run_id}:slow")}
    entries = history(cluster, run_id)
    assert completions(entries)[("slow", 1)] == 1
    again = [c for c in causes(entries, "slow") if "started again" in c]
    assert len(again) == 1 and "lease_expired" in again[0] and str(second.pid) in again[0]


# -- (c) SIGKILL a server: the other one takes its partitions over -----------------------


@pytest.mark.slow
def test_c_a_second_server_takes_over_from_a_killed_one(cluster: Cluster) -> None:
    active = cluster.server()
    other = cluster.server("--standby")  # deprecated: every server is active
    assert "--standby is deprecated" in other.text()
    cluster.worker("--concurrency", "4")

    held = gate(cluster)
    hold_run = cluster.start("hold", {"x": 5, "gate": str(held)})
    eventually(lambda: started_by(cluster, hold_run, "slow"), "the slow step starts")
    active.kill()
    signal_run = cluster.start("signal", {"x": 3})  # onto the bus while its owner is dead
    sleep_run = cluster.start("sleep", {"x": 4})
    sent = cluster.cli("runs", "signal", signal_run, "go", "--payload", '{"bonus": 3}')
    assert sent.returncode == 0, sent.stderr
    held.unlink()

    done = {r.run_id: r for r in results(cluster, [hold_run, signal_run, sleep_run])}
    assert done[hold_run].output == 7
    assert done[signal_run].output == expected("signal", 3)
    assert done[sleep_run].output == expected("sleep", 4)
    assert all(r.status == "succeeded" for r in done.values())
    assert_applied_once(cluster, list(done))
    assert "took partitions" in other.text()
    assert other.term() == 0


# -- (d) SIGTERM a worker: it hands back and exits 0 -----------------------------------


@pytest.mark.slow
def test_d_a_stopped_worker_hands_back_and_exits_0(cluster: Cluster) -> None:
    cluster.server()
    first = cluster.worker("--grace", "0.2")
    held = gate(cluster)
    run_id = cluster.start("hold", {"x": 1, "gate": str(held)})
    eventually(lambda: started_by(cluster, run_id, "slow"), "the slow step starts")

    assert first.term() == 0
    assert "1 task(s) still running after the grace were handed back" in first.text()
    second = cluster.worker()
    eventually(lambda: second.pid in started_by(cluster, run_id, "slow"), "it runs again")
    held.unlink()

    (result,) = results(cluster, [run_id])
    assert result.status == "succeeded" and result.output == 3
    entries = history(cluster, run_id)
    assert completions(entries)[("slow", 1)] == 1
    # Delivery 2 on Redis; on NATS the nack may reach the draining worker once more
    # (it hands it back again) before the other takes it: delivery 3.
    assert any(
        "started again" in c and re.search(r"delivery [23]\b", c) for c in causes(entries, "slow")
    ), causes(entries, "slow")
