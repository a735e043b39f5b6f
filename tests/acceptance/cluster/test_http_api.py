"""`tideflow server --http`: the REST API served by a real server process on PostgreSQL
and a real bus, called over TCP with API tokens made by the real `tideflow tokens
create` on the same store; it stops with the server on SIGTERM. Every wait is on a
condition with a bound."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from harness import Cluster, eventually  # noqa: E402

pytestmark = [pytest.mark.timeout(120)]

APPROVAL = {
    "name": "http-approval",
    "version": "1",
    "steps": [
        {"id": "ask", "type": "wait", "signal": "approve"},
        {
            "id": "done",
            "type": "set",
            "values": {"got": "{{ steps.ask.output }}"},
            "depends_on": ["ask"],
        },
    ],
    "output": "{{ steps.done.output }}",
}


@pytest.mark.slow
def test_the_server_serves_the_api_and_stops_it_on_sigterm(cluster: Cluster) -> None:
    server = cluster.server("--http", "127.0.0.1:0")
    server.wait_log("HTTP API listening on")
    assert "NO AUTHENTICATION" not in server.text()
    assert "tideflow tokens create --name NAME --role admin" in server.text()  # none yet
    found = re.search(r"HTTP API listening on (http://127\.0\.0\.1:\d+)", server.text())
    assert found, server.text()
    base = found.group(1)
    tokens = {}
    for role in ("admin", "viewer"):
        made = cluster.cli("tokens", "create", "--name", f"http-{role}", "--role", role)
        assert made.returncode == 0, made.stderr
        tokens[role] = {"authorization": f"Bearer {made.stdout.strip()}"}
    with httpx.Client(base_url=base, timeout=10) as anonymous:
        assert anonymous.get("/ready").json() == {"status": "ready"}
        refused = anonymous.get("/runs")
        assert refused.status_code == 401
        assert refused.headers["www-authenticate"].startswith("Bearer")
    with httpx.Client(base_url=base, timeout=10, headers=tokens["viewer"]) as viewer:
        assert viewer.get("/runs").json()["runs"] == []
        forbidden = viewer.post("/runs", json={"workflow": "http-approval"})
        assert forbidden.status_code == 403
        assert "needs role operator" in forbidden.json()["detail"]
    with httpx.Client(base_url=base, timeout=10, headers=tokens["admin"]) as api:
        assert api.get("/ready").json() == {"status": "ready"}
        assert api.post("/definitions", json=APPROVAL).status_code == 201
        started = api.post("/runs", json={"workflow": "http-approval", "idempotency_key": "k"})
        assert started.status_code == 201, started.text
        run_id = started.json()["run_id"]
        again = api.post("/runs", json={"workflow": "http-approval", "idempotency_key": "k"})
        assert (again.status_code, again.json()["run_id"]) == (200, run_id)

        def step(key: str) -> Any:
            return api.get(f"/runs/{run_id}").json()["steps"].get(key, {}).get("status")

        eventually(lambda: step("ask") == "waiting", "the run waits for approve")
        unknown = api.post(f"/runs/{run_id}/signals", json={"name": "nope"})
        assert unknown.status_code == 422
        sent = api.post(f"/runs/{run_id}/signals", json={"name": "approve", "payload": {"ok": 1}})
        assert sent.status_code == 202, sent.text

        def finished() -> Any:
            run = api.get(f"/runs/{run_id}").json()
            return run if run["status"] == "succeeded" else None

        assert eventually(finished, "the run succeeds")["output"] == {"got": {"ok": 1}}
        kinds = [e["kind"] for e in api.get(f"/runs/{run_id}/history").json()["entries"]]
        assert "signal_received" in kinds
        assert api.get("/runs/nope").status_code == 404
    assert server.term() == 0
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{base}/health", timeout=5)


@pytest.mark.slow
def test_the_server_takes_signed_cloudevents_for_the_sources_of_its_file(
    cluster: Cluster,
) -> None:
    import time

    from tideflow.api.event_sources import sign

    secret = "acceptance-secret-0123456789"
    sources = cluster.tmp / "sources.yaml"
    sources.write_text(
        "sources:\n  - {source: 'urn:desk:*', auth: hmac, secret_env: DESK_SECRET,\n"
        "     types: [approve], address_runs: true}\n"
    )
    cluster.env["DESK_SECRET"] = secret
    server = cluster.server("--http", "127.0.0.1:0", "--event-sources", str(sources))
    server.wait_log("HTTP API listening on")
    found = re.search(r"HTTP API listening on (http://127\.0\.0\.1:\d+)", server.text())
    assert found, server.text()
    made = cluster.cli("tokens", "create", "--name", "events-admin", "--role", "admin")
    assert made.returncode == 0, made.stderr
    admin = {"authorization": f"Bearer {made.stdout.strip()}"}
    with httpx.Client(base_url=found.group(1), timeout=10) as api:
        assert api.post("/definitions", json=APPROVAL, headers=admin).status_code == 201
        started = api.post("/runs", json={"workflow": "http-approval"}, headers=admin)
        run_id = started.json()["run_id"]
        event = {
            "specversion": "1.0",
            "id": "approval-1",
            "source": "urn:desk:1",
            "type": "approve",
            "tideflowrunid": run_id,
            "data": {"ok": 1},
        }
        body = httpx.Request("POST", "/", json=event).content
        stamp = str(int(time.time()))
        headers = {
            "content-type": "application/cloudevents+json",
            "x-tideflow-timestamp": stamp,
            "x-tideflow-signature": sign(secret, stamp, body),
        }
        refused = api.post(
            "/events", content=body, headers={**headers, "x-tideflow-signature": "sha256=0"}
        )
        assert refused.status_code == 401
        for _ in range(2):  # the redelivery is applied once
            sent = api.post("/events", content=body, headers=headers)
            assert sent.status_code == 202, sent.text

        def finished() -> Any:
            run = api.get(f"/runs/{run_id}", headers=admin).json()
            return run if run["status"] == "succeeded" else None

        assert eventually(finished, "the run succeeds")["output"]["got"]["data"] == {"ok": 1}
        history = api.get(f"/runs/{run_id}/history", headers=admin).json()
        kinds = [e["kind"] for e in history["entries"]]
        assert kinds.count("signal_received") == 1
    assert server.term() == 0


@pytest.mark.slow
def test_a_cluster_servers_ui_and_run_stream_follow_a_run_to_its_end(cluster: Cluster) -> None:
    """The web UI's stream on a cluster's server: the run's changes reach it from the
    server's engine (``ServerOptions.listeners``), and the stream ends with the run."""
    import orjson

    server = cluster.server("--http", "127.0.0.1:0")
    server.wait_log("HTTP API listening on")
    found = re.search(r"HTTP API listening on (http://127\.0\.0\.1:\d+)", server.text())
    assert found, server.text()
    made = cluster.cli("tokens", "create", "--name", "ui-admin", "--role", "admin")
    assert made.returncode == 0, made.stderr
    admin = {"authorization": f"Bearer {made.stdout.strip()}"}
    with httpx.Client(base_url=found.group(1), timeout=20, headers=admin) as api:
        page = api.get("/ui/")
        assert page.status_code == 200 and "/ui/static/app.js" in page.text
        assert api.post("/definitions", json=APPROVAL).status_code == 201
        run_id = api.post("/runs", json={"workflow": "http-approval"}).json()["run_id"]

        def waiting() -> Any:
            state = api.get(f"/runs/{run_id}/state").json()
            return state["waiting_for"] or None

        assert eventually(waiting, "the run waits")[0]["signal"] == "approve"
        views = []
        with api.stream("GET", f"/streams/runs/{run_id}") as stream:
            for line in stream.iter_lines():
                if line.startswith("data: "):
                    views.append(orjson.loads(line.removeprefix("data: ")))
                    if len(views) == 1:
                        sent = api.post(f"/runs/{run_id}/signals", json={"name": "approve"})
                        assert sent.status_code == 202, sent.text
        assert views[0]["steps"]["ask"]["status"] == "waiting"
        assert views[-1]["status"] == "succeeded"
    assert server.term() == 0
