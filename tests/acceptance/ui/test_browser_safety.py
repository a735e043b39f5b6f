"""A real `tideflow server --embedded --no-auth --http 127.0.0.1:0` against what a browser
can be made to send (docs/security.md, "Browsers: CSRF and DNS rebinding"): a foreign
Host is refused and its own are answered; in headless Chromium, a page of another
origin that posts to it (a no-cors ``fetch``, a ``text/plain`` form) and a page whose
name is made to resolve to 127.0.0.1 (DNS rebinding, through Chromium's
``--host-resolver-rules``) change nothing; /docs and /redoc render without one request
off the server."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.acceptance.ui.conftest import Served, serve

pytestmark = pytest.mark.slow

WAITING = {
    "name": "waiting",
    "version": "1",
    "steps": [{"id": "ask", "type": "wait", "signal": "go"}],
}
ATTACK = {
    "name": "attack",
    "version": "1",
    "schedule": {"every": "1m"},
    "steps": [{"id": "own", "type": "shell", "command": ["echo", "owned"]}],
}
JSON_TYPE = {"content-type": "application/json"}
DEADLINE = 30.0


@pytest.fixture
def no_auth(tmp_path: Path) -> Iterator[tuple[Served, str, str]]:
    """The server, its base URL (``http://127.0.0.1:PORT``) and a run of ``waiting``
    waiting for its signal."""
    store = f"sqlite:///{tmp_path / 'server.db'}"
    served = serve(
        "server", "--embedded", "--no-auth", "--store", store,
        "--http", "127.0.0.1:0", "--allowed-host", "tideflow.test",
    )  # fmt: skip
    try:
        line = served.line_with("HTTP API listening on ")
        base = line.split("listening on ", 1)[1].split(" ", 1)[0]
        with httpx.Client(base_url=base, timeout=10) as api:
            assert api.post("/definitions", json=WAITING).status_code == 201
            run_id = api.post("/runs", json={"workflow": "waiting"}).json()["run_id"]
            waiting = until(lambda: steps(api, run_id).get("ask") == "waiting")
            assert waiting, steps(api, run_id)
        yield served, base, run_id
    finally:
        served.stop()


def until(condition: Any, timeout: float = DEADLINE) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def steps(api: httpx.Client, run_id: str) -> dict[str, str]:
    run = api.get(f"/runs/{run_id}").json()
    return {key: step["status"] for key, step in run["steps"].items()}


def state(base: str, run_id: str) -> tuple[object, ...]:
    with httpx.Client(base_url=base, timeout=10) as api:
        run = api.get(f"/runs/{run_id}").json()
        definitions = api.get("/definitions").json()["definitions"]
        history = api.get(f"/runs/{run_id}/history").json()["entries"]
    return run["status"], len(history), [(d["name"], d["active"]) for d in definitions]


def test_the_server_answers_its_own_hosts_and_refuses_others(
    no_auth: tuple[Served, str, str],
) -> None:
    served, base, run_id = no_auth
    port = base.rsplit(":", 1)[1]
    assert "answers to the hosts 127.0.0.1, ::1, localhost, tideflow.test" in "".join(served.log)
    before = state(base, run_id)
    with httpx.Client(base_url=base, timeout=10) as api:
        for host in (f"evil.example:{port}", "evil.example", f"127.0.0.2:{port}"):
            refused = api.post(f"/runs/{run_id}/cancel", headers={**JSON_TYPE, "host": host})
            assert refused.status_code == 421, (host, refused.text)
            assert refused.json()["type"] == "urn:tideflow:problem:host-not-allowed"
            assert api.get("/runs", headers={"host": host}).status_code == 421
        for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"tideflow.test:{port}"):
            assert api.get("/runs", headers={"host": host}).status_code == 200, host
        untyped = api.post(f"/runs/{run_id}/cancel")
        assert untyped.status_code == 415, untyped.text
    assert state(base, run_id) == before == ("running", before[1], [("waiting", True)])


def test_a_page_of_another_site_cannot_drive_it(
    chromium: str, no_auth: tuple[Served, str, str]
) -> None:
    from playwright.sync_api import sync_playwright

    _, base, run_id = no_auth
    port = base.rsplit(":", 1)[1]
    before = state(base, run_id)
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=chromium,
            args=[
                "--no-sandbox",
                "--disable-dev-shm-usage",
                # DNS rebinding: evil.example now resolves to this machine
                "--host-resolver-rules=MAP evil.example 127.0.0.1",
            ],
        )
        try:
            page = browser.new_page()
            # another origin than the server's (both on loopback, so that Chromium's
            # private network rules do not stop the requests before they are sent)
            page.goto(f"http://localhost:{port}/health")
            sent = page.evaluate(
                """async ([base, runId, attack]) => {
                  const opaque = { mode: "no-cors", method: "POST" };
                  await fetch(`${base}/runs/${runId}/cancel`, opaque);
                  await fetch(`${base}/runs/${runId}/retry`, opaque);
                  await fetch(`${base}/definitions`, { ...opaque, body: JSON.stringify(attack) });
                  // a JSON type is not one no-cors may send: the browser drops it
                  await fetch(`${base}/definitions`, { ...opaque, body: JSON.stringify(attack),
                    headers: { "Content-Type": "application/json" } });
                  const form = document.createElement("form");
                  form.method = "POST";
                  form.enctype = "text/plain";
                  form.action = `${base}/definitions`;
                  const field = document.createElement("input");
                  field.name = JSON.stringify(attack).slice(0, -1) + ', "x": "';
                  field.value = '"}';
                  form.appendChild(field);
                  const frame = document.createElement("iframe");
                  frame.name = "sink";
                  document.body.appendChild(frame);
                  form.target = "sink";
                  document.body.appendChild(form);
                  const loaded = new Promise((done) => frame.addEventListener("load", done));
                  form.submit();
                  await loaded;
                  return frame.contentDocument === null ? "cross-origin" : "same-origin";
                }""",
                [base, run_id, ATTACK],
            )
            assert sent == "cross-origin"
            rebound = page.goto(f"http://evil.example:{port}/runs")
            assert rebound is not None and rebound.status == 421
            assert "host-not-allowed" in rebound.text() and run_id not in rebound.text()
            page.goto(f"http://evil.example:{port}/health")
            read = page.evaluate(
                """async (runId) => {
                  const r = await fetch(`/runs/${runId}/cancel`, { method: "POST",
                    headers: { "Content-Type": "application/json" }, body: "{}" });
                  return [r.status, await r.text()];
                }""",
                run_id,
            )
            assert read[0] == 421, read
        finally:
            browser.close()
    assert state(base, run_id) == before


def test_the_docs_pages_render_with_nothing_loaded_off_the_server(
    browser: Any, no_auth: tuple[Served, str, str]
) -> None:
    from playwright.sync_api import expect

    _, base, _ = no_auth
    page = browser.new_page()
    requested: list[str] = []
    page.on("request", lambda request: requested.append(request.url))
    failed: dict[str, str] = {}
    page.on("requestfailed", lambda request: failed.update({request.url: request.failure or ""}))
    answered: list[str] = []
    page.on("response", lambda response: answered.append(response.url))
    page.goto(f"{base}/docs")
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("tideflow")
    expect(page.locator(".opblock-summary-path").first).to_be_visible()
    page.goto(f"{base}/redoc")
    expect(page.locator("h1")).to_contain_text("tideflow")
    expect(page.get_by_text("/runs/{run_id}/cancel").first).to_be_attached()
    assert requested, "the pages made no request"
    own = (base + "/", "data:", "blob:")
    assert [url for url in answered if not url.startswith(own)] == [], json.dumps(answered)
    # ReDoc's footer asks for its logo from its CDN: the page's policy stops it unsent
    off = [url for url in requested if not url.startswith(own)]
    assert all(failed.get(url) == "csp" for url in off), json.dumps([off, failed])
