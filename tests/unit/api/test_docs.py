"""The curl examples of docs/api.md run as they are against a served API on a SQLite
store, their tokens made by the real `tideflow tokens create` on that store."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import sys
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from tideflow.api import create_app
from tideflow.runtime.runtime import Runtime

DOC = Path(__file__).resolve().parents[3] / "docs" / "api.md"


def examples() -> str:
    return DOC.read_text().split("## Examples", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]


def responses(output: str) -> list[dict[str, Any]]:
    decoder, found, at = json.JSONDecoder(), [], 0
    while at < len(output):
        if output[at].isspace():
            at += 1
            continue
        value, at = decoder.raw_decode(output, at)
        found.append(value)
    return found


@pytest.mark.skipif(not (shutil.which("curl") and shutil.which("jq")), reason="needs curl and jq")
async def test_the_curl_examples_run(tmp_path: Path) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    store = f"sqlite:///{tmp_path / 'docs.db'}"
    script = examples().replace("API=http://127.0.0.1:8080", f"API=http://127.0.0.1:{port}")
    assert script.count("sqlite:///tideflow.db") == 2
    script = script.replace("sqlite:///tideflow.db", store)
    # the `tideflow` of the environment the tests run in
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    async with Runtime(store=store, workers=1) as rt:
        server = uvicorn.Server(uvicorn.Config(create_app(rt.client), log_config=None))
        serving = asyncio.create_task(server.serve(sockets=[listener]))
        try:
            shell = await asyncio.create_subprocess_exec(
                "bash", "-euo", "pipefail", "-c", script,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env={**os.environ, "PATH": path},
            )  # fmt: skip
            out, err = await shell.communicate()
            assert shell.returncode == 0, err.decode()
            (run,) = (await rt.client.list()).runs
            result = await rt.client.wait(run.run_id, 10)
            tokens = await rt.client.store.list_tokens()
        finally:
            server.should_exit = True
            await serving
            listener.close()
    assert (result.status, result.output) == ("succeeded", {"approved": True})
    bodies = responses(out.decode())
    assert bodies[0] == {"status": "ok"}
    problems = [b["type"] for b in bodies if str(b.get("type", "")).startswith("urn:")]
    assert problems == [
        "urn:tideflow:problem:unauthenticated",
        "urn:tideflow:problem:run-not-retryable",
        "urn:tideflow:problem:input-invalid",
        "urn:tideflow:problem:forbidden",
        "urn:tideflow:problem:unsupported-media-type",  # a cancel with no Content-Type
    ]
    assert bodies[-3]["errors"][0]["field"] == "body.input"
    assert "needs role operator" in bodies[-2]["detail"]
    assert "Content-Type: application/json" in bodies[-1]["detail"]
    assert sorted(t.role for t in tokens) == ["admin", "viewer"]
