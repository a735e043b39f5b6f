"""`tideflow definitions list|show` and `tideflow runs list|show` show a definition's
`title:` beside its name, in text and in --json (a SQLite store)."""

from __future__ import annotations

import asyncio

from tideflow.runtime.runtime import Runtime

from .conftest import Workdir, invoke, stdout_json

TITLE = "订单履约流程"
TITLED = f"""
name: order-fulfillment
title: {TITLE}
version: "1"
steps:
  - {{id: a, type: noop}}
"""
PLAIN = 'name: plain\nversion: "1"\nsteps: [{id: a, type: noop}]\n'


def finished_run(store: str, workflow: str) -> str:
    async def run() -> str:
        async with Runtime(store=store, workers=1) as rt:
            run_id, _ = await rt.client.launch(workflow, None)
            assert (await rt.client.wait(run_id, 30)).status == "succeeded"
            return run_id

    return asyncio.run(run())


def registered(workdir: Workdir) -> None:
    (workdir.path / "titled.yaml").write_text(TITLED, encoding="utf-8")
    (workdir.path / "plain.yaml").write_text(PLAIN, encoding="utf-8")
    done = invoke("definitions", "register", "titled.yaml", "plain.yaml", "--store", workdir.store)
    assert done.exit_code == 0, done.stderr


def test_definitions_list_and_show_show_the_title(workdir: Workdir) -> None:
    registered(workdir)
    listed = stdout_json(invoke("definitions", "list", "--json", "--store", workdir.store))
    assert [(d["name"], d["title"]) for d in listed["definitions"]] == [
        ("order-fulfillment", TITLE),
        ("plain", None),
    ]
    table = invoke("definitions", "list", "--store", workdir.store).stdout
    assert "title" in table.splitlines()[1] and TITLE in table
    shown = invoke("definitions", "show", "order-fulfillment", "--store", workdir.store)
    assert f"title: {TITLE}" in shown.stdout
    shown_json = invoke(
        "definitions", "show", "order-fulfillment", "--json", "--store", workdir.store
    )
    assert stdout_json(shown_json)["title"] == TITLE


def test_runs_list_and_show_show_the_title(workdir: Workdir) -> None:
    registered(workdir)
    titled, plain = (finished_run(workdir.store, w) for w in ("order-fulfillment", "plain"))
    listed = stdout_json(invoke("runs", "list", "--json", "--store", workdir.store))
    assert [(r["run_id"], r["title"]) for r in listed["runs"]] == [(plain, None), (titled, TITLE)]
    table = invoke("runs", "list", "--store", workdir.store).stdout
    header = table.splitlines()[1]
    assert header.index("workflow") < header.index("title") < header.index("version")
    assert TITLE in table
    shown = invoke("runs", "show", titled, "--store", workdir.store).stdout
    assert f"title    {TITLE}" in shown.splitlines()
    assert (
        stdout_json(invoke("runs", "show", titled, "--json", "--store", workdir.store))["title"]
        == TITLE
    )


def test_without_titles_the_tables_have_no_title_column(workdir: Workdir) -> None:
    (workdir.path / "plain.yaml").write_text(PLAIN, encoding="utf-8")
    assert invoke("definitions", "register", "plain.yaml", "--store", workdir.store).exit_code == 0
    run_id = finished_run(workdir.store, "plain")
    assert "title" not in invoke("definitions", "list", "--store", workdir.store).stdout
    assert "title" not in invoke("runs", "list", "--store", workdir.store).stdout
    assert "title" not in invoke("runs", "show", run_id, "--store", workdir.store).stdout


def test_a_title_is_printed_as_text_not_as_markup(workdir: Workdir) -> None:
    title = "[bold red]x[/bold red] <b>"
    (workdir.path / "m.yaml").write_text(PLAIN.replace("plain", "m") + f'title: "{title}"\n')
    assert invoke("definitions", "register", "m.yaml", "--store", workdir.store).exit_code == 0
    run_id = finished_run(workdir.store, "m")
    assert title in invoke("definitions", "list", "--store", workdir.store).stdout
    assert title in invoke("runs", "list", "--store", workdir.store).stdout
    assert f"title    {title}" in invoke("runs", "show", run_id, "--store", workdir.store).stdout
