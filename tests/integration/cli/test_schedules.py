"""`tideflow schedules list|pause|resume|trigger|delete` on a SQLite file."""

from __future__ import annotations

import textwrap

from .conftest import Workdir, invoke, stdout_json

REPORT = textwrap.dedent(
    """\
    name: report
    version: "1"
    schedule:
      - {id: morning, cron: "0 6 * * 1-5", timezone: Europe/Paris, input: {fmt: pdf}}
      - {id: often, every: 15m, overlap: allow}
    steps:
      - {id: a, type: noop}
    """
)


def listed(workdir: Workdir) -> dict[str, dict[str, object]]:
    done = invoke("schedules", "list", "--json", "--store", workdir.store)
    assert done.exit_code == 0, done.stderr
    return {row["id"]: row for row in stdout_json(done)["schedules"]}


def test_list_pause_resume_trigger_delete(workdir: Workdir) -> None:
    (workdir.path / "report.yaml").write_text(REPORT, encoding="utf-8")
    done = invoke("definitions", "register", "report.yaml", "--store", workdir.store)
    assert done.exit_code == 0, done.stderr

    rows = listed(workdir)
    assert set(rows) == {"morning", "often"}
    assert str(rows["morning"]["next_fire_at"]).endswith(":00Z")
    table = invoke("schedules", "list", "--store", workdir.store)
    assert "cron 0 6 * * 1-5 (Europe/Paris)" in table.stdout and "every 900s" in table.stdout

    paused = invoke("schedules", "pause", "report", "often", "--store", workdir.store)
    assert paused.stdout.strip() == "report often: paused"
    again = invoke("schedules", "pause", "report", "often", "--store", workdir.store)
    assert again.stdout.strip() == "report often: paused (it was already)"
    assert listed(workdir)["often"]["paused"] is True
    assert listed(workdir)["often"]["next_fire_at"] is None
    resumed = invoke("schedules", "resume", "report", "often", "--store", workdir.store)
    assert resumed.stdout.strip() == "report often: resumed"

    triggered = invoke("schedules", "trigger", "report", "morning", "--store", workdir.store)
    assert triggered.exit_code == 0, triggered.stderr
    run_id = triggered.stdout.strip()
    shown = stdout_json(invoke("runs", "list", "--json", "--store", workdir.store))
    assert [r["run_id"] for r in shown["runs"]] == [run_id]
    assert listed(workdir)["morning"]["last_run_id"] == run_id

    deleted = invoke("schedules", "delete", "report", "often", "--store", workdir.store)
    assert deleted.stdout.strip() == "report often: deleted"
    assert set(listed(workdir)) == {"morning"}

    created = invoke(
        "schedules", "create", "report", '{"id": "eod", "cron": "0 18 * * 1-5"}',
        "--store", workdir.store,
    )  # fmt: skip
    assert created.exit_code == 0, created.stderr
    assert created.stdout.startswith("report eod: created, next fire 20")
    assert set(listed(workdir)) == {"morning", "eod"}
    bad = invoke(
        "schedules", "create", "report", '{"id": "x", "every": "0s"}', "--store", workdir.store
    )
    assert bad.exit_code == 2 and "every must be greater than zero" in bad.stderr

    missing = invoke("schedules", "pause", "report", "often", "--store", workdir.store)
    assert missing.exit_code == 2
    assert (
        "no schedule 'often' of workflow 'report' (its schedules: eod, morning)" in missing.stderr
    )
