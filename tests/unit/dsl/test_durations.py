from datetime import timedelta

import pytest

from tideflow.dsl import parse_duration
from tideflow.model.durations import MAX_DURATION, DurationTooLong


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("500ms", 0.5),
        ("30s", 30.0),
        ("5m", 300.0),
        ("2h", 7200.0),
        ("3d", 259200.0),
        ("1w", 604800.0),
        ("1h30m", 5400.0),
        ("1.5s", 1.5),
        (" 10s ", 10.0),
        ("PT5M", 300.0),
        ("P1DT2H", 93600.0),
        ("PT0.5S", 0.5),
        ("pt1h", 3600.0),
        ("P2W", 1209600.0),
        ("P1D", 86400.0),
        ("45", 45.0),
        ("2.5", 2.5),
    ],
)
def test_parses_units_and_iso_8601(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(("value", "seconds"), [(30, 30.0), (0.25, 0.25), (0, 0.0), (-5, -5.0)])
def test_bare_numbers_are_seconds(value: float, seconds: float) -> None:
    result = parse_duration(value)
    assert result == seconds
    assert isinstance(result, float)


def test_timedelta_is_accepted() -> None:
    assert parse_duration(timedelta(minutes=2)) == 120.0


@pytest.mark.parametrize(
    "value",
    ["", "5 minutes", "5x", "m5", "P", "PT", "P1Y", "P1M", "1m1h", "5s5s", "abc", "nan", "inf"],
)
def test_rejects_what_is_not_a_duration(value: str) -> None:
    with pytest.raises(ValueError, match="invalid duration") as info:
        parse_duration(value)
    assert "30s" in str(info.value)  # the message says what is accepted


@pytest.mark.parametrize("value", [True, None, [1], {"s": 1}, float("inf")])
def test_rejects_other_types(value: object) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(value)


def test_the_dsl_reexports_the_model_parser() -> None:
    from tideflow.dsl import durations
    from tideflow.model import durations as model_durations

    assert durations.parse_duration is model_durations.parse_duration
    assert durations.DURATION_HINT is model_durations.DURATION_HINT


@pytest.mark.parametrize("value", [1e300, -1e300, 2**62, "99999999999999999999d", "P9999999999W"])
def test_a_duration_longer_than_100_years_is_refused_saying_so(value: object) -> None:
    with pytest.raises(DurationTooLong, match="longer than 100 years"):
        parse_duration(value)
    assert parse_duration(MAX_DURATION) == MAX_DURATION
