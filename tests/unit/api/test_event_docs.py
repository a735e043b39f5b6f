"""docs/events.md as it is: its sources file loads, its Python signing agrees with the
server's, and its curl examples run against a served API."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from tideflow.api.auth import issue_token
from tideflow.api.event_sources import EventSources, sign_v2
from tideflow.model.tokens import Role
from tideflow.runtime.runtime import Runtime

from .conftest import served
from .test_docs import responses

DOC = Path(__file__).resolve().parents[3] / "docs" / "events.md"
ENV = {
    "APPROVALS_TOKEN": "approvals-0123456789abcdef",
    "PAY_WEBHOOK_SECRET": "whsec-0123456789abcdef0123",
}


def block(section: str, language: str) -> str:
    text = DOC.read_text().split(f"\n## {section}\n", 1)[1]
    return text.split(f"```{language}\n", 1)[1].split("```", 1)[0]


def test_the_sources_file_of_the_docs_loads() -> None:
    sources = EventSources.of(yaml.safe_load(block("Sources", "yaml")), ENV)
    assert [r.auth for r in sources.rules] == ["hmac", "bearer"]
    assert [(r.types, r.address_runs) for r in sources.rules] == [
        (("com.example.payment.*",), False),
        (("com.example.order.approved",), True),
    ]
    assert sources.rule_for("urn:approvals:desk") is sources.rules[1]


def test_the_python_signing_of_the_docs_is_the_servers() -> None:
    code = DOC.read_text().split("Signing in Python (v2", 1)[1].split("```python\n", 1)[1]
    scope: dict[str, Any] = {}
    exec(code.split("```", 1)[0], scope)
    sent = {"content-type": "application/json", "ce-type": "t", "ce-id": "1", "ce-source": "s"}
    headers = scope["signed_headers"]("s" * 16, sent, b'{"id": "1"}')
    assert headers["x-tideflow-signature"] == sign_v2(
        "s" * 16, headers["x-tideflow-timestamp"], "POST", "/events", sent.items(), b'{"id": "1"}'
    )


@pytest.mark.skipif(
    not all(shutil.which(tool) for tool in ("curl", "jq", "openssl")),
    reason="needs curl, jq and openssl",
)
async def test_the_curl_examples_run() -> None:
    sources = EventSources.of(yaml.safe_load(block("Sources", "yaml")), ENV)
    async with Runtime(workers=1) as rt, served(rt.client, sources) as api:
        admin = await issue_token(rt.client.store, name="docs", role=Role.ADMIN, now=0.0)
        script = block("Examples", "sh").replace("API=http://127.0.0.1:8080", f"API={api.base_url}")
        assert "API=http://127.0.0.1:8080" not in script
        shell = await asyncio.create_subprocess_exec(
            "bash", "-euo", "pipefail", "-c", script,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, **ENV, "TOKEN": admin.value},
        )  # fmt: skip
        out, err = await shell.communicate()
        assert shell.returncode == 0, err.decode()
        (run,) = (await rt.client.list()).runs
        result = await rt.client.wait(run.run_id, 10)
    assert (result.status, result.output) == ("succeeded", {"approved_by": "ada", "amount": 129.5})
    bodies = responses(out.decode())
    outcomes = [b["events"][0]["status"] for b in bodies if "events" in b]
    assert outcomes == ["delivered", "delivered", "duplicate"]  # the redelivery
    problems = [b for b in bodies if str(b.get("type", "")).startswith("urn:")]
    assert [p["status"] for p in problems] == [401, 401, 403, 400]
    assert [e["field"] for e in problems[2]["errors"]] == ["body.type"]
    assert {e["field"] for e in problems[3]["errors"]} == {"body.id", "body.specversion"}
    assert bodies[-1] == {"status": "succeeded", "output": result.output}
