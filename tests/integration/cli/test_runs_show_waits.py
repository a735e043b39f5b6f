"""`tideflow runs show` says what a waiting step waits for: a wait's signal, match and
timeout (when it fires, what then); a sleep until when."""

from __future__ import annotations

import asyncio

from tideflow.runtime.runtime import Runtime
from tideflow.testing.clock import ManualClock
from tideflow.testing.waiting import step_is, wait_until

from .conftest import Workdir, stdout_json, tideflow

START = 1_767_225_600.0  # 2026-01-01T00:00:00Z

WAITS = """
name: waits
version: "1"
steps:
  - id: review
    type: wait
    signal: approval
    match: "{{ signal.request_id == 'R-7' }}"
    timeout: 2h
    timeout_action: continue
  - {id: plain, type: wait, signal: go}
  - {id: nap, type: sleep, until: "2099-01-01T00:00:00Z"}
"""


def _waiting_run(store: str) -> str:
    async def start() -> str:
        async with Runtime(store=store, workers=1, clock=ManualClock(START)) as rt:
            run_id = await rt.start_run(await rt.register(WAITS))
            for key in ("review", "plain", "nap"):
                await wait_until(rt, run_id, step_is(key, "waiting"))
            return run_id

    return asyncio.run(start())


def test_runs_show_json_says_what_each_waiting_step_waits_for(workdir: Workdir) -> None:
    run_id = _waiting_run(workdir.store)

    done = tideflow(workdir.path, "runs", "show", run_id, "--json", "--store", workdir.store)

    assert done.returncode == 0, done.stderr
    steps = stdout_json(done)["steps"]
    assert steps["review"]["waiting_for"] == {
        "signal": "approval",
        "match": "signal.request_id == 'R-7'",
        "timeout_at": "2026-01-01T02:00:00.000Z",
        "timeout_action": "continue",
    }
    assert steps["plain"]["waiting_for"] == {"signal": "go"}
    assert steps["nap"]["waiting_for"] == {"sleep_until": "2099-01-01T00:00:00.000Z"}


def test_runs_show_text_has_the_same_in_the_steps_table(workdir: Workdir) -> None:
    run_id = _waiting_run(workdir.store)

    done = tideflow(
        workdir.path, "runs", "show", run_id, "--store", workdir.store, env={"COLUMNS": "250"}
    )

    assert done.returncode == 0, done.stderr
    lines = {line.split()[1]: line for line in done.stdout.splitlines() if line.count("│") > 2}
    assert (
        "signal 'approval' where signal.request_id == 'R-7'; "
        "times out at 2026-01-01T02:00:00.000Z (then continues)"
    ) in lines["review"]
    assert "signal 'go'; no timeout" in lines["plain"]
    assert "sleeping until 2099-01-01T00:00:00.000Z" in lines["nap"]
