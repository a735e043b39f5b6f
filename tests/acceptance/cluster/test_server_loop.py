"""No request stalls a real `tideflow server --embedded --http` (docs/security.md, "Requests
cannot stall the server"): ``/health`` answers within a second while a 1 MB definition
compiles (in the server's compiler processes, not on its event loop), a catastrophic
input pattern is answered at once with a 422 (RE2), and a compile past the server's time
bound is a 422 naming the limit while the server goes on serving. The server is a real
process, so a stalled loop shows as a client time-out, not as a hung test."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from harness import TIDEFLOW, Proc, eventually  # noqa: E402

pytestmark = [pytest.mark.timeout(300)]

SMALL = {"name": "small", "version": "1", "steps": [{"id": "a", "type": "noop"}]}
EVIL = {
    "name": "evil-pattern",
    "version": "1",
    "input": {
        "type": "object",
        "required": ["text"],
        "properties": {"text": {"type": "string", "pattern": "^(a+)+$"}},
    },
    "steps": [{"id": "a", "type": "noop"}],
}


def big_definition(steps: int) -> bytes:
    """About 130 bytes of JSON per step: 7,600 steps is just under 1 MiB."""
    return json.dumps(
        {
            "name": "big",
            "version": "1",
            "steps": [
                {
                    "id": f"s{i}",
                    "type": "set",
                    "values": {
                        "x": f"{{{{ inputs.a + {i} }}}}",
                        "t": f"text {i} {{{{ inputs.b }}}}",
                    },
                    **({"depends_on": [f"s{i - 1}"]} if i else {}),
                }
                for i in range(steps)
            ],
        }
    ).encode()


def environment(**env: str) -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TIDEFLOW_")}
    return {**environ, **env}


def serve(tmp: Path, **env: str) -> Iterator[str]:
    environ = environment(**env)
    log = tmp / "server.log"
    with log.open("wb") as out:
        popen = subprocess.Popen(
            [TIDEFLOW, "server", "--embedded", "--http", "127.0.0.1:0", "--no-auth",
             "--max-body", "4MiB"],
            env=environ, stdout=out, stderr=subprocess.STDOUT, cwd=tmp,
        )  # fmt: skip
    proc = Proc("server", popen, log)
    try:
        proc.wait_log("HTTP API listening on", timeout=60)
        found = re.search(r"HTTP API listening on (http://127\.0\.0\.1:\d+)", proc.text())
        assert found, proc.text()
        base = found.group(1)
        with httpx.Client(base_url=base, timeout=60) as api:
            # ready once a compiler process answers (they start with the server)
            eventually(
                lambda: api.post("/definitions/validate", json=SMALL).status_code == 200,
                "a compiler process is ready",
                timeout=60,
            )
        yield base
    finally:
        try:
            assert proc.term(60) == 0, proc.text()[-4000:]
        finally:
            if proc.popen.poll() is None:  # a stalled loop does not stop on SIGTERM
                proc.kill()


BOUNDS = {
    "TIDEFLOW_COMPILE_TIMEOUT": "600",  # the machine may be slow: these compiles must end
    "TIDEFLOW_COMPILE_WORKERS": "1",
}


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("loop")


@pytest.fixture(scope="module")
def server(home: Path) -> Iterator[str]:
    yield from serve(home, **BOUNDS)


@pytest.fixture(scope="module")
def token(home: Path, server: str) -> str:
    """An operator token of the server's store (events come from API tokens)."""
    made = subprocess.run(
        [TIDEFLOW, "tokens", "create", "--name", "events", "--role", "operator"],
        env=environment(**BOUNDS), cwd=home, capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    return made.stdout.strip()


def health_while(base: str, request: dict[str, Any]) -> tuple[httpx.Response, list[float]]:
    """Send ``request`` and, until it is answered, ask ``/health`` (every 50 ms): the
    answer, and how long each ``/health`` took."""
    answer: list[httpx.Response] = []

    def send() -> None:
        with httpx.Client(base_url=base, timeout=600) as api:
            answer.append(api.request(**request))

    sender = threading.Thread(target=send)
    sender.start()
    took: list[float] = []
    with httpx.Client(base_url=base, timeout=30) as api:
        while sender.is_alive():
            started = time.monotonic()
            assert api.get("/health").status_code == 200
            took.append(time.monotonic() - started)
            sender.join(0.05)  # paces the polls; returns at once when the request is done
    assert answer, "the request was not answered"
    return answer[0], took


def test_health_answers_within_a_second_while_a_1_mb_definition_compiles(server: str) -> None:
    body = big_definition(7600)
    assert 950_000 < len(body) < 1 << 20
    headers = {"content-type": "application/json"}
    for path, status in (("/definitions/validate", 200), ("/definitions", 201)):
        request = {"method": "POST", "url": path, "content": body, "headers": headers}
        answer, took = health_while(server, request)
        assert answer.status_code == status, answer.text[:2000]
        assert len(answer.json()["steps"]) == 7600
        assert max(took) < 1.0, f"{path}: /health took {max(took):.2f}s while it compiled"
        assert len(took) >= 3, "the definition compiled before /health was asked"
    with httpx.Client(base_url=server, timeout=60) as api:
        started = api.post("/runs", json={"workflow": "big", "input": {"a": 1, "b": "x"}})
        assert started.status_code == 201, started.text


def test_a_catastrophic_input_pattern_is_answered_at_once_with_a_422(server: str) -> None:
    """On Python's ``re`` this input holds the server's loop for ages: the client's
    time-out ends the test."""
    with httpx.Client(base_url=server, timeout=30) as api:
        assert api.post("/definitions", json=EVIL).status_code == 201
        refused = api.post(
            "/runs", json={"workflow": "evil-pattern", "input": {"text": "a" * 40 + "!"}}
        )
        assert refused.status_code == 422, refused.text
        problem = refused.json()
        assert problem["type"] == "urn:tideflow:problem:input-invalid"
        assert "does not match '^(a+)+$'" in problem["detail"]
        assert api.get("/health").status_code == 200
        fine = api.post("/runs", json={"workflow": "evil-pattern", "input": {"text": "aaaa"}})
        assert fine.status_code == 201, fine.text


def test_an_event_that_starts_a_run_with_a_catastrophic_input_is_answered_at_once(
    server: str, token: str
) -> None:
    """The trigger's input (the event's data) is checked against the pattern as the
    gateway answers: on Python's ``re`` the answer would never come."""
    flow = {**EVIL, "name": "evil-trigger", "triggers": [{"event": "evil.text"}]}
    event = {
        "specversion": "1.0",
        "id": "evil-1",
        "source": "urn:test:loop",
        "type": "evil.text",
        "data": {"text": "a" * 40 + "!"},
    }
    with httpx.Client(base_url=server, timeout=30) as api:
        assert api.post("/definitions", json=flow).status_code == 201
        sent = api.post(
            "/events",
            json=event,
            headers={
                "authorization": f"Bearer {token}",
                "content-type": "application/cloudevents+json",
            },
        )
        assert sent.status_code == 202, sent.text
        assert sent.json()["events"][0]["started"] == []
        assert api.get("/health").status_code == 200
        runs = api.get("/runs", params={"workflow": "evil-trigger"}).json()["runs"]
        assert runs == []  # its input was refused: no run


def test_a_backreference_in_an_input_pattern_is_a_clear_422(server: str) -> None:
    flow = {**EVIL, "name": "twice"}
    flow["input"] = {"type": "string", "pattern": r"^(ab)\1$"}
    with httpx.Client(base_url=server, timeout=30) as api:
        refused = api.post("/definitions", json=flow)
    assert refused.status_code == 422, refused.text
    (field,) = refused.json()["errors"]
    assert field["field"] == "body.input.pattern"
    assert "'^(ab)\\\\1$' is refused by RE2: invalid escape sequence" in field["message"]
    assert "backreferences" in field["hint"]


def test_a_compile_past_the_time_bound_is_a_422_and_the_server_serves_on(
    tmp_path: Path,
) -> None:
    """A 2 MB definition takes seconds to compile; the bound is one second."""
    for base in serve(tmp_path, TIDEFLOW_COMPILE_TIMEOUT="1", TIDEFLOW_COMPILE_WORKERS="1"):
        with httpx.Client(base_url=base, timeout=60) as api:
            slow = api.post(
                "/definitions",
                content=big_definition(15_000),
                headers={"content-type": "application/json"},
            )
            assert slow.status_code == 422, slow.text[:2000]
            (field,) = slow.json()["errors"]
            assert "took longer than 1 s, the server's limit" in field["message"]
            assert "TIDEFLOW_COMPILE_TIMEOUT" in field["hint"]
            assert api.get("/health").status_code == 200
            assert api.get("/definitions").json() == {"definitions": []}
            # its process was killed; a fresh one takes the next definition
            eventually(
                lambda: api.post("/definitions", json=SMALL).status_code == 201,
                "a fresh compiler process registers a definition",
                timeout=60,
            )
            run = api.post("/runs", json={"workflow": "small"})
            assert run.status_code == 201, run.text
