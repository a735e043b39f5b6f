"""The one "can a run hold this value" check (model/storable)."""

from __future__ import annotations

import math
from typing import Any

import orjson
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


@pytest.mark.parametrize(
    ("text", "path"),
    [
        (b"1180591620717411303424", ()),
        (b'{"a": [1, {"n": -1180591620717411303424}]}', ("a", 1, "n")),
        (b'[18446744073709551616, "x"]', (0,)),  # 2**64: the first one past the range
        (b'{"m": -9223372036854775809}', ("m",)),  # -2**63 - 1
    ],
)
def test_json_is_read_with_integers_exact_and_the_one_out_of_range_is_found(
    text: bytes, path: tuple[str | int, ...]
) -> None:
    value = storable.loads(text)
    found = storable.integer_problem(value)
    assert found is not None and found[0] == path
    assert "out of range" in found[1] and "-2**63 .. 2**64-1" in found[1]
    with pytest.raises(OutputNotSerializable) as caught:
        storable.check(value, "the run input")
    named = f"{storable.format_path(path)}: the integer" if path else ": the integer"
    assert named in caught.value.message


@pytest.mark.parametrize(
    "text",
    [b"9223372036854775808", b"-9223372036854775808", b"18446744073709551615", b"[1e30, 0.5]"],
)
def test_integers_in_range_and_real_floats_read_as_orjson_reads_them(text: bytes) -> None:
    value = storable.loads(text)
    assert value == storable.loads(text.decode()) and storable.integer_problem(value) is None
    assert type(value) is type(orjson.loads(text)) and value == orjson.loads(text)


def test_a_value_nested_too_deeply_says_so() -> None:
    value: object = 1
    for _ in range(300):
        value = [value]
    with pytest.raises(OutputNotSerializable, match="nested more than 254 levels deep"):
        storable.check(value, "event 'e1'")
