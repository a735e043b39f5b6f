"""Executors inside real workflow runs (embedded runtime): retries, plugins, secrets."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest

from tideflow import Runtime
from tideflow.worker.executors.emit_sink import WebhookSink, verify_signature
from tideflow.worker.secrets import EnvSecretProvider

from .conftest import LocalServer

SECRET = "tok-9f8e7d6c5b4a"


# Tests list http_server before runtime: the runtime (and its pooled connections) must
# close before the server waits for its connection threads.
@pytest.fixture
async def runtime() -> AsyncIterator[Runtime]:
    secrets = EnvSecretProvider({"TIDEFLOW_SECRET_API_TOKEN": SECRET})
    async with Runtime(secrets=secrets) as rt:
        yield rt


def _http_flow(url: str, max_attempts: int = 3) -> str:
    return f"""
name: call
version: "1"
steps:
  - id: call
    type: http
    url: "{url}"
    timeout: 5s
    retry: {{max_attempts: {max_attempts}, backoff: fixed, initial_delay: 10ms}}
output: "{{{{ steps.call.output.body }}}}"
"""


async def test_a_workflow_uses_the_example_plugin(runtime: Runtime) -> None:
    plan = await runtime.register(
        """
name: plugin-demo
version: "1"
steps:
  - {id: shout, type: echo_upper, config: {text: hello}}
  - id: again
    type: echo_upper
    depends_on: [shout]
    input: {greeting: "{{ steps.shout.output }} there"}
output: "{{ steps.again.output.greeting }}"
"""
    )
    result = await runtime.run(plan, {})
    assert result.status == "succeeded", result.error
    assert result.output == "HELLO THERE"


async def test_server_errors_are_retried_with_one_idempotency_key(
    http_server: LocalServer, runtime: Runtime
) -> None:
    plan = await runtime.register(_http_flow(f"{http_server.url}/flaky"))
    result = await runtime.run(plan, {})
    assert result.status == "succeeded", result.error
    assert result.steps["call"].attempts == 2
    assert result.output == {"done": True}
    keys = {r["headers"]["idempotency-key"] for r in http_server.state.requests}
    assert len(keys) == 1


async def test_client_errors_are_not_retried(http_server: LocalServer, runtime: Runtime) -> None:
    plan = await runtime.register(_http_flow(f"{http_server.url}/status/400"))
    result = await runtime.run(plan, {})
    assert result.status == "failed"
    assert result.steps["call"].attempts == 1
    assert result.steps["call"].error is not None
    assert result.steps["call"].error["type"] == "HttpClientError"


async def test_rate_limits_are_retried_after_retry_after(
    http_server: LocalServer, runtime: Runtime
) -> None:
    plan = await runtime.register(_http_flow(f"{http_server.url}/status/429?retry_after=1", 2))
    started = time.monotonic()
    result = await runtime.run(plan, {})
    assert result.status == "failed"
    assert result.steps["call"].attempts == 2
    assert result.steps["call"].error is not None
    assert result.steps["call"].error["type"] == "HttpRateLimited"
    assert time.monotonic() - started >= 1.0  # the server's Retry-After, not the 10ms backoff


async def test_secrets_never_reach_results_history_or_logs(
    http_server: LocalServer, runtime: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    plan = await runtime.register(
        f"""
name: secret-demo
version: "1"
steps:
  - id: call
    type: http
    url: "{http_server.url}/echo"
    headers: {{Authorization: "Bearer {{{{ secrets.API_TOKEN }}}}"}}
  - id: fail
    type: http
    depends_on: [call]
    url: "{http_server.url}/status/400?token={{{{ secrets.API_TOKEN }}}}"
output: "{{{{ steps.call.output.body.headers }}}}"
"""
    )
    result = await runtime.run(plan, {})
    assert http_server.state.requests[0]["headers"]["authorization"] == f"Bearer {SECRET}"
    assert result.steps["call"].status == "succeeded"
    assert (
        result.steps["call"].output["body"]["headers"]["authorization"] == "***"
    )  # a credential key: masked whole (model/masking.py)
    assert result.steps["fail"].error is not None
    assert "token=***" in result.steps["fail"].error["message"]
    history = await runtime.store.history(result.run_id)
    recorded = orjson.dumps(result.to_dict()) + repr(history).encode()
    assert SECRET.encode() not in recorded
    assert SECRET not in caplog.text


async def test_emitted_events_reach_a_signed_webhook(
    http_server: LocalServer, runtime: Runtime
) -> None:
    sink = WebhookSink(f"{http_server.url}/echo", "hook-secret")
    runtime.add_event_sink(sink)
    plan = await runtime.register(
        """
name: emitter
version: "1"
steps:
  - id: announce
    type: emit
    event: {type: order.shipped, source: shop, data: {order: "{{ inputs.order }}"}}
"""
    )
    try:
        result = await runtime.run(plan, {"order": "A-1"})
    finally:
        await sink.aclose()
    assert result.status == "succeeded", result.error
    [request] = http_server.state.requests
    event = orjson.loads(request["body"])
    assert event["specversion"] == "1.0"
    assert event["type"] == "order.shipped"
    assert event["data"] == {"order": "A-1"}
    assert request["headers"]["content-type"] == "application/cloudevents+json"
    assert verify_signature(
        request["body"], request["headers"]["x-tideflow-signature"], "hook-secret"
    )


def test_the_cli_delivers_emitted_events_to_configured_webhooks(
    http_server: LocalServer, tmp_path: Path
) -> None:
    flow = tmp_path / "announce.yaml"
    flow.write_text(
        "name: announce\nversion: '1'\n"
        "steps: [{id: e, type: emit, event: {type: order.shipped, data: {id: 7}}}]\n"
    )
    env = {
        **os.environ,
        "TIDEFLOW_EVENT_SINKS": f"{http_server.url}/echo",
        "TIDEFLOW_EVENT_SINK_SECRET": "cli-secret",
    }
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tideflow.cli.main",
            "run",
            str(flow),
            "--json",
            "--store",
            "memory://",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    (request,) = http_server.state.requests
    assert request["headers"]["content-type"] == "application/cloudevents+json"
    assert verify_signature(
        request["body"], request["headers"]["x-tideflow-signature"], "cli-secret"
    )
    assert orjson.loads(request["body"])["type"] == "order.shipped"
    unsigned = subprocess.run(
        [sys.executable, "-m", "tideflow.cli.main", "run", str(flow), "--store", "memory://"],
        env={**env, "TIDEFLOW_EVENT_SINK_SECRET": ""},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert unsigned.returncode == 2
    assert "TIDEFLOW_EVENT_SINK_SECRET" in unsigned.stderr
