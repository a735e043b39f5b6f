"""The sender examples (examples/events/: send_event.py, stdlib and httpx; send_event.sh,
curl and openssl) run as their own processes against the API served by uvicorn on a
free loopback port with the example sources file, and their events reach the runs of
the example workflow waiting for them; the `match` on ``signal.source`` keeps an event
of the same type from another source out. A run id given to the shell sender is signed
too, and refused by the payment source's policy."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from tideflow.api.auth import issue_token
from tideflow.api.event_sources import EventSources
from tideflow.model.tokens import Role
from tideflow.runtime.runtime import Runtime
from tideflow.testing.waiting import step_is, wait_until

from .conftest import served

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "events"
ENV = {
    "PAY_WEBHOOK_SECRET": "whsec-example-0123456789abcdef",
    "APPROVALS_TOKEN": "approvals-example-0123456789",
}
PAYMENTS = "https://pay.example.com/webhooks"


async def execute(*command: str) -> dict[str, Any]:
    """Run a sender; it exits 0 and prints the gateway's answer."""
    sender = await asyncio.create_subprocess_exec(
        *command,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **ENV},
    )
    out, err = await sender.communicate()
    assert sender.returncode == 0, (out.decode(), err.decode())
    answer: dict[str, Any] = orjson.loads(out)
    return answer


def python_sender(api: str, *args: str) -> list[str]:
    return [sys.executable, str(EXAMPLES / "send_event.py"), api, *args]


@pytest.mark.skipif(
    not all(shutil.which(tool) for tool in ("bash", "curl", "openssl")),
    reason="needs bash, curl and openssl",
)
async def test_the_python_and_the_shell_senders_reach_the_waiting_runs() -> None:
    sources = EventSources.load(EXAMPLES / "sources.yaml", ENV)
    flow = yaml.safe_load((EXAMPLES / "order_payment.yaml").read_text())
    async with Runtime(workers=1) as rt, served(rt.client, sources) as http:
        api = str(http.base_url).rstrip("/")
        await rt.client.register(flow)
        runs = {
            o: await rt.client.start("order-payment", {"order_id": o}) for o in ("o-py", "o-sh")
        }
        for run_id in runs.values():
            await wait_until(rt, run_id, step_is("paid", "waiting"))
        for order, run_id in runs.items():  # the desk's approval, to the run by id (bearer)
            approval = python_sender(
                api, "--token-env", "APPROVALS_TOKEN", "--source", "urn:approvals:desk",
                "--type", "com.example.order.approved", "--id", f"approval-{order}",
                "--run", run_id, "--data", '{"by": "ada"}',
            )  # fmt: skip
            answer = await execute(*approval)
            assert answer["events"][0]["delivered_to"] == [run_id], answer

        # an event of the payment type from another source (an API token may send any
        # type) reaches the run by its order id, before the provider's: the match on
        # signal.source does not take it (the run ends with the provider's amount)
        operator = await issue_token(rt.client.store, name="ops", role=Role.OPERATOR, now=0.0)
        elsewhere = {"specversion": "1.0", "id": "x-1", "source": "urn:elsewhere",
                     "type": "com.example.payment.succeeded",
                     "data": {"order_id": "o-py", "amount": 1}}  # fmt: skip
        answer = await http.post(
            "/events",
            content=orjson.dumps(elsewhere),
            headers={"content-type": "application/cloudevents+json",
                     "authorization": f"Bearer {operator.value}"},
        )  # fmt: skip
        assert answer.json()["events"][0]["delivered_to"] == [runs["o-py"]], answer.text

        paid = python_sender(
            api, "--source", PAYMENTS, "--type", "com.example.payment.succeeded",
            "--id", "pay-1", "--data", '{"order_id": "o-py", "amount": 129.5}',
        )  # fmt: skip
        answer = await execute(*paid)
        assert answer["events"][0]["delivered_to"] == [runs["o-py"]], answer
        script = [
            "bash", str(EXAMPLES / "send_event.sh"), api, "pay-2", PAYMENTS,
            "com.example.payment.succeeded", '{"order_id": "o-sh", "amount": 7}',
        ]  # fmt: skip
        answer = await execute(*script)
        assert answer["events"][0]["delivered_to"] == [runs["o-sh"]], answer

        results = {o: await rt.client.wait(run_id, 20) for o, run_id in runs.items()}
    assert {o: (r.status, r.output) for o, r in results.items()} == {
        "o-py": ("succeeded", {"order_id": "o-py", "approved_by": "ada", "amount": 129.5,
                               "paid_via": PAYMENTS}),
        "o-sh": ("succeeded", {"order_id": "o-sh", "approved_by": "ada", "amount": 7,
                               "paid_via": PAYMENTS}),
    }  # fmt: skip


@pytest.mark.skipif(
    not all(shutil.which(tool) for tool in ("bash", "curl", "openssl")),
    reason="needs bash, curl and openssl",
)
async def test_the_shell_sender_with_a_run_id_signs_it_and_a_policy_refuses_it() -> None:
    """The shell sender's optional run id is in its signature (so the request is
    authenticated) and the payment source may not address runs: 403, curl fails."""
    sources = EventSources.load(EXAMPLES / "sources.yaml", ENV)
    flow = yaml.safe_load((EXAMPLES / "order_payment.yaml").read_text())
    async with Runtime(workers=1) as rt, served(rt.client, sources) as http:
        await rt.client.register(flow)
        run_id = await rt.client.start("order-payment", {"order_id": "o-1"})
        await wait_until(rt, run_id, step_is("paid", "waiting"))
        before = await rt.client.history(run_id)
        sender = await asyncio.create_subprocess_exec(
            "bash", str(EXAMPLES / "send_event.sh"), str(http.base_url).rstrip("/"), "pay-3",
            PAYMENTS, "com.example.payment.succeeded", '{"order_id": "o-1"}', run_id,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env={**os.environ, **ENV},
        )  # fmt: skip
        out, _ = await sender.communicate()
        assert sender.returncode != 0
        problem = orjson.loads(out)
        assert problem["status"] == 403, problem
        assert [e["field"] for e in problem["errors"]] == ["header ce-tideflowrunid"]
        assert await rt.client.history(run_id) == before
