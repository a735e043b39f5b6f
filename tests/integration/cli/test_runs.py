"""`tideflow run`, `resume` and `runs …` against a SQLite store, as the operator uses them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from .conftest import Workdir, invoke, stdout_json, tideflow, waiting_runs


def test_run_on_sqlite_is_listed_shown_and_has_its_history(workdir: Workdir) -> None:
    done = tideflow(
        workdir.path, "run", "quick.yaml", "-i", '{"n": 1}', "--store", workdir.store, "--json"
    )
    assert done.returncode == 0, done.stderr
    run_id = stdout_json(done)["run_id"]

    listed = tideflow(workdir.path, "runs", "list", "--json", "--store", workdir.store)
    assert listed.returncode == 0, listed.stderr
    page = stdout_json(listed)
    assert [r["run_id"] for r in page["runs"]] == [run_id]
    assert page["runs"][0]["status"] == "succeeded"
    assert page["runs"][0]["workflow"] == "quick"
    assert page["runs"][0]["created_at"].endswith("Z")
    assert page["next_cursor"] is None

    shown = invoke("runs", "show", run_id, "--json", "--store", workdir.store)
    assert shown.exit_code == 0, shown.stderr
    detail = stdout_json(shown)
    assert detail["status"] == "succeeded"
    assert detail["output"] == {"echo": {"n": 1}}
    assert detail["steps"]["a"] == {
        "status": "succeeded",
        "attempts": 1,
        "output": {"echo": {"n": 1}},
        "error": None,
    }
    text = invoke("runs", "show", run_id, "--store", workdir.store)
    assert text.exit_code == 0
    assert run_id in text.stdout and "succeeded" in text.stdout

    history = invoke("runs", "history", run_id, "--json", "--store", workdir.store)
    assert history.exit_code == 0, history.stderr
    events = stdout_json(history)["events"]
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert events[0]["kind"] == "run_started"
    assert events[-1]["kind"] == "task_completed"
    assert all(e["time"].endswith("Z") for e in events)
    subjects = [(t["subject"], t["new"]) for e in events for t in e["transitions"]]
    assert ("run", "running") in subjects and ("run", "succeeded") in subjects
    assert ("a", "succeeded") in subjects
    assert all(t["time"].endswith("Z") for e in events for t in e["transitions"])


def test_run_keeps_state_in_the_default_store_under_the_working_directory(workdir: Workdir) -> None:
    done = tideflow(workdir.path, "run", "quick.yaml", "--json")
    assert done.returncode == 0, done.stderr
    assert (workdir.path / ".tideflow" / "tideflow.db").is_file()

    listed = invoke("runs", "list", "--json")
    assert [r["run_id"] for r in stdout_json(listed)["runs"]] == [stdout_json(done)["run_id"]]


def test_a_signal_recorded_by_the_cli_is_acted_on_by_resume(workdir: Workdir) -> None:
    approved, dropped = waiting_runs(workdir.store, 2, workdir.path / "wait.yaml")

    signalled = invoke(
        "runs", "signal", approved, "approve", "--payload", '{"ok": true}', "--store", workdir.store
    )
    assert signalled.exit_code == 0, signalled.stderr
    assert "tideflow resume" in signalled.stderr
    cancelled = invoke(
        "runs", "cancel", dropped, "--reason", "not needed", "--store", workdir.store
    )
    assert cancelled.exit_code == 0, cancelled.stderr
    shown = stdout_json(invoke("runs", "show", dropped, "--json", "--store", workdir.store))
    assert shown["status"] == "cancelled"
    assert "not needed" in shown["error"]["message"]

    resumed = tideflow(workdir.path, "resume", "--json", "--store", workdir.store)
    assert resumed.returncode == 0, resumed.stderr
    runs = stdout_json(resumed)["runs"]
    assert [r["run_id"] for r in runs] == [approved]
    assert set(runs[0]) == {"run_id", "status", "output", "error", "steps"}
    assert runs[0]["status"] == "succeeded"
    assert runs[0]["output"] == {"echo": {"ok": True}}

    shown = stdout_json(invoke("runs", "show", approved, "--json", "--store", workdir.store))
    assert shown["status"] == "succeeded"  # committed before resume exited
    again = invoke("resume", "--json", "--store", workdir.store)
    assert again.exit_code == 0
    assert stdout_json(again) == {"runs": []}


def test_runs_resume_waits_for_one_run_and_prints_it_like_run(workdir: Workdir) -> None:
    (run_id,) = waiting_runs(workdir.store, 1, workdir.path / "wait.yaml")
    payload = workdir.path / "answer.json"
    payload.write_text('{"by": "kim"}', encoding="utf-8")
    assert (
        invoke(
            "runs", "signal", run_id, "approve", "-p", f"@{payload}", "--store", workdir.store
        ).exit_code
        == 0
    )

    resumed = invoke("runs", "resume", run_id, "--json", "--store", workdir.store)
    assert resumed.exit_code == 0, resumed.stderr
    result = stdout_json(resumed)
    assert result["status"] == "succeeded"
    assert result["output"] == {"echo": {"by": "kim"}}


def test_resume_with_a_timeout_leaves_a_waiting_run_unfinished_and_exits_1(
    workdir: Workdir,
) -> None:
    (run_id,) = waiting_runs(workdir.store, 1, workdir.path / "wait.yaml")

    resumed = invoke("resume", "--json", "--timeout", "0.2", "--store", workdir.store)
    assert resumed.exit_code == 1
    (run,) = stdout_json(resumed)["runs"]
    assert (run["run_id"], run["status"]) == (run_id, "running")
    assert run["steps"]["ask"]["status"] == "waiting"
    assert "still unfinished" in resumed.stderr


def test_cancel_or_signal_of_an_ended_run_exits_1(workdir: Workdir) -> None:
    (run_id,) = waiting_runs(workdir.store, 1, workdir.path / "wait.yaml")
    assert invoke("runs", "cancel", run_id, "--store", workdir.store).exit_code == 0

    again = invoke("runs", "cancel", run_id, "--store", workdir.store)
    assert again.exit_code == 1
    assert "already ended (cancelled)" in again.stderr
    assert invoke("runs", "signal", run_id, "approve", "--store", workdir.store).exit_code == 1


def test_signal_payload_must_be_json(workdir: Workdir) -> None:
    (run_id,) = waiting_runs(workdir.store, 1, workdir.path / "wait.yaml")

    bad = invoke(
        "runs", "signal", run_id, "approve", "--payload", "{nope", "--store", workdir.store
    )
    assert bad.exit_code == 2
    assert "--payload is not valid JSON" in bad.stderr


def test_the_same_idempotency_key_attaches_to_the_first_run(workdir: Workdir) -> None:
    args = ["run", "quick.yaml", "--json", "--store", workdir.store, "--idempotency-key", "order-1"]
    first = invoke(*args, "-i", '{"n": 1}')
    second = invoke(*args, "-i", '{"n": 2}')

    assert first.exit_code == 0 and second.exit_code == 0, (first.stderr, second.stderr)
    assert stdout_json(first)["run_id"] == stdout_json(second)["run_id"]
    assert stdout_json(second)["output"] == {"echo": {"n": 1}}
    assert len(stdout_json(invoke("runs", "list", "--json", "--store", workdir.store))["runs"]) == 1


def test_runs_list_filters_and_pages(workdir: Workdir) -> None:
    for n in range(3):
        assert (
            invoke("run", "quick.yaml", "-i", str(n), "--json", "--store", workdir.store).exit_code
            == 0
        )
    (waiting,) = waiting_runs(workdir.store, 1, workdir.path / "wait.yaml")

    def page(*extra: str) -> Any:
        done = invoke("runs", "list", "--json", "--store", workdir.store, *extra)
        assert done.exit_code == 0, done.stderr
        return stdout_json(done)

    everything = page()["runs"]
    assert len(everything) == 4 and everything[0]["run_id"] == waiting  # newest first
    assert [r["run_id"] for r in page("--status", "running")["runs"]] == [waiting]
    assert len(page("--workflow", "quick")["runs"]) == 3
    assert len(page("--since", "1h")["runs"]) == 4
    assert page("--since", "2999-01-01T00:00:00Z")["runs"] == []

    seen = []
    cursor = None
    while True:
        current = page("--limit", "3", *(["--cursor", cursor] if cursor else []))
        seen += [r["run_id"] for r in current["runs"]]
        cursor = current["next_cursor"]
        if cursor is None:
            break
    assert seen == [r["run_id"] for r in everything]

    text = invoke("runs", "list", "--store", workdir.store)
    assert text.exit_code == 0 and waiting in text.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--status", "done"], "is not a run state"),
        (["--since", "yesterday"], "neither a duration"),
        (["--cursor", "!!"], "invalid cursor"),
    ],
)
def test_runs_list_rejects_bad_options(workdir: Workdir, args: list[str], message: str) -> None:
    assert invoke("run", "quick.yaml", "--json", "--store", workdir.store).exit_code == 0

    done = invoke("runs", "list", "--store", workdir.store, *args)
    assert done.exit_code == 2
    assert message in done.stderr


@pytest.mark.parametrize(
    "command",
    [
        ["runs", "show", "nope"],
        ["runs", "history", "nope"],
        ["runs", "cancel", "nope"],
        ["runs", "signal", "nope", "approve"],
        ["runs", "resume", "nope"],
    ],
)
def test_a_run_that_is_not_in_the_store_exits_2(workdir: Workdir, command: list[str]) -> None:
    assert invoke("db", "upgrade", "--store", workdir.store).exit_code == 0

    done = invoke(*command, "--store", workdir.store)
    assert done.exit_code == 2
    assert done.stderr.strip() == f"error: no run 'nope' in {workdir.store}"


def test_the_store_can_come_from_the_environment(workdir: Workdir) -> None:
    env = {"TIDEFLOW_STORE": workdir.store}
    done = invoke("run", "quick.yaml", "--json", env=env)
    assert done.exit_code == 0, done.stderr
    assert workdir.db.is_file()

    listed = invoke("runs", "list", "--json", env=env)
    assert [r["run_id"] for r in stdout_json(listed)["runs"]] == [stdout_json(done)["run_id"]]


def test_run_json_shape_is_unchanged_on_memory_store(workdir: Workdir) -> None:
    done = invoke("run", "quick.yaml", "-i", "[1]", "--json", "--store", "memory://")
    assert done.exit_code == 0, done.stderr
    assert set(json.loads(done.stdout)) == {"run_id", "status", "output", "error", "steps"}
    assert not (workdir.path / ".tideflow").exists()


def test_a_signal_no_wait_of_the_run_takes_is_refused_with_exit_2(workdir: Workdir) -> None:
    (run_id,) = waiting_runs(workdir.store, 1, workdir.path / "wait.yaml")
    before = stdout_json(invoke("runs", "history", run_id, "--json", "--store", workdir.store))

    done = tideflow(workdir.path, "runs", "signal", run_id, "aprove", "--store", workdir.store)

    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"error: run {run_id} (approval 1) does not wait for a signal named 'aprove': "
        "its wait steps take 'approve'"
    )
    after = stdout_json(invoke("runs", "history", run_id, "--json", "--store", workdir.store))
    assert after == before


TWO_WAITS = """
name: twice
version: "1"
steps:
  - {id: ask, type: wait, signal: approve}
  - {id: confirm, type: wait, signal: approve, depends_on: [ask]}
