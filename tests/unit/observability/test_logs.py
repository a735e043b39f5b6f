"""Structured logs: JSON lines with the run, step, attempt and trace of engine and worker
activity, the console format, and redaction of credentials and secrets."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from typer.testing import CliRunner

from tideflow import logcontext
from tideflow.cli.main import app
from tideflow.observability.logs import REDACTED, configure
from tideflow.runtime.runtime import Runtime
from tideflow.worker.executors.functions import register, unregister
from tideflow.worker.secrets import EnvSecretProvider

step_log = logging.getLogger("tideflow.test.step")

FLOW = {
    "name": "logged",
    "version": "1",
    "steps": [
        {
            "id": "talk",
            "type": "python",
            "function": "logs.talk",
            "input": {"key": "{{ secrets.DB_PASSWORD }}"},
        }
    ],
}
SECRET = "s3cr3t-value-for-the-db"


@pytest.fixture(autouse=True)
def functions() -> Iterator[None]:
    @register("logs.talk")
    def talk(key: str) -> str:
        step_log.warning("connecting with %s", key)
        return "ok"

    yield
    unregister("logs.talk")


@pytest.fixture
def lines() -> Iterator[io.StringIO]:
    """Log records of the whole process as JSON lines into a buffer (restored after)."""
    root = logging.getLogger()
    level, before = root.level, list(root.handlers)
    buffer = io.StringIO()
    configure("info", "json", buffer, secrets=["env-secret-1234"])
    yield buffer
    for handler in list(root.handlers):
        if handler not in before:
            root.removeHandler(handler)
    root.setLevel(level)


def parsed(buffer: io.StringIO) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in buffer.getvalue().splitlines()]


async def test_a_worker_line_carries_run_step_attempt_and_trace_and_masks_the_secret(
    lines: io.StringIO,
) -> None:
    secrets = EnvSecretProvider({"TIDEFLOW_SECRET_DB_PASSWORD": SECRET})
    async with Runtime(workers=1, secrets=secrets) as rt:
        result = await rt.run(FLOW)
    assert result.status == "succeeded"
    (line,) = [entry for entry in parsed(lines) if entry["logger"] == "tideflow.test.step"]
    assert line["run_id"] == result.run_id
    assert (line["step_id"], line["attempt"]) == ("talk", 1)
    assert "trace_id" in line and line["trace_id"] is None  # until tracing sets it
    assert line["level"] == "warning"
    assert line["message"] == f"connecting with {REDACTED}"
    assert SECRET not in lines.getvalue()


async def test_an_engine_line_carries_its_run(lines: io.StringIO) -> None:
    def broken(state: Any, transitions: Any) -> None:
        raise RuntimeError("listener bug")

    async with Runtime(workers=1) as rt:
        rt.add_listener(broken)
        result = await rt.run({"name": "n", "version": "1", "steps": [{"id": "a", "type": "noop"}]})
    failures = [e for e in parsed(lines) if "listener" in e["message"]]
    assert failures and {e["run_id"] for e in failures} == {result.run_id}
    assert all("RuntimeError: listener bug" in e["exception"] for e in failures)


def test_credentials_are_redacted_in_messages_fields_and_tracebacks(lines: io.StringIO) -> None:
    token = "tf_0123456789abcdef_" + "A" * 43
    log = logging.getLogger("tideflow.test")
    log.info(
        "password=hunter2 and Authorization: Bearer abcdefgh12345678 with %s and env-secret-1234",
        token,
        extra={"token": "plain", "nested": {"api_key": "k-123", "ok": "visible"}, "count": 3},
    )
    try:
        raise ValueError(f"bad token {token}")
    except ValueError:
        log.exception("failed with client_secret: 'abc123'")
    text = lines.getvalue()
    for leaked in (
        "hunter2",
        "abcdefgh12345678",
        token,
        "env-secret-1234",
        "plain",
        "k-123",
        "abc123",
    ):
        assert leaked not in text, leaked
    first, second = parsed(lines)
    assert first["message"].startswith(f"password={REDACTED} and Authorization: ")
    assert first["token"] == REDACTED
    assert first["nested"] == {"api_key": REDACTED, "ok": "visible"}
    assert first["count"] == 3
    assert "ValueError: bad token tf_" in second["exception"]


def test_the_console_format_puts_the_context_on_the_line() -> None:
    root = logging.getLogger()
    level, before = root.level, list(root.handlers)
    buffer = io.StringIO()
    try:
        configure("debug", "console", buffer, secrets=[])
        with logcontext.about("run-1", "charge", 2):
            logging.getLogger("tideflow.test").debug("charging token=abc")
    finally:
        for handler in list(root.handlers):
            if handler not in before:
                root.removeHandler(handler)
        root.setLevel(level)
    text = buffer.getvalue()
    assert "DEBUG tideflow.test: charging token=" + REDACTED in text
    assert text.rstrip().endswith("[run=run-1 step=charge attempt=2]")


def test_auto_is_json_off_a_terminal(lines: io.StringIO) -> None:
    root = logging.getLogger()
    buffer = io.StringIO()
    handler = configure("info", "auto", buffer, secrets=[])
    try:
        logging.getLogger("tideflow.test").info("hello")
    finally:
        root.removeHandler(handler)
    assert orjson.loads(buffer.getvalue())["message"] == "hello"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--log-format", "xml"], "--log-format xml: choose json, console or auto"),
        (["--log-level", "loud"], "--log-level loud: choose one of debug, info"),
    ],
)
def test_a_bad_log_option_is_a_usage_error(args: list[str], message: str, tmp_path: Any) -> None:
    flow = tmp_path / "flow.yaml"
    flow.write_text("name: f\nversion: '1'\nsteps: [{id: a, type: noop}]\n")
    result = CliRunner().invoke(app, ["run", str(flow), "--store", "memory://", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output


@pytest.mark.parametrize(
    ("address", "message"),
    [
        ("nowhere", "--metrics nowhere: give HOST:PORT, such as 127.0.0.1:9464"),
        ("127.0.0.1:99999", "give HOST:PORT"),
    ],
)
def test_a_bad_worker_metrics_address_is_a_usage_error(address: str, message: str) -> None:
    args = ["worker", "--bus", "redis://127.0.0.1:6379/0", "--metrics", address]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_a_worker_metrics_port_in_use_is_a_usage_error() -> None:
    import socket

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        result = CliRunner().invoke(app, ["worker", "--bus", "redis://x:1/0", "--metrics", address])
    finally:
        taken.close()
    assert result.exit_code == 2, result.output
    assert f"--metrics {address}: cannot listen there" in result.output


def test_lines_go_to_stderr_as_it_is_when_they_are_written(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A command run in-process (CliRunner) swaps sys.stderr and closes its buffer after:
    the handler made then must not keep writing to that closed buffer."""
    root = logging.getLogger()
    level, before = root.level, list(root.handlers)
    first, second = io.StringIO(), io.StringIO()
    try:
        monkeypatch.setattr("sys.stderr", first)
        configure("info", "json", secrets=[])
        first.close()
        monkeypatch.setattr("sys.stderr", second)
        logging.getLogger("tideflow.test").info("after the swap")
    finally:
        for handler in list(root.handlers):
            if handler not in before:
                root.removeHandler(handler)
        root.setLevel(level)
    assert orjson.loads(second.getvalue())["message"] == "after the swap"
