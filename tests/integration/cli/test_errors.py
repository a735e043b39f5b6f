"""A store that cannot be used ends a command with one clear line and exit 2, never a traceback."""

from __future__ import annotations

import sqlite3

import pytest

from .conftest import Workdir, command_paths, invoke, stdout_json, tideflow, waiting_runs


def test_a_damaged_sqlite_file_is_one_line_naming_the_file(workdir: Workdir) -> None:
    workdir.db.write_bytes(bytes(range(256)) * 40)

    for command in (["runs", "list"], ["run", "quick.yaml"]):
        done = tideflow(workdir.path, *command, "--store", workdir.store)
        assert done.returncode == 2, command
        assert "Traceback" not in done.stderr
        (line,) = done.stderr.strip().splitlines()
        assert line.startswith("error: cannot open store")
        assert str(workdir.db) in line and "damaged" in line


def test_a_bad_store_url_exits_2(workdir: Workdir) -> None:
    done = tideflow(workdir.path, "runs", "list", "--store", "mysql://db/x")
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.strip() == (
        "error: unknown store URL 'mysql://db/x': use memory://, sqlite:///path/to/file.db "
        "or postgresql://user@host/db"
    )
    assert invoke("runs", "show", "x", "--store", "sqlite://").exit_code == 2


@pytest.mark.parametrize(
    "command",
    [
        ["runs", "list"],
        ["runs", "show", "x"],
        ["runs", "history", "x"],
        ["db", "prune", "--older-than", "1d", "--no-archive"],
    ],
)
def test_reading_commands_do_not_create_a_missing_store(
    workdir: Workdir, command: list[str]
) -> None:
    done = invoke(*command, "--store", workdir.store)
    assert done.exit_code == 2
    assert f"no store at {workdir.db}" in done.stderr
    assert not workdir.db.exists()


def test_resume_on_a_missing_store_has_nothing_to_do(workdir: Workdir) -> None:
    done = invoke("resume", "--json", "--store", workdir.store)
    assert done.exit_code == 0
    assert done.stdout.strip() == '{"runs":[]}'
    assert not workdir.db.exists()


@pytest.mark.parametrize("command", command_paths(), ids=" ".join)
def test_every_command_has_help_with_examples(command: list[str]) -> None:
    done = invoke(*command, "--help")
    assert done.exit_code == 0
    assert "Examples:" in done.stdout
    assert "tideflow " + " ".join(command) in done.stdout


def test_resume_reports_a_run_with_a_damaged_history_row_and_finishes_the_others(
    workdir: Workdir,
) -> None:
    good, damaged = waiting_runs(workdir.store, 2, workdir.path / "wait.yaml")
    assert invoke("runs", "signal", good, "approve", "--store", workdir.store).exit_code == 0
    with sqlite3.connect(workdir.db) as conn:
        conn.execute(
            "UPDATE history SET data = ? WHERE run_id = ?", ('{"kind": "mystery"}', damaged)
        )
    conn.close()

    resumed = invoke("resume", "--json", "--store", workdir.store)
    assert resumed.exit_code == 1
    assert [(r["run_id"], r["status"]) for r in stdout_json(resumed)["runs"]] == [
        (good, "succeeded")
    ]
    assert f"skipped run {damaged}" in resumed.stderr
    assert "unknown type 'mystery'" in resumed.stderr

    for command in ("show", "resume"):
        done = invoke("runs", command, damaged, "--store", workdir.store)
        assert done.exit_code == 2, command
        (line,) = done.stderr.strip().splitlines()[-1:]
        assert damaged in line and "mystery" in line


def test_a_sweep_interval_that_is_not_seconds_is_a_usage_error(workdir: Workdir) -> None:
    done = invoke(
        "server",
        "--store",
        workdir.store,
        "--bus",
        "redis://127.0.0.1:1/0",
        "--sweep-interval",
        "inf",
    )
    assert done.exit_code == 2
    assert "sweep interval inf: give seconds between two sweeps" in done.stderr
    done = invoke(
        "run", "quick.yaml", "--store", workdir.store, env={"TIDEFLOW_SWEEP_INTERVAL": "soon"}
    )
    assert done.exit_code == 2
    assert "TIDEFLOW_SWEEP_INTERVAL='soon'" in done.stderr
