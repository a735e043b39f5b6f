"""``schedule:``: checked with file:line:column, normalised, compiled into ``Plan.schedules``."""

from __future__ import annotations

import textwrap
from typing import Any

import pytest

from tideflow.dsl import compile_definition, validate
from tideflow.errors import Diagnostic
from tideflow.model.schedules import Catchup, Overlap, ScheduleSpec

STEPS = "steps:\n  - {id: a, type: noop}\n"


def errors(schedule: str) -> list[Diagnostic]:
    """Errors of a definition whose ``schedule:`` starts on line 3."""
    text = 'name: flow\nversion: "1"\n' + textwrap.dedent(schedule) + STEPS
    return [d for d in validate(text, file="flow.yaml") if d.severity == "error"]


def one(found: list[Diagnostic]) -> Diagnostic:
    assert len(found) == 1, "\n".join(d.format() for d in found)
    return found[0]


def test_a_bad_cron_expression_is_an_error_at_its_position() -> None:
    error = one(errors('schedule:\n  cron: "0 25 * * 1-5"\n'))
    assert (error.file, error.line, error.column) == ("flow.yaml", 4, 9)
    assert "invalid cron expression '0 25 * * 1-5'" in error.message
    assert error.hint is not None and "minute hour" in error.hint


@pytest.mark.parametrize("cron", ["* * *", "0 6 * * 1-5 0 0 0", "0 6 * * mon-xyz", "every day"])
def test_cron_expressions_croniter_refuses_are_errors(cron: str) -> None:
    assert "invalid cron expression" in one(errors(f'schedule: {{cron: "{cron}"}}\n')).message


def test_an_unknown_time_zone_is_an_error_with_a_suggestion() -> None:
    error = one(errors("schedule:\n  cron: 0 6 * * *\n  timezone: Europe/Pari\n"))
    assert (error.line, error.column) == (5, 13)
    assert error.message == "unknown time zone 'Europe/Pari'"
    assert error.hint is not None and "did you mean 'Europe/Paris'?" in error.hint


@pytest.mark.parametrize(
    ("schedule", "line", "message"),
    [
        ("schedule: {every: 15m, cron: '* * * * *'}\n", 3, "exactly one of cron or every"),
        ("schedule: {timezone: UTC}\n", 3, "neither cron nor every"),
        ("schedule: {every: 0s}\n", 3, "every must be greater than zero"),
        ("schedule: {every: 1h, overlap: queue}\n", 3, "invalid overlap 'queue'"),
        ("schedule: {every: 1h, catchup: some}\n", 3, "invalid catchup 'some'"),
        ("schedule: {every: 1h, jitter: soon}\n", 3, "jitter is not a valid duration"),
        ("schedule: {every: 1h, start_at: tomorrow}\n", 3, "start_at must be an ISO 8601"),
        ("schedule: {every: 1h, input: {scheduled_at: x}}\n", 3, "scheduled_at is set by"),
        ("schedule: {every: 1h, evry: 2}\n", 3, "unknown key 'evry' in a schedule"),
        ("schedule:\n  - {id: a, every: 1h}\n  - {every: 2h}\n", 5, "each of several schedules"),
        ("schedule:\n  - {id: a, every: 1h}\n  - {id: a, every: 2h}\n", 5, "duplicate schedule"),
        ("schedule: {id: Daily, every: 1h}\n", 3, "invalid schedule id 'Daily'"),
        ("schedule: []\n", 3, "non-empty list"),
        (
            "schedule: {every: 1h, start_at: '2027-01-02', end_at: '2027-01-01'}\n",
            3,
            "end_at must be after start_at",
        ),
    ],
)
def test_schedule_mistakes_are_errors_at_their_line(schedule: str, line: int, message: str) -> None:
    error = one(errors(schedule))
    assert message in error.message and error.line == line and error.file == "flow.yaml"


def compiled(schedule: Any) -> tuple[ScheduleSpec, ...]:
    return compile_definition(
        {"name": "f", "version": "1", "schedule": schedule, "steps": [{"id": "a", "type": "noop"}]}
    ).schedules


def test_one_schedule_has_the_id_default_and_the_documented_defaults() -> None:
    assert compiled({"cron": "0  6 * * 1-5"}) == (
        ScheduleSpec(
            id="default",
            cron="0 6 * * 1-5",
            timezone="UTC",
            overlap=Overlap.SKIP,
            catchup=Catchup.LATEST,
            jitter=0.0,
        ),
    )


def test_several_schedules_compile_with_durations_and_times_in_seconds() -> None:
    morning, sweep = compiled(
        [
            {"id": "morning", "cron": "0 6 * * 1-5", "timezone": "Europe/Paris"},
            {
                "id": "sweep",
                "every": "15m",
                "jitter": "30s",
                "start_at": "2027-01-01T00:00:00+01:00",
                "end_at": "2027-02-01T00:00:00Z",
                "input": {"full": False},
                "overlap": "buffer_one",
                "catchup": "all",
            },
        ]
    )
    assert morning.timezone == "Europe/Paris"
    assert (sweep.every, sweep.jitter) == (900.0, 30.0)
    assert sweep.start_at == 1_798_758_000.0 and sweep.end_at == 1_801_440_000.0
    assert sweep.input == {"full": False}
    assert (sweep.overlap, sweep.catchup) == (Overlap.BUFFER_ONE, Catchup.ALL)


def test_the_normal_form_compiles_to_the_same_plan() -> None:
    source = {
        "name": "f",
        "version": "1",
        "schedule": {"every": "1h", "start_at": "2027-01-01T00:00:00Z", "jitter": "1m"},
        "steps": [{"id": "a", "type": "noop"}],
    }
    plan = compile_definition(source)
    again = compile_definition(dict(plan.source))
    assert again.hash == plan.hash and again.schedules == plan.schedules
