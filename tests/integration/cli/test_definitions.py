"""`tideflow definitions register|list|show` on a SQLite file."""

from __future__ import annotations

from .conftest import Workdir, invoke, stdout_json


def test_register_list_show_and_the_immutability_of_a_version(workdir: Workdir) -> None:
    done = invoke("definitions", "register", "quick.yaml", "wait.yaml", "--store", workdir.store)
    assert done.exit_code == 0, done.stderr
    assert "quick 1" in done.stdout and "approval 1" in done.stdout

    again = invoke("definitions", "register", "quick.yaml", "--store", workdir.store)
    assert again.exit_code == 0  # same content: nothing changes

    listed = stdout_json(invoke("definitions", "list", "--json", "--store", workdir.store))
    assert [(d["name"], d["version"]) for d in listed["definitions"]] == [
        ("approval", "1"),
        ("quick", "1"),
    ]

    shown = invoke("definitions", "show", "quick", "--json", "--store", workdir.store)
    assert shown.exit_code == 0
    assert stdout_json(shown)["name"] == "quick"
    assert "name: quick" in invoke("definitions", "show", "quick", "--store", workdir.store).stdout

    (workdir.path / "quick.yaml").write_text(
        (workdir.path / "quick.yaml")
        .read_text()
        .replace('version: "1"', 'version: "1"\ndescription: changed'),
        encoding="utf-8",
    )
    changed = invoke("definitions", "register", "quick.yaml", "--store", workdir.store)
    assert changed.exit_code == 2
    assert "new version" in changed.stderr

    missing = invoke("definitions", "show", "nope", "--store", workdir.store)
    assert missing.exit_code == 2
    assert "no definition 'nope'" in missing.stderr


def test_deactivate_and_activate_a_version(workdir: Workdir) -> None:
    assert invoke("definitions", "register", "quick.yaml", "--store", workdir.store).exit_code == 0
    off = invoke("definitions", "deactivate", "quick", "1", "--store", workdir.store)
    assert off.exit_code == 0, off.stderr
    assert off.stdout.strip() == "quick 1: deactivated"
    again = invoke("definitions", "deactivate", "quick", "1", "--store", workdir.store)
    assert "(it was already)" in again.stdout
    listed = stdout_json(invoke("definitions", "list", "--json", "--store", workdir.store))
    assert [d["active"] for d in listed["definitions"]] == [False]
    assert "no" in invoke("definitions", "list", "--store", workdir.store).stdout

    refused = invoke("runs", "start", "quick", "--store", workdir.store)
    assert refused.exit_code == 2
    assert "tideflow definitions activate quick VERSION" in refused.stderr
    shown = invoke("definitions", "show", "quick", "--json", "--store", workdir.store)
    assert shown.exit_code == 0 and stdout_json(shown)["name"] == "quick"

    on = invoke("definitions", "activate", "quick", "1", "--store", workdir.store)
    assert on.stdout.strip() == "quick 1: active"
    assert invoke("runs", "start", "quick", "--store", workdir.store).exit_code == 0
    missing = invoke("definitions", "activate", "quick", "9", "--store", workdir.store)
    assert missing.exit_code == 2
    assert "no definition 'quick' version 9" in missing.stderr


def test_runs_start_takes_a_priority(workdir: Workdir) -> None:
    """`runs start --priority`: stored with the run (its place in the admission queue); a
    word that is no priority is a usage error and starts nothing."""
    import asyncio

    from tideflow.store import open_store

    assert invoke("definitions", "register", "quick.yaml", "--store", workdir.store).exit_code == 0
    low = invoke("runs", "start", "quick", "--priority", "low", "--store", workdir.store)
    assert low.exit_code == 0, low.stderr
    refused = invoke("runs", "start", "quick", "--priority", "urgent", "--store", workdir.store)
    assert refused.exit_code == 2
    assert "--priority: priority 'urgent': give high, normal or low" in refused.stderr

    async def priority_of(run_id: str) -> str:
        store = open_store(workdir.store)
        await store.open()
        try:
            return (await store.load_run(run_id)).snapshot.priority.value
        finally:
            await store.close()

    assert asyncio.run(priority_of(low.stdout.strip())) == "low"
