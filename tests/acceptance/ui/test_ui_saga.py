"""A compensated saga in headless Chromium (examples/order_saga.yaml, its shipping
refused): the graph paints the undone steps `compensated` in their own colour (and the
legend has it), the step panel says so, and the timeline has a lane of its own for each
compensation, its bars ended `succeeded` inside the card; no bar is left `running`."""

from __future__ import annotations

from typing import Any

import pytest
from tests.acceptance.ui.conftest import ROOT, Served, opened_as_admin
from tests.acceptance.ui.test_ui_browser import expect_step, fill_of, keep, post

pytestmark = pytest.mark.slow

SAGA = (ROOT / "examples" / "order_saga.yaml").read_text()
COMPENSATED = "rgb(161, 98, 7)"  # --compensated in style.css, as the browser computes it


def test_a_compensated_saga_shows_its_compensations_in_the_graph_and_the_timeline(
    browser: Any, ui: tuple[Served, str], artifacts: Any
) -> None:
    from playwright.sync_api import expect

    _, link = ui
    page, base, errors = opened_as_admin(browser, link)
    post(page, base, "/definitions", SAGA, yaml=True)
    order = {"order_id": "A2", "amount": 30, "fail_shipping": True}
    run_id = post(page, base, "/runs", {"workflow": "order-saga", "input": order})["run_id"]
    page.goto(f"{base}/ui/#/runs/{run_id}")

    expect(page.locator("#run-status .badge")).to_have_attribute("data-status", "compensated")
    for step in ("reserve", "charge"):
        expect_step(page, step, "compensated")
        assert fill_of(page, step) == COMPENSATED, step
    expect_step(page, "ship", "failed")
    legend = page.locator("#legend .badge[data-status='compensated']")
    expect(legend).to_have_text("compensated")
    page.locator("g.node[data-step='charge']").click()
    expect(page.locator("#step-detail .badge[data-status='compensated']")).to_be_visible()

    card = page.locator("#tab-body")  # the timeline is the tab shown first
    for step in ("reserve", "charge"):
        expect(
            card.locator("svg.gantt .lane-label", has_text=f"{step} ↺ compensate")
        ).to_have_count(1)
        bar = card.locator(f"svg.gantt rect.bar.compensation[data-step='{step}']")
        expect(bar).to_have_count(1)
        expect(bar).to_have_attribute("data-outcome", "succeeded")
    expect(card.locator("svg.gantt rect.bar[data-step='ship']")).to_have_attribute(
        "data-outcome", "failed"
    )
    expect(card.locator("svg.gantt rect.bar[data-outcome='running']")).to_have_count(0)
    # inside the card: every compensation bar lies within the timeline's box
    box = card.bounding_box()
    for bar in card.locator("svg.gantt rect.bar.compensation").all():
        inner = bar.bounding_box()
        assert box is not None and inner is not None
        assert box["x"] <= inner["x"] and inner["x"] + inner["width"] <= box["x"] + box["width"]
        assert box["y"] <= inner["y"] and inner["y"] + inner["height"] <= box["y"] + box["height"]
    expect(card.locator(".legend .outcome[data-outcome='compensation']")).to_be_visible()
    keep(page, artifacts, "saga-compensated.png")
    assert errors == []
