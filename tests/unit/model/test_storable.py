"""The one "can a run hold this value" check (model/storable)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from tideflow.errors import OutputNotSerializable, OutputTooLarge
from tideflow.model import storable


@pytest.mark.parametrize(
    "value",
    [None, True, "text", 0, -(2**63), 2**64 - 1, 1.5, [], {}, {"a": [1, {"b": None}]}],
)
def test_json_values_are_storable(value: Any) -> None:
    assert storable.check(value, "v") == len(storable.encode(value, "v"))


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (2**64, "64-bit"),
        (-(2**63) - 1, "64-bit"),
        ({"n": 10**30}, "pass larger ones as strings"),
        (float("nan"), "nan is not a number JSON can hold"),
        ({"deep": [1, {"x": math.inf}]}, "inf is not a number"),
        ([None, -math.inf], "-inf"),
        ({1: "a"}, "keys must be strings"),
        ({"o": object()}, "object"),
    ],
)
def test_values_no_store_can_hold_are_refused(value: Any, words: str) -> None:
    with pytest.raises(OutputNotSerializable) as caught:
        storable.check(value, "the output of step 'a'")
    assert caught.value.message.startswith("the output of step 'a' cannot be stored as JSON")
    assert words in caught.value.message
    assert not caught.value.retryable


def test_null_alone_is_fine_and_nan_beside_it_is_not() -> None:
    storable.check({"a": None, "b": [None]}, "v")
    with pytest.raises(OutputNotSerializable):
        storable.check({"a": None, "b": float("nan")}, "v")


def test_a_limit_is_checked_on_the_json_size() -> None:
    assert storable.check("x" * 98, "v", limit=100) == 100
    with pytest.raises(OutputTooLarge) as caught:
        storable.check("x" * 99, "the run input", limit=100)
    assert caught.value.message.startswith("the run input is 101 bytes as JSON")
    assert "over the limit of 100 bytes" in caught.value.message
    assert "docs/operations.md" in caught.value.message


def test_sizes_read_well() -> None:
    assert storable.describe_size(storable.MAX_STEP_OUTPUT) == "1.0 MiB"
    assert storable.describe_size(storable.MAX_RUN_INPUT) == "16.0 MiB"
    assert storable.describe_size(1536) == "1.5 KiB"
