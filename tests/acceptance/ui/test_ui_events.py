"""The web UI's Events page in headless Chromium: an event the gateway kept as unmatched
is listed, a viewer sees no Replay button, and an operator's replay delivers it to the
run that waits for it now."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tests.acceptance.ui.conftest import serve
from tests.acceptance.ui.test_ui_browser import create_token, keep

pytestmark = pytest.mark.slow

LATE = "com.example.late"
FLOW = {
    "name": "latecomer",
    "version": "1",
    "steps": [{"id": "hear", "type": "wait", "signal": LATE, "buffer": False}],
    "output": "{{ steps.hear.output.data }}",
}


def test_an_unmatched_event_is_listed_and_an_operator_replays_it(
    browser: Any, tmp_path: Path, artifacts: Path
) -> None:
    from playwright.sync_api import expect

    store = f"sqlite:///{tmp_path / 'events.db'}"
    viewer, operator = create_token(store, "viewer"), create_token(store, "operator")
    admin = create_token(store, "admin")
    served = serve("server", "--embedded", "--store", store, "--http", "127.0.0.1:0")
    try:
        line = served.line_with("HTTP API listening on ")
        base = line.split("listening on ", 1)[1].split(" ", 1)[0]
        api = browser.new_context().request
        bearer = {"Authorization": f"Bearer {admin}", "content-type": "application/json"}
        assert api.post(f"{base}/definitions", data=json.dumps(FLOW), headers=bearer).ok
        event = {"specversion": "1.0", "id": "late-1", "source": "urn:desk", "type": LATE,
                 "data": {"n": 7}}  # fmt: skip
        sent = api.post(
            f"{base}/events",
            data=json.dumps(event),
            headers={**bearer, "content-type": "application/cloudevents+json"},
        )
        assert sent.status == 202, sent.text()
        assert sent.json()["events"][0]["status"] == "unmatched"  # buffer: false, no run
        started = api.post(
            f"{base}/runs", data=json.dumps({"workflow": "latecomer"}), headers=bearer
        )
        run_id = started.json()["run_id"]

        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.goto(f"{base}/ui/#/events")
        page.locator("#token").fill(viewer)
        page.locator("form.login button").click()
        expect(page.locator("#me")).to_contain_text("viewer")
        page.goto(f"{base}/ui/#/events")
        row = page.locator("#unmatched tr.unmatched")
        expect(row).to_have_count(1)
        expect(row).to_contain_text(LATE)
        expect(row).to_contain_text("late-1")
        expect(page.locator("#unmatched button.replay")).to_have_count(0)

        page.locator("#me button").click()  # log out, in as an operator
        page.locator("#token").fill(operator)
        page.locator("form.login button").click()
        expect(page.locator("#me")).to_contain_text("operator")
        page.goto(f"{base}/ui/#/events")
        page.locator("#unmatched button.replay").click()
        expect(page.locator("main .note")).to_contain_text(f"delivered to {run_id}")
        expect(page.locator("#unmatched tr.unmatched")).to_have_count(0)
        keep(page, artifacts, "events.png")
        page.goto(f"{base}/ui/#/runs/{run_id}")
        expect(page.locator("#run-status .badge")).to_have_attribute("data-status", "succeeded")
    finally:
        served.stop()
