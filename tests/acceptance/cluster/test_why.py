"""`tideflow runs why` on a real cluster (PostgreSQL + Redis, PostgreSQL + NATS): a step
on a live worker, the same step once that worker is SIGKILLed (its heartbeat stopped, at a
time between its start and its kill), the run once it has ended, and a run whose server was SIGKILLed (no live server
holds its partition). Every wait is on a condition with a bound."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from harness import Cluster, eventually  # noqa: E402

pytestmark = [pytest.mark.timeout(150)]


def why(cluster: Cluster, run_id: str) -> tuple[int, dict[str, Any]]:
    done = cluster.cli("runs", "why", run_id, "--json")
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout)


def reason(cluster: Cluster, run_id: str, kind: str, step: str | None = None) -> Any:
    """``why``'s reason of ``kind`` (for ``step``), once it says so; None before."""
    _, found = why(cluster, run_id)
    hits = [r for r in found["reasons"] if r["kind"] == kind and r["step"] == step]
    return hits[0] if hits else None


def started(cluster: Cluster, run_id: str) -> set[int]:
    return {
        e["pid"]
        for e in cluster.executions()
        if e["run_id"] == run_id and e["step_key"] == "slow" and e["phase"] == "start"
    }


@pytest.mark.slow
def test_runs_why_follows_a_step_from_its_worker_to_its_workers_death(cluster: Cluster) -> None:
    server = cluster.server()
    before_worker = time.time()
    first = cluster.worker()
    held = cluster.tmp / "gate"
    held.write_text("held")
    run_id = cluster.start("hold", {"x": 1, "gate": str(held)})
    eventually(lambda: started(cluster, run_id), "the slow step starts")

    on_worker = eventually(
        lambda: reason(cluster, run_id, "on_worker", "slow"), "why names the worker"
    )
    assert on_worker["data"]["worker"].endswith(f"/{first.pid}")
    assert on_worker["data"]["queue"] == "default" and on_worker["data"]["consumers"] >= 1
    assert on_worker["data"]["last_beat"] > before_worker
    code, found = why(cluster, run_id)
    assert code == 0 and found["status"] == "running"
    assert {"kind": "join", "step": "after"}.items() <= next(
        r for r in found["reasons"] if r["step"] == "after"
    ).items()

    first.kill()
    killed = time.time()
    gone = eventually(
        lambda: reason(cluster, run_id, "worker_gone", "slow"),
        "why sees that the worker's heartbeat stopped",
        timeout=40,
    )
    assert str(first.pid) in gone["text"] and "its heartbeat stopped at" in gone["text"]
    assert before_worker < gone["data"]["last_beat"] <= killed
    assert why(cluster, run_id)[0] == 1  # someone must act

    held.unlink()
    cluster.worker()
    eventually(lambda: reason(cluster, run_id, "ended"), "the run ends", timeout=60)
    code, found = why(cluster, run_id)
    assert code == 0 and found["status"] == "succeeded"
    assert "succeeded" in found["reasons"][0]["text"]

    waiting = cluster.start("signal", {"x": 1})
    eventually(
        lambda: any(r["kind"] == "waiting_for_signal" for r in why(cluster, waiting)[1]["reasons"]),
        "the signal run waits",
    )
    server.kill()
    no_server = eventually(
        lambda: reason(cluster, waiting, "no_engine"),
        "why sees no live server for the run's partition",
        timeout=40,
    )
    assert "no live server holds event partition" in no_server["text"]
