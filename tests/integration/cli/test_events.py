"""`tideflow events list|replay`: the gateway's dead letter from the command line."""

from __future__ import annotations

import asyncio
import time

from tideflow.api.events import signal_id
from tideflow.runtime.intake import Inbound, Intake
from tideflow.runtime.runtime import Runtime

from .conftest import Workdir, invoke, stdout_json, waiting_runs


def unmatched_event(store: str) -> str:
    """Send the gateway an `approve` event no run waits for (none is registered): its key."""

    async def send() -> str:
        async with Runtime(store=store, workers=0) as rt:
            key = signal_id("urn:desk", "ev-1")
            event = Inbound(
                key=key, source="urn:desk", id="ev-1", type="approve", payload={"ok": True}
            )
            outcome = await Intake(rt.client, now=time.time).take(event)
            assert outcome.status == "unmatched"
            return key

    return asyncio.run(send())


def test_an_unmatched_event_is_listed_and_a_replay_delivers_it(workdir: Workdir) -> None:
    key = unmatched_event(workdir.store)
    listed = invoke("events", "list", "--json", "--store", workdir.store)
    assert listed.exit_code == 0, listed.stderr
    (shown,) = stdout_json(listed)["events"]
    assert (shown["key"], shown["type"], shown["payload"]) == (key, "approve", {"ok": True})
    assert "no run waits for signal 'approve'" in shown["reason"]
    table = invoke("events", "list", "--store", workdir.store)
    assert key in table.stdout

    nobody = invoke("events", "replay", key, "--store", workdir.store)
    assert nobody.exit_code == 1 and "still unmatched" in nobody.stderr

    (run_id,) = waiting_runs(workdir.store, 1, workdir.path / "wait.yaml")
    replayed = invoke("events", "replay", key, "--json", "--store", workdir.store)
    assert replayed.exit_code == 0, replayed.stderr
    assert stdout_json(replayed)["delivered_to"] == [run_id]
    assert stdout_json(invoke("events", "list", "--json", "--store", workdir.store)) == {
        "events": []
    }
    again = invoke("events", "replay", key, "--store", workdir.store)
    assert again.exit_code == 2 and "no unmatched event" in again.stderr

    async def signals() -> list[str]:
        async with Runtime(store=workdir.store, workers=0) as rt:
            return [e.kind for e in await rt.client.history(run_id) if e.kind == "signal_received"]

    assert asyncio.run(signals()) == ["signal_received"]
