"""Schedules fired by two real `tideflow server` processes on one PostgreSQL store: both
arm the same rows and fire the same slots; every slot still has exactly one run (one
idempotency key per slot, revision-checked row updates). Bounded in time, waiting on
conditions."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from harness import Cluster, eventually  # noqa: E402

from tideflow import Client  # noqa: E402
from tideflow.core.schedule_slots import iso_slot  # noqa: E402
from tideflow.store.base import RunFilter  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

SLOTS = 50
EVERY = 0.25
"""Seconds between two slots: 50 slots take 12.5 s."""
LEAD = 6.0
"""Seconds from registering to the first slot (both servers see the row before)."""


async def _scheduled_at(cluster: Cluster) -> list[str]:
    async with Client.connect(cluster.store, cluster.bus) as client:
        page = await client.list(RunFilter(workflow="ticks"), limit=10 * SLOTS)
        states = [await client.state(r.run_id) for r in page.runs]
    return [state.input["scheduled_at"] for state in states]


def test_two_servers_on_one_store_start_one_run_per_slot(cluster: Cluster) -> None:
    # the servers run first; the definition registered from another process reaches them
    # at their next reconciliation round (every second here), well before its first slot
    cluster.env["TIDEFLOW_SWEEP_INTERVAL"] = "1"
    servers = cluster.servers(2)
    start_at = float(int(time.time() + LEAD))
    end_at = start_at + (SLOTS - 1) * EVERY
    flow = cluster.tmp / "ticks.yaml"
    definition = {
        "name": "ticks",
        "version": "1",
        "schedule": {
            "every": EVERY,
            "start_at": start_at,
            "end_at": end_at,
            "overlap": "allow",  # each slot's run, whatever the one before is doing
            "catchup": "all",  # a server that was late still starts every slot
        },
        "steps": [{"id": "note", "type": "set", "values": {"at": "{{ inputs.scheduled_at }}"}}],
    }
    flow.write_text(yaml.safe_dump(definition))
    done = cluster.cli("definitions", "register", str(flow))
    assert done.returncode == 0, done.stderr

    expected = [iso_slot(start_at + i * EVERY) for i in range(SLOTS)]

    def all_slots() -> list[str] | None:
        found = asyncio.run(_scheduled_at(cluster))
        return found if len(found) >= SLOTS and time.time() > end_at + 2 else None

    found = eventually(all_slots, f"{SLOTS} scheduled runs", timeout=LEAD + 60)
    twice = [slot for slot, n in Counter(found).items() if n > 1]
    assert twice == [], f"slots with more than one run: {twice}"
    assert sorted(found) == sorted(expected)  # (text order: "12.250Z" < "12Z")
    listed = cluster.cli("schedules", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    [row] = json.loads(listed.stdout)["schedules"]
    assert row["next_fire_at"] is None and row["last_slot"] == expected[-1]  # past end_at
    for server in servers:
        assert "Traceback" not in server.text(), server.text()
