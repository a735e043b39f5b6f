"""A step's output in headless Chromium: its panel shows what each attempt wrote, each
stream apart and as text (a `<b>` it printed is not markup)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.acceptance.ui.conftest import Served, opened_as_admin
from tests.acceptance.ui.test_ui_browser import expect_step, keep, post

pytestmark = pytest.mark.slow

FLOW = """
name: chatty-shell
version: "1"
steps:
  - id: talk
    type: shell
    command: [sh, -c, "echo 'out <b>line</b>'; echo err line >&2"]
"""


def test_the_step_panel_shows_what_the_step_wrote(
    browser: Any, ui: tuple[Served, str], artifacts: Path
) -> None:
    from playwright.sync_api import expect

    _, link = ui
    page, base, errors = opened_as_admin(browser, link)
    post(page, base, "/definitions", FLOW, yaml=True)
    run_id = post(page, base, "/runs", {"workflow": "chatty-shell", "input": {}})["run_id"]
    page.goto(f"{base}/ui/#/runs/{run_id}")
    expect_step(page, "talk", "succeeded")
    page.locator("g.node[data-step='talk']").click()

    output = page.locator("#step-detail .step-output")
    expect(output.locator("pre[data-stream='stdout']")).to_have_text("out <b>line</b>\n")
    expect(output.locator("pre[data-stream='stderr']")).to_have_text("err line\n")
    expect(output.locator("pre b")).to_have_count(0)
    expect(output).to_contain_text("attempt 1: succeeded")
    keep(page, artifacts, "step-output.png")
    assert errors == []
