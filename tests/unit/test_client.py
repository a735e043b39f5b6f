"""The client starts, steers and reads runs through one port to the engine: beside a live
engine its events are applied by that engine; a recording client commits each event
before it returns, for the next engine to carry out."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tideflow.client import Client
from tideflow.dsl import compile_definition
from tideflow.errors import DefinitionError, NotFound, RunNotRetryable, UnknownSignal
from tideflow.runtime.runtime import Runtime
from tideflow.store.base import RunFilter
from tideflow.testing.waiting import step_is, wait_until

WAITING = compile_definition(
    textwrap.dedent(
        """
        name: waiting
        version: "1"
        steps:
          - {id: ask, type: wait, signal: go}
          - {id: after, type: noop, depends_on: [ask]}
        output: "{{ steps.ask.output }}"
        """
    )
)


async def test_a_client_beside_a_live_engine_does_everything_a_caller_needs() -> None:
    async with Runtime(workers=2) as rt:
        client: Client = rt.client
        run_id = await client.start(WAITING, run_id="r1")
        await wait_until(rt, run_id, step_is("ask", "waiting"))
        with pytest.raises(UnknownSignal):
            await client.signal(run_id, "nope")
        await client.signal(run_id, "go", {"ok": True})
        result = await client.wait(run_id, 10)
        assert result.status == "succeeded"
        assert result.output == {"ok": True}
        assert (await client.get(run_id)).status == "succeeded"
        kinds = [e.kind for e in await client.history(run_id)]
        assert kinds[0] == "run_started" and "signal_received" in kinds
        page = await client.list(RunFilter(workflow="waiting"))
        assert [r.run_id for r in page.runs] == ["r1"]
        with pytest.raises(RunNotRetryable):
            await client.retry(run_id)
        other = await client.start(WAITING, run_id="r2")
        await wait_until(rt, other, step_is("ask", "waiting"))
        assert await client.cancel(other) == "running"
        assert (await client.wait(other, 10)).status == "cancelled"


async def test_a_recording_client_commits_before_it_returns(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"
    async with Runtime(store=url, workers=2) as rt:
        run_id = await rt.start_run(WAITING, run_id="later")
        await wait_until(rt, run_id, step_is("ask", "waiting"))
    async with Runtime(store=url, workers=0, recover=False) as tool:
        client = tool.client.recording()
        await client.signal(run_id, "go", {"by": "tool"})
        kinds = [e.kind for e in await client.history(run_id)]
        assert kinds[-1] == "signal_received"  # committed, not merely published
        assert (await client.summary(run_id)).status == "running"
    async with Runtime(store=url, workers=2) as rt:  # the next engine carries it out
        result = await rt.wait(run_id, 10)
    assert result.status == "succeeded"
    assert result.output == {"by": "tool"}


async def test_a_client_compiles_without_registering_and_reads_definitions() -> None:
    async with Runtime(workers=0) as rt:
        client = rt.client
        plan = client.compile(dict(WAITING.source))
        assert (plan.name, plan.version, plan.hash) == ("waiting", "1", WAITING.hash)
        assert await client.definitions() == []
        with pytest.raises(DefinitionError):
            client.compile({"name": "broken", "version": "1", "steps": [{"id": "a"}]})
        await client.register(WAITING)
        assert [(d.name, d.version) for d in await client.definitions("waiting")] == [
            ("waiting", "1")
        ]
        assert await client.definitions("other") == []
        assert (await client.definition("waiting", "1")).hash == WAITING.hash
        with pytest.raises(NotFound):
            await client.definition("waiting", "2")


async def test_launch_says_whether_the_idempotency_key_made_a_run() -> None:
    async with Runtime(workers=0) as rt:
        first = await rt.client.launch(WAITING, idempotency_key="k")
        again = await rt.client.launch(WAITING, idempotency_key="k")
        assert first[1] is True
        assert again == (first[0], False)
        assert await rt.client.start(WAITING, idempotency_key="k") == first[0]
