"""Metrics and logs of real processes: `tideflow worker --metrics` serves its own port,
`tideflow server --http` serves `/metrics` to a viewer token, both log JSON lines when
stderr is a file. Every wait is on a condition with a bound."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from harness import Cluster, eventually  # noqa: E402

pytestmark = [pytest.mark.timeout(120)]

RUNS = 3
"""cl-chain runs to start: three `python` steps each."""


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def address(log: str, pattern: str) -> str:
    found = re.search(pattern, log)
    assert found, log
    return found.group(1)


@pytest.mark.slow
def test_a_worker_and_a_server_serve_their_metrics_over_http(cluster: Cluster) -> None:
    server = cluster.server("--http", "127.0.0.1:0")
    server.wait_log("HTTP API listening on")
    api = address(server.text(), r"HTTP API listening on (http://127\.0\.0\.1:\d+)")
    worker = cluster.worker("--metrics", "127.0.0.1:0", "--concurrency", "2")
    worker.wait_log("/metrics")
    port = address(worker.text(), r"metrics on (http://127\.0\.0\.1:\d+/metrics)")
    made = cluster.cli("tokens", "create", "--name", "prometheus", "--role", "viewer")
    assert made.returncode == 0, made.stderr
    viewer = {"authorization": f"Bearer {made.stdout.strip()}"}

    runs = [cluster.start("chain", {"x": i}) for i in range(RUNS)]
    for run_id in runs:
        waited = cluster.cli("runs", "wait", run_id, "--json")
        assert waited.returncode == 0, waited.stderr

    succeeded = (
        "tideflow_worker_attempts_total",
        frozenset({("type", "python"), ("outcome", "succeeded")}),
    )

    def scraped_worker() -> dict[tuple[str, frozenset[tuple[str, str]]], float] | None:
        # the last outcome is published before its task is acknowledged: settled soon after
        found = samples(httpx.get(port, timeout=10).text)
        return found if found.get(succeeded) == 3 * RUNS else None

    on_worker = eventually(scraped_worker, "the worker counted every attempt")
    assert on_worker[("tideflow_worker_attempts_running", frozenset())] == 0
    assert any(name == "process_cpu_seconds_total" for name, _ in on_worker)
    assert (("tideflow_queue_consumers", frozenset({("queue", "default")}))) in on_worker

    with httpx.Client(base_url=api, timeout=10) as http:
        assert http.get("/metrics").status_code == 401
        response = http.get("/metrics", headers=viewer)
    assert response.status_code == 200, response.text
    on_server = samples(response.text)
    workflow = frozenset({("workflow", "cl-chain")})
    assert on_server[("tideflow_runs_started_total", workflow)] == RUNS
    finished = frozenset({("workflow", "cl-chain"), ("status", "succeeded")})
    assert on_server[("tideflow_runs_finished_total", finished)] == RUNS
    step = frozenset({("workflow", "cl-chain"), ("step", "b"), ("type", "python")})
    assert on_server[("tideflow_step_duration_seconds_count", step)] == RUNS
    assert on_server[("tideflow_active_runs", frozenset())] == 0

    assert worker.term() == 0
    assert server.term() == 0
    for proc in (server, worker):  # stderr is a file: JSON lines, each with its context
        lines = [json.loads(line) for line in proc.text().splitlines() if line.startswith("{")]
        assert lines, proc.text()
        assert all({"run_id", "step_id", "attempt", "trace_id"} <= set(line) for line in lines)
        assert any(line["message"].startswith("stopped") for line in lines), proc.text()
