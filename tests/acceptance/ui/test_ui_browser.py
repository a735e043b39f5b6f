"""The web UI in headless Chromium: the runs list, a content-moderation run's graph in
its colours, the waiting step's signal sent from the page and the run seen to finish
live; the same on a 10,000-step run; role checks with API-token logins.

The bound for the 10,000-step run (docs/observability.md, Web UI): its run page holds
fewer than ``MAX_ELEMENTS`` elements, the same order as a 10-step run's (the map's
10,000 items are one node with counts, the history list is virtualised), and every wait
in the browser is bounded by ``EXPECT_TIMEOUT`` (30 s).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from tests.acceptance.ui.conftest import ROOT, Served, opened_as_admin, serve, tideflow

pytestmark = pytest.mark.slow

MODERATION = (ROOT / "examples" / "content_moderation.yaml").read_text()
COLOURS = {  # the fills of style.css, as the browser computes them
    "pending": "rgb(226, 232, 240)",
    "running": "rgb(37, 99, 235)",
    "waiting": "rgb(147, 51, 234)",
    "succeeded": "rgb(22, 163, 74)",
    "skipped": "rgb(241, 245, 249)",
}
MAX_ELEMENTS = 1500
ITEMS = 10_000
SCORING_WAITS = 8
BIG = {
    "name": "big-batch",
    "version": "1",
    "input": {"type": "object", "required": ["posts"]},
    "steps": [
        {
            "id": "score",
            "type": "map",
            "items": "{{ inputs.posts }}",
            "step": {
                "id": "score_one",
                "type": "python",
                "function": "examples.moderation:score_spam",
                "input": {"text": "{{ item }}"},
            },
        },
        {"id": "approve", "type": "wait", "signal": "batch.approved", "depends_on": ["score"]},
        {"id": "done", "type": "noop", "depends_on": ["approve"]},
    ],
}
BROKEN = {
    "name": "broken",
    "version": "1",
    "steps": [
        {"id": "score", "type": "python", "function": "examples.moderation:score_spam",
         "input": {"text": 5}},  # an int has no .lower(): AttributeError, every time
    ],
}  # fmt: skip
UI_HEADER = {"X-Tideflow-UI": "1"}


def post(page: Any, base: str, path: str, body: Any, yaml: bool = False) -> Any:
    headers = {**UI_HEADER, "content-type": "application/yaml" if yaml else "application/json"}
    response = page.request.post(
        base + path, data=body if yaml else json.dumps(body), headers=headers
    )
    assert response.ok, response.text()
    return response.json()


def fill_of(page: Any, step: str) -> str:
    return str(
        page.locator(f"g.node[data-step='{step}'] rect").evaluate("r => getComputedStyle(r).fill")
    )


def expect_step(page: Any, step: str, status: str) -> None:
    from playwright.sync_api import expect

    expect(page.locator(f"g.node[data-step='{step}']")).to_have_attribute("data-status", status)
    if status in COLOURS:
        assert fill_of(page, step) == COLOURS[status], (step, status)


def keep(page: Any, artifacts: Path, name: str) -> None:
    page.screenshot(path=str(artifacts / name), full_page=True)


def test_a_moderation_run_is_seen_waiting_signalled_and_finished(
    browser: Any, ui: tuple[Served, str], artifacts: Path
) -> None:
    from playwright.sync_api import expect

    served, link = ui
    page, base, errors = opened_as_admin(browser, link)
    post(page, base, "/definitions", MODERATION, yaml=True)
    text = "You idiot, that harbour photo is lovely"  # toxicity 0.5: a moderator must look
    started = post(page, base, "/runs", {"workflow": "content-moderation",
                                         "input": {"content_id": "p-7", "text": text}})  # fmt: skip
    run_id = started["run_id"]

    row = page.locator(f"tr[data-run='{run_id}']")  # arrived over the runs stream
    expect(row).to_be_visible()
    expect(row.locator(".badge")).to_have_attribute("data-status", "running")
    keep(page, artifacts, "runs-list.png")
    row.click()

    expect_step(page, "review", "waiting")
    for step in ("toxicity", "spam", "images", "combine", "route"):
        expect_step(page, step, "succeeded")
    for step in ("verdict", "publish", "reject", "record"):
        expect_step(page, step, "pending")
    expect(page.locator("#waiting-for")).to_contain_text("moderation.review")
    waits = page.locator("#why-reasons li[data-kind='waiting_for_signal']")  # the why panel
    expect(waits).to_contain_text("step review waits for signal 'moderation.review'")
    expect(page.locator("#why-reasons li[data-kind='join']").first).to_contain_text("review")
    page.locator("g.node[data-step='review']").click()
    expect(page.locator("#step-detail")).to_contain_text("Send signal moderation.review")
    keep(page, artifacts, "run-waiting.png")

    decision = {"content_id": "p-7", "decision": "approve", "reviewer": "ann"}
    page.locator("#signal-payload").fill(json.dumps(decision))
    page.locator("#send-signal").click()
    expect(page.locator("#step-detail")).to_contain_text("delivered")

    # no reload: the run stream brings the end
    expect(page.locator("#run-status .badge")).to_have_attribute("data-status", "succeeded")
    expect_step(page, "review", "succeeded")
    expect_step(page, "publish", "succeeded")
    expect_step(page, "reject", "skipped")
    expect_step(page, "record", "succeeded")
    expect(page.locator("#step-detail .output")).to_contain_text('"reviewer": "ann"')
    expect(page.locator("#why-reasons li[data-kind='ended']")).to_contain_text("succeeded")
    for step in ("toxicity", "spam", "images", "publish", "record"):  # its python steps
        lane = page.locator("svg.gantt .lane-label", has_text=step)
        expect(lane).to_have_count(1)
    page.locator(".tabs button[data-tab='history']").click()
    expect(page.locator("#history .vrow").first).to_contain_text("run_started")
    keep(page, artifacts, "run-finished.png")

    page.locator("nav a[data-nav='runs']").click()  # the list, filtered
    page.locator("#filter-status").select_option("succeeded")
    expect(page.locator(f"tr[data-run='{run_id}'] .badge")).to_have_attribute(
        "data-status", "succeeded"
    )
    page.locator("#filter-status").select_option("failed")
    expect(page.locator("#runs")).to_contain_text("No runs.")
    page.locator("nav a[data-nav='queues']").click()
    expect(page.locator("main h1")).to_have_text("Queues")
    expect(page.locator("main table").first).to_be_visible()
    workers = page.locator("main table.workers tbody tr")  # the server's own workers, live
    expect(workers.first).to_contain_text("live")
    expect(workers.first).to_contain_text(f"/{served.proc.pid}")
    assert errors == []

    # the one-time link opened one session: a second browser is turned away
    other = browser.new_context()
    again = other.new_page()
    assert again.goto(link).status == 401
    assert again.request.get(f"{base}/runs/{run_id}").status == 401
    other.close()


@pytest.mark.timeout(600)
def test_a_10000_step_run_stays_within_the_bound(
    browser: Any, ui: tuple[Served, str], artifacts: Path
) -> None:
    from playwright.sync_api import expect

    _, link = ui
    base = link.split("/ui/", 1)[0]
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(link)
    expect(page.locator("#me")).to_contain_text("admin")
    post(page, base, "/definitions", BIG)
    posts = [f"post number {i}" for i in range(ITEMS)]
    run_id = post(page, base, "/runs", {"workflow": "big-batch", "input": {"posts": posts}})[
        "run_id"
    ]
    page.goto(f"{base}/ui/#/runs/{run_id}")
    node = page.locator("g.node[data-step='score_one']")
    expect(node).to_be_visible()
    # the map's items are one node with counts, live; each wait is bounded by
    # EXPECT_TIMEOUT, and the run gets up to SCORING_WAITS of them to score 10,000 posts on
    # a busy machine (about 10 s on an idle one)
    for _ in range(SCORING_WAITS - 1):
        try:
            expect_step(page, "approve", "waiting")
            break
        except AssertionError:
            assert "done" in (node.text_content() or "")  # it moves: "1234/10000 done"
    expect_step(page, "approve", "waiting")
    expect_step(page, "score_one", "succeeded")
    expect(node).to_contain_text(f"{ITEMS}/{ITEMS} done")
    elements = page.evaluate("document.querySelectorAll('*').length")
    assert elements < MAX_ELEMENTS, elements

    node.click()  # its instances, one page at a time
    expect(page.locator("#step-detail")).to_contain_text(f"1\u201320 of {ITEMS}")
    expect(page.locator("#step-detail details.instance")).to_have_count(20)
    expect(page.locator("#step-detail")).not_to_contain_text("null")
    page.locator(".tabs button[data-tab='history']").click()
    expect(page.locator("#history")).to_be_visible()
    expect(page.locator(".tabs + .panel")).to_contain_text("event(s)")
    shown = page.locator("#history .vrow").count()
    assert 0 < shown < 60, shown  # of more than 10,000 entries
    assert page.evaluate("document.querySelectorAll('*').length") < MAX_ELEMENTS
    keep(page, artifacts, "big-run.png")

    page.locator("g.node[data-step='approve']").click()
    page.locator("#signal-payload").fill('{"ok": true}')
    page.locator("#send-signal").click()
    expect(page.locator("#run-status .badge")).to_have_attribute("data-status", "succeeded")
    expect_step(page, "done", "succeeded")


def create_token(store: str, role: str) -> str:
    done = subprocess.run(
        tideflow("tokens", "create", "--store", store, "--name", f"ui {role}", "--role", role),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.strip().splitlines()[-1]


def test_roles_decide_the_buttons_and_the_server_refuses_the_rest(
    browser: Any, tmp_path: Path, artifacts: Path
) -> None:
    from playwright.sync_api import expect

    store = f"sqlite:///{tmp_path / 'server.db'}"
    viewer, operator = create_token(store, "viewer"), create_token(store, "operator")
    admin = create_token(store, "admin")
    served = serve("server", "--embedded", "--store", store, "--http", "127.0.0.1:0")
    try:
        line = served.line_with("HTTP API listening on ")
        base = line.split("listening on ", 1)[1].split(" ", 1)[0]
        api = browser.new_context().request
        bearer = {"Authorization": f"Bearer {admin}", "content-type": "application/yaml"}
        assert api.post(f"{base}/definitions", data=MODERATION, headers=bearer).ok
        body = {"workflow": "content-moderation", "input": {"content_id": "p-9", "text": "idiot"}}
        bearer["content-type"] = "application/json"
        run_id = api.post(f"{base}/runs", data=json.dumps(body), headers=bearer).json()["run_id"]

        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{base}/ui/#/runs/{run_id}")
        page.locator("#token").fill("tf_0000000000000000_" + "A" * 43)
        page.locator("form.login button").click()
        expect(page.locator("form.login .note.error")).to_contain_text("not a live API token")
        page.locator("#token").fill(viewer)
        page.locator("form.login button").click()
        expect(page.locator("#me")).to_contain_text("viewer")
        page.goto(f"{base}/ui/#/runs/{run_id}")
        expect_step(page, "review", "waiting")
        page.locator("g.node[data-step='review']").click()
        expect(page.locator("#step-detail")).to_contain_text("may not send signals")
        expect(page.locator("#send-signal")).to_have_count(0)
        expect(page.locator("#cancel")).to_have_count(0)
        keep(page, artifacts, "viewer.png")
        # the cookie alone does not let a viewer act, nor a page without the UI's header
        signal = json.dumps({"name": "moderation.review", "payload": {"content_id": "p-9"}})
        refused = page.request.post(f"{base}/runs/{run_id}/signals", data=signal,
                                    headers={**UI_HEADER, "content-type": "application/json"})  # fmt: skip
        assert refused.status == 403, refused.text()
        assert "needs role operator" in refused.json()["detail"]
        no_header = page.request.post(f"{base}/runs/{run_id}/cancel", data="{}",
                                      headers={"content-type": "application/json"})  # fmt: skip
        assert no_header.status == 401

        page.locator("#me button").click()  # log out, in as an operator
        page.locator("#token").fill(operator)
        page.locator("form.login button").click()
        expect(page.locator("#me")).to_contain_text("operator")
        page.goto(f"{base}/ui/#/runs/{run_id}")
        expect(page.locator("#cancel")).to_be_visible()
        page.locator("#cancel").click()
        expect(page.locator("#run-status .badge")).to_have_attribute("data-status", "cancelled")
        # a run that fails: the operator retries it from the page (it fails again)
        assert api.post(f"{base}/definitions", data=json.dumps(BROKEN), headers=bearer).ok
        broken = api.post(f"{base}/runs", data=json.dumps({"workflow": "broken"}), headers=bearer)
        page.goto(f"{base}/ui/#/runs/{broken.json()['run_id']}")
        expect(page.locator("#run-status .badge")).to_have_attribute("data-status", "failed")
        expect_step(page, "score", "failed")
        page.locator("g.node[data-step='score']").click()
        expect(page.locator("#step-detail .error")).to_contain_text("AttributeError")
        page.locator("#retry").click()
        page.locator(".tabs button[data-tab='history']").click()
        expect(page.locator("#history")).to_contain_text("run_retried")
        page.locator(".tabs button[data-tab='timeline']").click()
        expect(page.locator("svg.gantt .bar.failed")).to_have_count(2)  # one per round

        page.goto(f"{base}/ui/#/definitions")
        expect(page.locator("main table")).to_contain_text("content-moderation")
        expect(page.locator("main table button")).to_have_count(0)  # only admins (de)activate
        page.locator("main tr.row", has_text="content-moderation").click()
        expect(page.locator("main svg.graph g.node")).to_have_count(10)
    finally:
        served.stop()


def shown(first: int, last: int) -> str:
    return f"runs {first}\N{EN DASH}{last}"  # as the page says it


HOLD = {"name": "pager", "version": "1", "steps": [{"id": "hold", "type": "wait", "signal": "go"}]}


def test_the_runs_list_pages_older_and_newer_keeping_its_filter_and_live_status(
    browser: Any, ui: tuple[Served, str], artifacts: Path
) -> None:
    from playwright.sync_api import expect

    _, link = ui
    base = link.split("/ui/", 1)[0]
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.goto(link)
    expect(page.locator("#me")).to_contain_text("admin")
    post(page, base, "/definitions", HOLD)
    post(page, base, "/definitions", {**HOLD, "name": "other"})
    for _ in range(7):
        post(page, base, "/runs", {"workflow": "pager"})
    other = post(page, base, "/runs", {"workflow": "other"})["run_id"]  # the newest: filtered out
    listed = page.request.get(f"{base}/runs?workflow=pager&limit=100", headers=UI_HEADER).json()
    ids = [r["run_id"] for r in listed["runs"]]  # newest first
    assert len(ids) == 7

    def shows(chunk: list[str], where: str) -> None:
        expect(page.locator("#runs tr.row")).to_have_count(len(chunk))
        for run_id in chunk:
            expect(page.locator(f"#runs tr[data-run='{run_id}']")).to_be_visible()
        expect(page.locator("#live")).to_contain_text(where)

    page.goto(f"{base}/ui/#/runs?workflow=pager&limit=3")
    shows(ids[:3], shown(1, 3))
    expect(page.locator(f"#runs tr[data-run='{other}']")).to_have_count(0)
    expect(page.locator("#page-newer")).to_be_disabled()
    page.locator("#page-older").click()
    shows(ids[3:6], shown(4, 6))
    page.locator("#page-older").click()
    shows(ids[6:], "run 7")
    expect(page.locator("#page-older")).to_be_disabled()
    assert "workflow=pager" in page.url and "limit=3" in page.url  # the filter is kept
    expect(page.locator("#filter-workflow")).to_have_value("pager")

    oldest = page.locator(f"#runs tr[data-run='{ids[6]}'] .badge")
    expect(oldest).to_have_attribute("data-status", "running")
    post(page, base, f"/runs/{ids[6]}/cancel", {"reason": "paging test"})
    expect(oldest).to_have_attribute("data-status", "cancelled")  # an older page is live
    keep(page, artifacts, "runs-paged.png")

    page.locator("#page-newer").click()
    shows(ids[3:6], shown(4, 6))
    page.locator("#page-newest").click()
    shows(ids[:3], shown(1, 3))


def test_a_title_is_shown_where_the_name_is(
    browser: Any, ui: tuple[Served, str], artifacts: Path
) -> None:
    from playwright.sync_api import expect

    _, link = ui
    base = link.split("/ui/", 1)[0]
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.goto(link)
    expect(page.locator("#me")).to_contain_text("admin")
    titled = {"name": "order-fulfillment", "title": "订单履约流程", "version": "1",
              "steps": [{"id": "ask", "type": "wait", "signal": "go"}]}  # fmt: skip
    post(page, base, "/definitions", titled)
    run_id = post(page, base, "/runs", {"workflow": "order-fulfillment"})["run_id"]
    markup = "<img src=x onerror=alert(1)> [bold]x[/bold]"  # shown as text, never as HTML
    post(page, base, "/definitions", {**titled, "name": "markup", "title": markup})
    markup_run = post(page, base, "/runs", {"workflow": "markup"})["run_id"]

    page.goto(f"{base}/ui/#/runs")
    row = page.locator(f"#runs tr[data-run='{run_id}'] td.workflow")
    expect(row).to_contain_text("订单履约流程")
    expect(row).to_contain_text("order-fulfillment")
    expect(page.locator(f"#runs tr[data-run='{markup_run}'] td.workflow")).to_contain_text(markup)
    expect(page.locator("#runs img")).to_have_count(0)
    expect(page.locator("#filter-workflow option[value='order-fulfillment']")).to_have_text(
        "订单履约流程 (order-fulfillment)"
    )
    page.goto(f"{base}/ui/#/runs/{run_id}")
    expect(page.locator("#run-workflow")).to_contain_text("订单履约流程 (order-fulfillment 1)")
    page.goto(f"{base}/ui/#/definitions/order-fulfillment/1")
    cells = page.locator("td.workflow")
    expect(cells.filter(has_text="order-fulfillment")).to_contain_text("订单履约流程")
    expect(cells.filter(has_text="markup")).to_contain_text(markup)
    expect(page.locator("h2")).to_contain_text("订单履约流程 (order-fulfillment 1)")
    keep(page, artifacts, "titles.png")


def test_the_doc_images_are_screenshots_the_tests_take(artifacts: Path) -> None:
    """docs/images holds two of the screenshots; `TIDEFLOW_UPDATE_DOC_IMAGES=1` copies
    the fresh ones there (after the tests above ran)."""
    import os

    docs = ROOT / "docs" / "images"
    for name in ("ui-run-waiting.png", "ui-big-run.png"):
        fresh = artifacts / name.removeprefix("ui-")
        if os.environ.get("TIDEFLOW_UPDATE_DOC_IMAGES") and fresh.exists():
            shutil.copyfile(fresh, docs / name)
        assert (docs / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
