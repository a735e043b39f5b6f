"""`tideflow queues` on a real cluster (PostgreSQL + Redis): a step for a queue that no
worker serves stays queued and visible, and the run waits for a worker (never lost,
never failed). Every wait is on a condition with a bound."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from harness import Cluster, eventually  # noqa: E402

pytestmark = [pytest.mark.timeout(120)]


def queues(cluster: Cluster) -> dict[tuple[str, str], dict[str, Any]]:
    done = cluster.cli("queues", "--json")
    assert done.returncode == 0, done.stderr
    return {(r["queue"], r["priority"]): r for r in json.loads(done.stdout)["queues"]}


def status(cluster: Cluster, run_id: str) -> dict[str, Any]:
    shown = cluster.cli("runs", "show", run_id, "--json")
    assert shown.returncode == 0, shown.stderr
    data: dict[str, Any] = json.loads(shown.stdout)
    return data


@pytest.mark.slow
def test_a_step_for_a_queue_no_worker_serves_waits_queued_and_visible(cluster: Cluster) -> None:
    cluster.server()
    cluster.worker("--queues", "default")
    run_id = cluster.start("report", {"x": 1})

    def reports_waiting() -> dict[str, Any] | None:
        row = queues(cluster).get(("reports", "normal"))
        return row if row is not None and row["depth"] == 1 else None

    row = eventually(reports_waiting, "the reports task on the bus")
    assert (row["held"], row["consumers"]) == (0, 0)
    assert row["oldest_age"] is not None
    rows = queues(cluster)
    assert rows["default", "normal"]["consumers"] == 1
    assert rows["default", "normal"]["depth"] == 0  # step a ran

    shown = cluster.cli("queues")
    assert shown.returncode == 0, shown.stderr
    assert "reports" in shown.stdout and "default" in shown.stdout
    assert "no worker serves queue reports: 1 task(s) waiting, oldest" in shown.stderr

    # a worker's lease (2 s) comes and goes while it waits: the run stays running, the
    # task stays queued (what any worker did would show as held or as a later state)
    assert status(cluster, run_id)["status"] == "running"
    eventually(lambda: queues(cluster)["reports", "normal"]["oldest_age"] > 2.5, "time passes")
    assert status(cluster, run_id)["status"] == "running"
    assert queues(cluster)["reports", "normal"]["depth"] == 1

    reports = cluster.worker("--queues", "reports")
    waited = cluster.cli("runs", "wait", run_id, "--json")
    assert waited.returncode == 0, waited.stderr
    assert json.loads(waited.stdout)["output"] == 12
    assert {e["pid"] for e in cluster.executions() if e["step_key"] == "r"} == {reports.pid}
    row = queues(cluster)["reports", "normal"]
    assert (row["depth"], row["held"], row["consumers"]) == (0, 0, 1)
    ok = cluster.cli("queues")
    assert ok.returncode == 0 and "warning" not in ok.stderr, ok.stderr
