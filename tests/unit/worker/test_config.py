"""Config checking and duration parsing shared by the executors."""

from __future__ import annotations

from datetime import timedelta

import pytest

from tideflow.worker.executors.config import check_config, seconds
from tideflow.worker.executors.errors import InvalidStepConfig

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        (5, 5.0),
        (0.25, 0.25),
        ("30s", 30.0),
        ("500ms", 0.5),
        ("2h", 7200.0),
        ("1d", 86400.0),
        ("PT5M", 300.0),
        ("P1DT1S", 86401.0),
        ("pt1.5s", 1.5),
        ("45", 45.0),
        ("1w", 604800.0),
        ("1h30m", 5400.0),
        (" 30 s ", 30.0),
        ("P2W", 1209600.0),
        (timedelta(minutes=2), 120.0),
    ],
)
def test_seconds(value: object, expected: float | None) -> None:
    assert seconds(value) == expected


@pytest.mark.parametrize(
    "value",
    ["P", "PT", "soon", "5 minutes", 0, -1, True, "P1DT", "P1M", "inf", float("inf"), [5]],
)
def test_invalid_durations(value: object) -> None:
    with pytest.raises(InvalidStepConfig, match="'timeout' must be a positive"):
        seconds(value)


def test_check_config() -> None:
    assert check_config("x", SCHEMA, {"n": 1}) == {"n": 1}
    with pytest.raises(InvalidStepConfig) as caught:
        check_config("x", SCHEMA, {"n": "one"})
    assert (
        caught.value.message == "invalid config for executor 'x': n: 'one' is not of type 'integer'"
    )
    with pytest.raises(InvalidStepConfig, match="'n' is a required property"):
        check_config("x", SCHEMA, None)


def test_a_config_object_that_comes_again_is_not_encoded_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A constant config is the plan's own object on every attempt: once it is known to be
    valid, its identity is enough (no JSON encoding and digest per attempt)."""
    from tideflow.worker.executors import config as module

    encoded: list[object] = []
    key = module._key
    monkeypatch.setattr(module, "_key", lambda schema, cfg: encoded.append(cfg) or key(schema, cfg))
    constant = {"n": 7}
    for _ in range(5):
        assert check_config("x", SCHEMA, constant) is constant
    assert len(encoded) == 2  # validated, then seen again as valid: from then on, by identity
    equal = {"n": 7}
    assert check_config("x", SCHEMA, equal) is equal  # another object: by its digest
    assert len(encoded) == 3
    with pytest.raises(InvalidStepConfig):
        check_config("y", {"type": "object", "required": ["m"]}, constant)  # another schema