"""


def test_a_signal_sent_again_with_its_signal_id_is_applied_once(workdir: Workdir) -> None:
    flow = workdir.path / "twice.yaml"
    flow.write_text(TWO_WAITS, encoding="utf-8")
    (run_id,) = waiting_runs(workdir.store, 1, flow)

    def signal(signal_id: str, n: int) -> None:
        sent = invoke(
            "runs", "signal", run_id, "approve", "-p", json.dumps({"n": n}),
            "--signal-id", signal_id, "--store", workdir.store,
        )  # fmt: skip
        assert sent.exit_code == 0, sent.stderr

    signal("evt-1", 1)
    signal("evt-1", 2)  # a redelivery: changes nothing
    resumed = invoke("resume", "--json", "--timeout", "0.5", "--store", workdir.store)
    (run,) = stdout_json(resumed)["runs"]
    assert run["steps"]["ask"]["output"] == {"n": 1}
    assert run["steps"]["confirm"]["status"] == "waiting"

    signal("evt-2", 3)
    resumed = invoke("runs", "resume", run_id, "--json", "--store", workdir.store)
    assert resumed.exit_code == 0, resumed.stderr
    assert stdout_json(resumed)["steps"]["confirm"]["output"] == {"n": 3}


def test_an_empty_signal_id_is_refused(workdir: Workdir) -> None:
    (run_id,) = waiting_runs(workdir.store, 1, workdir.path / "wait.yaml")
    sent = invoke("runs", "signal", run_id, "approve", "--signal-id", " ", "--store", workdir.store)
    assert sent.exit_code == 2
    assert "--signal-id cannot be empty" in sent.stderr
