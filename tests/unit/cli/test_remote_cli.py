"""`--server URL --token TOKEN`: the CLI against a real `tideflow server --embedded --http`
process (uvicorn on a free loopback port, a SQLite store, a real admin token), through
typer's runner and as a real `tideflow` process."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner, Result

from tideflow.cli.common import DEFAULT_STORE
from tideflow.cli.main import app

WAITING = textwrap.dedent(
    """
    name: waiting
    version: "1"
    steps:
      - {id: ask, type: wait, signal: go, match: "{{ signal.ok == true }}", timeout: 1h}
      - {id: after, type: noop, depends_on: [ask]}
    output: "{{ steps.ask.output }}"
    """
)
TIDEFLOW = [sys.executable, "-m", "tideflow.cli.main"]


@dataclass
class Server:
    url: str
    admin: str
    viewer: str
    store: str


def _tool(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*TIDEFLOW, *args], capture_output=True, text=True, timeout=60, env=env, check=False
    )


def _token(store: str, role: str) -> str:
    made = _tool("tokens", "create", "--name", role, "--role", role, "--json", "--store", store)
    assert made.returncode == 0, made.stderr
    return str(json.loads(made.stdout)["token"])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    where = tmp_path_factory.mktemp("remote")
    store = f"sqlite:///{where / 'served.db'}"
    log = where / "server.log"
    admin, viewer = _token(store, "admin"), _token(store, "viewer")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [*TIDEFLOW, "server", "--embedded", "--store", store, "--http", f"127.0.0.1:{port}"]
    with log.open("w") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, log.read_text()
            try:
                if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the server did not get ready in 60 s"
            time.sleep(0.1)
        yield Server(url, admin, viewer, store)
    finally:
        process.terminate()
        process.wait(timeout=30)


def invoke(server: Server, *args: str, token: str | None = None) -> Result:
    env = {"TIDEFLOW_SERVER": server.url, "TIDEFLOW_TOKEN": token or server.admin}
    return CliRunner().invoke(app, list(args), env=env)


def test_runs_and_definitions_over_http(server: Server, tmp_path: Path) -> None:
    flow = tmp_path / "waiting.yaml"
    flow.write_text(WAITING)
    registered = invoke(server, "definitions", "register", str(flow))
    assert registered.exit_code == 0, registered.output
    assert "waiting 1" in registered.stdout
    listed = invoke(server, "definitions", "list", "--json")
    assert [d["name"] for d in json.loads(listed.stdout)["definitions"]] == ["waiting"]
    shown = invoke(server, "definitions", "show", "waiting", "--json")
    assert json.loads(shown.stdout)["name"] == "waiting"

    started = invoke(server, "runs", "start", "waiting", "--json")
    assert started.exit_code == 0, started.output
    run_id = json.loads(started.stdout)["run_id"]
    show = invoke(server, "runs", "show", run_id, "--json")
    assert show.exit_code == 0, show.output
    assert json.loads(show.stdout)["run_id"] == run_id
    why = invoke(server, "runs", "why", run_id, "--json")  # the server's engine is live
    assert why.exit_code == 0, why.output
    kinds = {r["kind"] for r in json.loads(why.stdout)["reasons"]}
    assert kinds & {"not_started", "waiting_for_signal"}, kinds
    for _ in range(200):  # until the server has the run at its wait: then the views agree
        remote = json.loads(invoke(server, "runs", "show", run_id, "--json").stdout)
        if remote["steps"].get("ask", {}).get("status") == "waiting":
            break
        time.sleep(0.05)
    local = json.loads(_tool("runs", "show", run_id, "--json", "--store", server.store).stdout)
    assert remote["steps"]["ask"]["waiting_for"] == local["steps"]["ask"]["waiting_for"]
    assert remote["steps"]["ask"]["waiting_for"]["match"] == "signal.ok == true"
    assert "timeout_at" in remote["steps"]["ask"]["waiting_for"]
    signalled = invoke(server, "runs", "signal", run_id, "go", "-p", '{"ok": true}')
    assert signalled.exit_code == 0, signalled.output
    assert f"sent to run {run_id}" in signalled.stderr
    waited = invoke(server, "runs", "wait", run_id, "--timeout", "60", "--json")
    assert waited.exit_code == 0, waited.output
    assert json.loads(waited.stdout)["output"] == {"ok": True}
    ended_why = invoke(server, "runs", "why", run_id)
    assert ended_why.exit_code == 0 and "the run has ended: succeeded" in ended_why.stdout
    runs = json.loads(invoke(server, "runs", "list", "--json").stdout)["runs"]
    assert run_id in [r["run_id"] for r in runs]
    history = json.loads(invoke(server, "runs", "history", run_id, "--json").stdout)
    assert history["events"][0]["kind"] == "run_started"
    ended = invoke(server, "runs", "cancel", run_id)
    assert ended.exit_code == 1 and "already ended" in ended.stderr
    assert invoke(server, "runs", "retry", run_id).exit_code == 1
    off = invoke(server, "definitions", "deactivate", "waiting", "1")
    assert off.exit_code == 0 and "deactivated" in off.stdout
    refused = invoke(server, "runs", "start", "waiting")
    assert refused.exit_code == 2 and "deactivated" in refused.stderr
    assert invoke(server, "definitions", "activate", "waiting", "1").exit_code == 0
    unknown = invoke(server, "runs", "show", "nope")
    assert unknown.exit_code == 2 and "nope" in unknown.stderr


def test_refusals_exit_2_saying_what_the_server_said(server: Server) -> None:
    viewer = invoke(server, "runs", "start", "waiting", token=server.viewer)
    assert viewer.exit_code == 2 and "may not start" in viewer.stderr
    stranger = invoke(server, "runs", "list", token="tf_0000_nope")
    assert stranger.exit_code == 2 and "Bearer" in stranger.stderr
    both = invoke(server, "runs", "list", "--store", server.store)
    assert both.exit_code == 2 and "leave out --store" in both.stderr
    default = invoke(server, "definitions", "list", "--store", DEFAULT_STORE)
    assert default.exit_code == 2 and "leave out --store" in default.stderr  # typed, so refused
    bus = invoke(server, "queues", "--bus", "redis://127.0.0.1:1/0")
    assert bus.exit_code == 2 and "leave out --bus" in bus.stderr


def test_a_file_is_registered_from_here_or_the_user_is_told_how(
    server: Server, tmp_path: Path
) -> None:
    """The server starts workflows by name only: `runs start FILE --server` reads the file
    here and registers it first, which needs a token that may register."""
    flow = tmp_path / "named-here.yaml"
    flow.write_text('name: named-here\nversion: "1"\nsteps: [{id: a, type: noop}]\n')
    refused = invoke(server, "runs", "start", str(flow), token=server.viewer)
    assert refused.exit_code == 2
    assert "may not" in refused.stderr
    assert "tideflow definitions register FILE --server URL" in refused.stderr
    missing = invoke(server, "runs", "start", str(tmp_path / "missing.yaml"))
    assert missing.exit_code == 2 and "missing.yaml" in missing.stderr
    listed = json.loads(invoke(server, "definitions", "list", "--json").stdout)["definitions"]
    assert "named-here" not in [d["name"] for d in listed]
    started = invoke(server, "runs", "start", str(flow), "--json")
    assert started.exit_code == 0, started.output
    assert json.loads(started.stdout)["workflow"] == "named-here"


def test_a_real_process_starts_and_waits_for_a_run(server: Server, tmp_path: Path) -> None:
    flow = tmp_path / "hello.yaml"
    flow.write_text('name: hello\nversion: "1"\nsteps: [{id: a, type: noop}]\n')
    env = {**os.environ, "TIDEFLOW_TOKEN": server.admin}
    env.pop("TIDEFLOW_STORE", None)
    done = _tool("runs", "start", str(flow), "--server", server.url, "--wait", "--json", env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "succeeded"
    queues = _tool("queues", "--server", server.url, "--json", env=env)
    assert queues.returncode == 0, queues.stderr
    assert "queues" in json.loads(queues.stdout)


DOC = Path(__file__).resolve().parents[3] / "docs" / "api.md"


@pytest.mark.skipif(not shutil.which("jq"), reason="needs jq")
def test_the_cli_examples_of_the_docs_run(server: Server, tmp_path: Path) -> None:
    section = DOC.read_text().split("## From Python and the CLI", 1)[1]
    script = section.split("```sh\n", 1)[1].split("```", 1)[0]
    assert script.count("sqlite:///tideflow.db") == 1
    assert script.count("http://127.0.0.1:8080") == 1
    script = script.replace("sqlite:///tideflow.db", server.store)
    script = script.replace("http://127.0.0.1:8080", server.url)
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    env = {**os.environ, "PATH": path}
    for name in ("TIDEFLOW_STORE", "TIDEFLOW_BUS"):
        env.pop(name, None)
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert '"ok": true' in done.stdout or '"ok":true' in done.stdout
    assert "signal_received" in done.stdout.splitlines()
