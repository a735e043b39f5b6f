"""`tideflow db upgrade|status|prune` on SQLite files."""

from __future__ import annotations

import json
import sqlite3

import pytest

from tideflow.store.sqlfiles import latest_version

from .conftest import Workdir, invoke, stdout_json, waiting_runs

LATEST = latest_version("sqlite")


def test_upgrade_creates_a_fresh_file_and_status_reports_it(workdir: Workdir) -> None:
    before = invoke("db", "status", "--json", "--store", workdir.store)
    assert before.exit_code == 1
    assert stdout_json(before)["schema_version"] == 0
    assert not workdir.db.exists()  # status changes nothing

    created = invoke("db", "upgrade", "--store", workdir.store)
    assert created.exit_code == 0, created.stderr
    assert "created" in created.stdout and f"schema version {LATEST}" in created.stdout
    assert workdir.db.is_file()

    again = invoke("db", "upgrade", "--store", workdir.store)
    assert again.exit_code == 0
    assert f"already at schema version {LATEST}" in again.stdout

    status = invoke("db", "status", "--json", "--store", workdir.store)
    assert status.exit_code == 0
    assert stdout_json(status) == {
        "store": workdir.store,
        "schema_version": LATEST,
        "code_schema_version": LATEST,
        "up_to_date": True,
        "problems": [],
        "pending_effects": 0,
        "cluster": None,
    }
    assert "up to date" in invoke("db", "status", "--store", workdir.store).stdout


def test_a_store_written_by_a_newer_tideflow_is_refused(workdir: Workdir) -> None:
    assert invoke("db", "upgrade", "--store", workdir.store).exit_code == 0
    with sqlite3.connect(workdir.db) as conn:
        conn.execute("INSERT INTO schema_version (version, applied_at) VALUES (999, 0)")
    conn.close()

    for command in (
        ["db", "status"],
        ["db", "upgrade"],
        ["runs", "list"],
        ["run", "quick.yaml"],
        ["resume"],
    ):
        done = invoke(*command, "--store", workdir.store)
        assert done.exit_code == 2, command
        assert "newer tideflow" in done.stderr and str(workdir.db) in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1


def test_prune_archives_each_ended_run_as_one_json_line(workdir: Workdir) -> None:
    for n in range(2):
        assert (
            invoke("run", "quick.yaml", "-i", str(n), "--json", "--store", workdir.store).exit_code
            == 0
        )
    (waiting,) = waiting_runs(workdir.store, 1, workdir.path / "wait.yaml")
    archive = workdir.path / "archive" / "runs.jsonl"
    archive.parent.mkdir()
    archive.write_text('{"earlier": "line"}\n', encoding="utf-8")

    done = invoke(
        "db", "prune", "--older-than", "0s", "--archive", str(archive), "--batch-size", "1",
        "--store", workdir.store,
    )  # fmt: skip
    assert done.exit_code == 0, done.stderr
    assert "pruned 2 run(s)" in done.stdout

    lines = [json.loads(line) for line in archive.read_text(encoding="utf-8").splitlines()]
    assert lines[0] == {"earlier": "line"}  # appended, never truncated
    assert len(lines) == 3
    for record in lines[1:]:
        assert set(record) == {"run", "history"}
        assert record["run"]["workflow"] == "quick" and record["run"]["status"] == "succeeded"
        assert [e["seq"] for e in record["history"]] == list(range(1, len(record["history"]) + 1))
    remaining = stdout_json(invoke("runs", "list", "--json", "--store", workdir.store))["runs"]
    assert [r["run_id"] for r in remaining] == [waiting]  # unfinished runs are kept


def test_prune_without_archive_and_a_cutoff_in_the_past(workdir: Workdir) -> None:
    assert invoke("run", "quick.yaml", "--json", "--store", workdir.store).exit_code == 0

    kept = invoke(
        "db", "prune", "--older-than", "30d", "--no-archive", "--json", "--store", workdir.store
    )
    assert kept.exit_code == 0, kept.stderr
    assert stdout_json(kept)["pruned"] == 0

    dropped = invoke(
        "db", "prune", "--older-than", "0s", "--no-archive", "--json", "--store", workdir.store
    )
    assert stdout_json(dropped)["pruned"] == 1
    assert stdout_json(dropped)["archive"] is None
    assert stdout_json(invoke("runs", "list", "--json", "--store", workdir.store))["runs"] == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "exactly one of --archive"),
        (["--no-archive", "--archive", "x.jsonl"], "exactly one of --archive"),
        (["--no-archive", "--older-than", "soon"], "invalid duration 'soon'"),
        (["--no-archive", "--older-than", "-5"], "must not be negative"),
        (["--archive", "missing/dir/x.jsonl"], "cannot write archive"),
    ],
)
def test_prune_usage_errors(workdir: Workdir, args: list[str], message: str) -> None:
    assert invoke("db", "upgrade", "--store", workdir.store).exit_code == 0
    if "--older-than" not in args:
        args = [*args, "--older-than", "1d"]

    done = invoke("db", "prune", *args, "--store", workdir.store)
    assert done.exit_code == 2
    assert message in done.stderr


def test_db_commands_on_the_memory_store(workdir: Workdir) -> None:
    status = invoke("db", "status", "--store", "memory://")
    assert status.exit_code == 0 and "no schema" in status.stdout
    assert invoke("db", "upgrade", "--store", "memory://").exit_code == 0
    pruned = invoke("db", "prune", "--older-than", "0s", "--no-archive", "--store", "memory://")
    assert pruned.exit_code == 0 and "pruned 0" in pruned.stdout
