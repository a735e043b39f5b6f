"""What the API shows of attempts and steps, over a real uvicorn: an attempt ends with its
outcome (a cancelled one `cancelled`, one its timeout ended `timed_out`), never `running`
for ever; a compensated step shows `compensated`, in the run's state, its instances and
its compensation's attempts (runtime/shown.py decides them all)."""

from __future__ import annotations

import contextlib
import textwrap
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from tideflow.api.changes import RunChanges
from tideflow.api.serving import address_of, http_api, listen
from tideflow.dsl import compile_definition
from tideflow.lifecycle import Stop
from tideflow.runtime.runtime import Runtime
from tideflow.testing.waiting import step_is, wait_until
from tideflow.worker.executors.functions import register, unregister

RELEASE = threading.Event()


@pytest.fixture(autouse=True)
def functions() -> Iterator[None]:
    RELEASE.clear()

    @register("shown.block")
    def block() -> str:
        RELEASE.wait(30)  # until the test is done with it (a worker thread cannot be killed)
        return "late"

    @register("shown.reserve")
    def reserve() -> dict[str, str]:
        return {"hold": "H1"}

    @register("shown.release")
    def release(hold: str) -> str:
        return f"released {hold}"

    @register("shown.fail")
    def fail() -> None:
        raise ValueError("the carrier refused the address")

    yield
    RELEASE.set()
    for name in ("shown.block", "shown.reserve", "shown.release", "shown.fail"):
        unregister(name)


BLOCKED = compile_definition(
    textwrap.dedent(
        """
        name: blocked
        version: "1"
        steps:
          - {id: work, type: python, function: shown.block}
        """
    )
)
TIMED = compile_definition(
    textwrap.dedent(
        """
        name: timed
        version: "1"
        steps:
          - {id: work, type: python, function: shown.block, timeout: 50ms}
        """
    )
)
SAGA = compile_definition(
    textwrap.dedent(
        """
        name: saga
        version: "1"
        on_failure: compensate
        steps:
          - id: reserve
            type: python
            function: shown.reserve
            compensate:
              type: python
              function: shown.release
              input: {hold: "{{ steps.reserve.output.hold }}"}
          - {id: ship, type: python, function: shown.fail, depends_on: [reserve]}
        """
    )
)


@contextlib.asynccontextmanager
async def served(rt: Runtime) -> AsyncIterator[httpx.AsyncClient]:
    sock = listen("127.0.0.1", 0)
    async with (
        http_api(rt.client, Stop(), sock, auth=False, changes=RunChanges()),
        httpx.AsyncClient(base_url=address_of(sock), timeout=20) as api,
    ):
        yield api


def started(key: str) -> Any:
    def check(state: Any) -> bool:
        st = state.steps.get(key)
        return st is not None and st.attempt_started_at is not None

    return check


async def test_a_cancelled_attempt_ends_cancelled_not_running_for_ever() -> None:
    async with Runtime(workers=1) as rt, served(rt) as api:
        run_id = await rt.start_run(BLOCKED)
        await wait_until(rt, run_id, started("work"))
        before = (await api.get(f"/runs/{run_id}/attempts")).json()["attempts"]
        assert [(a["step_key"], a["outcome"], a["ended_at"]) for a in before] == [
            ("work", "running", None)
        ]
        await rt.cancel(run_id, "not needed")
        await wait_until(rt, run_id, step_is("work", "cancelled"))
        after = (await api.get(f"/runs/{run_id}/attempts")).json()
    [attempt] = after["attempts"]
    assert (attempt["outcome"], attempt["error"]) == ("cancelled", "not needed")
    assert attempt["ended_at"] is not None and attempt["started_at"] <= attempt["ended_at"]


async def test_an_attempt_its_timeout_ended_is_timed_out() -> None:
    async with Runtime(workers=1) as rt, served(rt) as api:
        run_id = await rt.start_run(TIMED)
        await wait_until(rt, run_id, step_is("work", "failed"))
        attempts = (await api.get(f"/runs/{run_id}/attempts")).json()["attempts"]
    assert [(a["attempt"], a["outcome"]) for a in attempts] == [(1, "timed_out")]
    assert "exceeded its timeout" in attempts[0]["error"]


async def test_a_compensated_step_shows_compensated_and_its_compensation_attempts() -> None:
    async with Runtime(workers=1) as rt, served(rt) as api:
        run_id = await rt.start_run(SAGA)
        result = await rt.wait(run_id, timeout=10)
        assert result.status == "compensated"
        assert result.steps["reserve"].status == "succeeded"  # the core's state stays
        state = (await api.get(f"/runs/{run_id}/state")).json()
        step = (await api.get(f"/runs/{run_id}/steps/reserve")).json()
        attempts = (await api.get(f"/runs/{run_id}/attempts")).json()["attempts"]
    assert state["steps"]["reserve"]["status"] == "compensated"
    assert state["steps"]["reserve"]["counts"] == {"compensated": 1}
    assert state["steps"]["ship"]["status"] == "failed"
    assert step["instances"][0]["status"] == "compensated"
    rows = [(a["step_key"], a["compensation"], a["outcome"]) for a in attempts]
    assert rows == [
        ("reserve", False, "succeeded"),
        ("ship", False, "failed"),
        ("reserve", True, "succeeded"),
    ]
